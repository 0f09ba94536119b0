/* crash_writer.h: the in-memory ring's write-out, async-signal-safe: it runs for every
 * trigger, inside the fatal-signal handlers too (docs/ring.md). */
#ifndef FI_CRASH_WRITER_H
#define FI_CRASH_WRITER_H

#include "ring_memory.h"

/* Writes every READY slot of r, in call order, as a dump directory under r->root, and a
 * trigger record (trigger; signame when a signal fired it, else NULL) in session.jsonl.
 * Uses only async-signal-safe calls and memory prepared at call time. Returns the number
 * of calls written, -1 (errno set) when the root cannot be made. */
int fi_crash_write_ring(fi_ring *r, const char *trigger, const char *signame);

#endif
