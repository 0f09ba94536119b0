/* ring_signals.c: the fatal-signal and SIGUSR1 handlers of the in-memory ring: they write
 * it out (crash_writer.c), then hand the signal on as if they were not there. */
#include "ring_signals.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crash_writer.h"
#include "fork_watch.h"

static const int handled_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGUSR1};
static const char *const signal_names[] = {"SIGSEGV", "SIGBUS",  "SIGFPE",
                                           "SIGILL",  "SIGABRT", "SIGUSR1"};
#define N_HANDLED (sizeof handled_signals / sizeof handled_signals[0])

static struct sigaction previous[N_HANDLED];
static fi_ring *_Atomic signal_ring;

/* Hands the signal on as if we were not there: the previous handler, or the default
 * action (re-raised; it is delivered when our handler returns, so core dumps and exit
 * statuses are what they would have been). SIGUSR1's default would end the process:
 * the recorder owns it then, and the process goes on. */
static void chain(size_t i, int sig, siginfo_t *info, void *uctx)
{
    const struct sigaction *old = &previous[i];
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction)
            old->sa_sigaction(sig, info, uctx);
        return;
    }
    if (old->sa_handler == SIG_IGN || (old->sa_handler == SIG_DFL && sig == SIGUSR1))
        return;
    if (old->sa_handler == SIG_DFL) {
        sigaction(sig, old, NULL);
        raise(sig);
        return;
    }
    old->sa_handler(sig);
}

#define TEXT_OF_(x) #x
#define TEXT_OF(x) TEXT_OF_(x)

static void write_stderr(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(STDERR_FILENO, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        p += k;
        n -= (size_t)k;
    }
}

/* "[flashinfer] flight recorder: signal S: K calls written to ROOT; L calls lost: E" (and
 * what became of the trigger record) on stderr, when a write-out lost calls or its record:
 * the handler has no other way to say so. One write(2) when the line fits 1024 bytes, else
 * one per part. */
static void say_lost(const fi_ring *r, const char *signame, const fi_ring_result *res)
{
    char k[24], l[24], m[24];
    int lost = res->lost > 0, shortened = res->record == FI_RECORD_SHORT;
    int unwritten = res->record == FI_RECORD_LOST;
    const char *parts[] = {
        "[flashinfer] flight recorder: signal ",
        signame,
        ": ",
        fi_crash_decimal(k, (unsigned long long)res->written),
        " calls written to ",
        r->root,
        lost ? "; " : "",
        lost ? fi_crash_decimal(l, (unsigned long long)res->lost) : "",
        lost ? " calls lost: " : "",
        lost ? fi_crash_errno_text(res->error) : "",
        shortened ? "; its record in session.jsonl leaves out the triggering call's keys (" : "",
        shortened ? fi_crash_decimal(m, (unsigned long long)res->keys_left_out) : "",
        shortened ? " bytes: the record would pass " TEXT_OF(FI_TRIGGER_RECORD_MAX) " bytes)" : "",
        unwritten ? "; its record could not be written to session.jsonl: " : "",
        unwritten ? fi_crash_errno_text(res->record_error) : "",
        "\n",
    };
    size_t n_parts = sizeof parts / sizeof parts[0];
    char line[1024];
    size_t len = 0;
    for (size_t i = 0; i < n_parts; i++) {
        size_t n = strlen(parts[i]);
        if (len + n >= sizeof line) {
            for (size_t j = 0; j < n_parts; j++)
                write_stderr(parts[j], strlen(parts[j]));
            return;
        }
        memcpy(line + len, parts[i], n);
        len += n;
    }
    write_stderr(line, len);
}

/* "[flashinfer] flight recorder: signal S: cannot write ROOT: E" on stderr. */
static void say_cannot_write(const fi_ring *r, const char *signame, int err)
{
    const char *parts[] = {"[flashinfer] flight recorder: signal ",
                           signame,
                           ": cannot write ",
                           r->root,
                           ": ",
                           fi_crash_errno_text(err),
                           "\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        write_stderr(parts[i], strlen(parts[i]));
}

/* Writes r for the signal: one write-out at a time, so this waits for one on another
 * thread (it then writes only what that one did not), unless that one is freeing the calls
 * it wrote; a write-out on this very thread (the signal interrupted it) goes on after the
 * handler and covers this signal. */
static void write_for_signal(fi_ring *r, const char *signame)
{
    if (r->fork_epoch != fi_fork_epoch())
        return; /* the parent's ring, in a child that has recorded nothing yet */
    int held;
    while ((held = fi_ring_writer_try(r)) == 0) {
        /* the other writer frees what it wrote: this thread may hold the malloc lock its
         * free() waits for, so waiting could hang both; the ring is on disk already */
        if (atomic_load(&r->freeing))
            return;
        sched_yield();
    }
    if (held < 0)
        return;
    if (atomic_load(&r->fired) < r->max_triggers) {
        atomic_fetch_add(&r->fired, 1);
        fi_ring_result res;
        long long first = fi_crash_newest_of_thread(r, fi_crash_tid());
        if (fi_crash_write_ring(r, "signal", signame, first, &res) < 0)
            say_cannot_write(r, signame, errno);
        else if (res.lost || res.record != FI_RECORD_WHOLE)
            say_lost(r, signame, &res);
        atomic_store(&r->restart_pending, 1); /* freeing memory waits for normal context */
    }
    fi_ring_writer_release(r);
}

static void on_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved_errno = errno;
    size_t i = 0;
    while (i < N_HANDLED - 1 && handled_signals[i] != sig)
        i++;
    fi_ring *r = atomic_load(&signal_ring);
    if (r)
        write_for_signal(r, signal_names[i]);
    errno = saved_errno;
    chain(i, sig, info, uctx);
}

/* A stack overflow delivers SIGSEGV on the exhausted stack, where the handler has no room
 * to run: the thread that installs the handlers (the one that made the ring, usually the
 * main thread) gets an alternate signal stack, unless it has one already (faulthandler's,
 * say). The memory stays for the life of the process, as the handlers do. */
static int ensure_alt_stack(void)
{
    stack_t old;
    if (sigaltstack(NULL, &old) == 0 && !(old.ss_flags & SS_DISABLE))
        return 0;
    size_t size = 256 * 1024; /* the ring's write-out needs little; chained handlers more */
    stack_t ss = {.ss_sp = malloc(size), .ss_size = size, .ss_flags = 0};
    if (!ss.ss_sp)
        return -1;
    if (sigaltstack(&ss, NULL) < 0) {
        free(ss.ss_sp);
        return -1;
    }
    return 0;
}

int fi_ring_install_signals(fi_ring *r)
{
    static int installed;
    atomic_store(&signal_ring, r);
    if (installed)
        return 0;
    if (ensure_alt_stack() < 0)
        return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_HANDLED; i++)
        if (sigaction(handled_signals[i], &sa, &previous[i]) < 0)
            return -1;
    installed = 1;
    return 0;
}

/* A freed ring is no longer the handlers' ring. */
void fi_ring_uninstall_signals(fi_ring *r)
{
    fi_ring *expected = r;
    atomic_compare_exchange_strong(&signal_ring, &expected, NULL);
}
