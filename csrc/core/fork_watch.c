/* fork_watch.c: counts forks in the child (pthread_atfork), for the recorder's rings: a child
 * starts rings of its own and never touches the parent's directories or calls. */
#include "fork_watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

static atomic_ulong epoch;
static atomic_int watching;

/* Runs in the child, right after fork: only async-signal-safe work is allowed there. */
static void in_child(void) { atomic_fetch_add(&epoch, 1); }

int fi_fork_watch(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&watching, &expected, 1))
        return 0;
    int err = pthread_atfork(NULL, NULL, in_child);
    if (err) {
        atomic_store(&watching, 0);
        errno = err;
        return -1;
    }
    return 0;
}

unsigned long fi_fork_epoch(void) { return atomic_load(&epoch); }

/* The epoch + 1 a cached id was read in (0: none). */
static unsigned long read_in(void) { return atomic_load(&watching) ? atomic_load(&epoch) + 1 : 0; }

long fi_fork_pid(void)
{
    static atomic_long pid;
    static atomic_ulong pid_read_in;
    unsigned long now = read_in();
    if (now == 0 || atomic_load(&pid_read_in) != now) {
        atomic_store(&pid, (long)getpid());
        atomic_store(&pid_read_in, now);
    }
    return atomic_load(&pid);
}

long fi_fork_tid(void)
{
    static _Thread_local long tid;
    static _Thread_local unsigned long tid_read_in;
    unsigned long now = read_in();
    if (now == 0 || tid_read_in != now) {
        tid = (long)syscall(SYS_gettid);
        tid_read_in = now;
    }
    return tid;
}
