/* fork_watch.h: how many times this process has been the child of a fork (pthread_atfork),
 * so that state made before a fork can tell that it is the parent's (docs/ring.md). */
#ifndef FI_FORK_WATCH_H
#define FI_FORK_WATCH_H

/* Starts counting (once per process; later calls do nothing). 0, or -1 (errno set). */
int fi_fork_watch(void);

/* The count now; async-signal-safe. */
unsigned long fi_fork_epoch(void);

/* getpid() and the calling thread's gettid(), each a system call, read once per process
 * (per thread) and again after a fork while the count runs; before it runs, every time. */
long fi_fork_pid(void);
long fi_fork_tid(void);

#endif
