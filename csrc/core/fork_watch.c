/* fork_watch.c: counts forks in the child (pthread_atfork), for the recorder's rings: a child
 * starts rings of its own and never touches the parent's directories or calls. */
#include "fork_watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

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
