/* crash_writer.h: the in-memory ring's write-out, async-signal-safe: it runs for every
 * trigger, inside the fatal-signal handlers too (docs/ring.md). */
#ifndef FI_CRASH_WRITER_H
#define FI_CRASH_WRITER_H

#include "ring_memory.h"

/* The test hook of fi_ring_hold_writeouts: writes what to its note descriptor and waits for
 * a byte on its hold descriptor (when set). */
void fi_ring_test_hold(const fi_ring *r, char what);

/* The calling thread's id (gettid). */
long fi_crash_tid(void);

/* Takes r for a write-out: 1 taken; 0 another thread holds it; -1 this thread does (a
 * signal handler interrupted its write-out). fi_ring_writer_release gives it back. */
int fi_ring_writer_try(fi_ring *r);
void fi_ring_writer_release(fi_ring *r);

/* With r taken: writes what is missing on disk of each READY call, the call of generation
 * first (0: none) first, then the others newest first, each as a dump directory under
 * r->root that appears only once whole; then a trigger record (trigger; signame when a
 * signal fired it, else NULL) with the counts of res in session.jsonl. Uses only
 * async-signal-safe calls and memory prepared at call time. 0, or -1 (errno set) when the
 * root cannot be made. */
int fi_crash_write_ring(fi_ring *r, const char *trigger, const char *signame, long long first,
                        fi_ring_result *res);

/* The generation of the newest READY call thread tid made, 0 when none. */
long long fi_crash_newest_of_thread(fi_ring *r, long tid);

/* What a write-out's errno means, as strerror words it (async-signal-safe). */
const char *fi_crash_errno_text(int e);

/* Decimal text of v, written at the end of buf; returns its start (async-signal-safe). */
char *fi_crash_decimal(char buf[24], unsigned long long v);

#endif
