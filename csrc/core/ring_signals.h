/* ring_signals.h: the fatal-signal and SIGUSR1 handlers that write the in-memory ring
 * (FLASHINFER_DUMP_ON=signal), then hand the signal on (docs/ring.md). */
#ifndef FI_RING_SIGNALS_H
#define FI_RING_SIGNALS_H

#include "ring_memory.h"

/* Installs the handlers for r (the newest ring wins). -1 (errno set) on failure. */
int fi_ring_install_signals(fi_ring *r);

/* r is being freed: the handlers no longer write it. */
void fi_ring_uninstall_signals(fi_ring *r);

#endif
