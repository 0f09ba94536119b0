/* call.h: one decorated call on its way from wrapper_invoke down through the log text and
 * the recorder: what every stage needs to know about this call, instead of process globals. */
#ifndef FI_CALL_H
#define FI_CALL_H

#include <time.h>

#include "pages.h"
#include "stats.h"

typedef struct {
    const char *api_name; /* "Cls.method" or "func" */
    int level;            /* the log level in force (0, 1, 3, 5, 10) */
    fi_tensor_seen seen;  /* its tensors' metadata, read once (emptied when the call ran) */
    fi_stats_memo stats;  /* statistics taken of this call's tensors so far */
    fi_paged paged;       /* the pages its paged tensors are read at (pages.h), if known */
    double took_us;       /* recorded calls: the wrapped function's host time, microseconds */
} fi_call;

/* Seconds of CLOCK_MONOTONIC, for the host time of a recorded call (duration_us). */
static inline double fi_call_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A call at level with no statistics taken yet; fi_call_end releases what it kept. */
static inline void fi_call_begin(fi_call *call, const char *api_name, int level)
{
    call->api_name = api_name;
    call->level = level;
    call->paged.item = NULL;
    call->paged.n = 0;
    call->took_us = 0;
    fi_tensor_seen_init(&call->seen);
    fi_stats_memo_init(&call->stats);
    call->stats.paged = &call->paged;
    call->stats.seen = &call->seen;
}

/* The wrapped function ran: it may have changed the tensors it was given, so their
 * metadata is read again (the statistics memo checks data pointer and version itself). */
static inline void fi_call_returned(fi_call *call) { fi_tensor_seen_clear(&call->seen); }

static inline void fi_call_end(fi_call *call)
{
    fi_stats_memo_clear(&call->stats);
    fi_tensor_seen_clear(&call->seen);
    fi_paged_free(&call->paged);
}

#endif
