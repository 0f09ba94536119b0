/* ring_memory.c: the in-memory ring's slots, each holding one call's complete files: claimed
 * by a new call, published when its records are written, evicted oldest first. */
#include "ring_memory.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crash_writer.h"
#include "ring_signals.h"

fi_ring *fi_ring_new(long long n, const char *root, double budget_gb, long long max_triggers,
                     const char *ext, int compact)
{
    fi_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->n = n;
    r->root = strdup(root);
    r->ext = strdup(ext);
    r->slots = calloc((size_t)n, sizeof(fi_ring_slot));
    double budget = budget_gb * 1024.0 * 1024.0 * 1024.0;
    r->budget = budget >= (double)SIZE_MAX ? SIZE_MAX : (size_t)budget;
    r->max_triggers = max_triggers;
    if (compact)
        r->store = fi_chunk_store_new(1);
    if (!r->root || !r->ext || !r->slots || (compact && !r->store)) {
        fi_ring_free(r);
        return NULL;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(r->pack_prefix, sizeof r->pack_prefix, "ring-%ld-%lld%09ld-", (long)getpid(),
             (long long)now.tv_sec, (long)now.tv_nsec);
    for (long long i = 0; i < n; i++) /* slots never move: their inline buffers stay put */
        fi_ring_files_init(&r->slots[i].files);
    return r;
}

void fi_ring_manifest_clear(fi_ring_manifest *m)
{
    fi_compact_tensors_free(m->store, m->t, m->n);
    m->t = NULL;
    m->n = 0;
    fi_buf_free(&m->tail);
}

void fi_ring_files_free(fi_ring_files *f)
{
    fi_image_free(&f->inputs);
    fi_image_free(&f->outputs);
    fi_ring_manifest_clear(&f->cin);
    fi_ring_manifest_clear(&f->cout);
    fi_buf_free(&f->meta);
    fi_buf_free(&f->trigger_keys);
}

/* What a call's own buffers hold; its chunks count in the store. */
static size_t files_bytes(const fi_ring_files *f)
{
    return f->inputs.cap + f->outputs.cap + f->meta.cap + f->trigger_keys.cap + f->cin.tail.cap +
           f->cout.tail.cap + (f->cin.n + f->cout.n) * sizeof(fi_compact_tensor);
}

/* The budget's measure: the buffers and, once each, the chunks. */
static size_t held(const fi_ring *r)
{
    return r->used + (r->store ? fi_chunk_store_bytes(r->store) : 0);
}

/* Marks s BUSY, then waits out a writer on another thread that may be reading it. */
static void slot_take(fi_ring *r, fi_ring_slot *s)
{
    atomic_store(&s->state, FI_SLOT_BUSY);
    while (atomic_load(&r->flushing))
        sched_yield();
}

/* Drops the oldest call; keep_buffers leaves its buffers for reuse by the next call. */
static void evict_oldest(fi_ring *r, int keep_buffers)
{
    fi_ring_slot *s = &r->slots[r->head];
    slot_take(r, s);
    free(s->dir);
    s->dir = NULL;
    if (!keep_buffers) {
        fi_ring_files_free(&s->files);
        r->used -= s->bytes;
        s->bytes = 0;
    }
    s->generation = 0;
    atomic_store(&s->state, FI_SLOT_EMPTY);
    r->head = (r->head + 1) % r->n;
    r->count--;
}

/* Empties the ring and frees its buffers (after a trigger, in normal context). */
static void reset(fi_ring *r)
{
    while (r->count > 0)
        evict_oldest(r, 0);
    for (long long i = 0; i < r->n; i++) {
        r->used -= r->slots[i].bytes;
        r->slots[i].bytes = 0;
        fi_ring_files_free(&r->slots[i].files);
    }
    atomic_store(&r->restart_pending, 0);
}

int fi_ring_recording(fi_ring *r)
{
    if (atomic_load(&r->restart_pending))
        reset(r);
    if (atomic_load(&r->fired) < r->max_triggers)
        return 1;
    if (r->count > 0 || r->used > 0)
        reset(r); /* done for good: give the memory back */
    return 0;
}

/* Moves src's contents to dst (whose own buffers are already released); src is left empty.
 * A short buffer lives in its struct's inline array, so it is copied, not pointed at. */
static void buf_move(fi_buf *dst, fi_buf *src)
{
    if (src->data == src->inline_data) {
        fi_buf_init(dst);
        memcpy(dst->inline_data, src->inline_data, src->len + 1);
        dst->len = src->len;
        dst->oom = src->oom;
    } else {
        *dst = *src;
    }
    fi_buf_init(src);
}

static void manifest_move(fi_ring_manifest *dst, fi_ring_manifest *src)
{
    dst->store = src->store;
    dst->t = src->t;
    dst->n = src->n;
    src->t = NULL;
    src->n = 0;
    buf_move(&dst->tail, &src->tail);
}

static void files_move(fi_ring_files *dst, fi_ring_files *src)
{
    dst->inputs = src->inputs;
    dst->outputs = src->outputs;
    src->inputs = src->outputs = (fi_image){0};
    manifest_move(&dst->cin, &src->cin);
    manifest_move(&dst->cout, &src->cout);
    buf_move(&dst->meta, &src->meta);
    buf_move(&dst->trigger_keys, &src->trigger_keys);
}

void fi_ring_files_init(fi_ring_files *f)
{
    f->inputs = f->outputs = (fi_image){0};
    f->cin = f->cout = (fi_ring_manifest){0};
    fi_buf_init(&f->cin.tail);
    fi_buf_init(&f->cout.tail);
    fi_buf_init(&f->meta);
    fi_buf_init(&f->trigger_keys);
}

int fi_ring_claim(fi_ring *r, const char *dir, size_t bytes, fi_ring_ticket *t, fi_ring_files *out)
{
    char *copy = strdup(dir);
    if (!copy)
        return -1;
    if (r->count == r->n)
        evict_oldest(r, 1);
    long long index = (r->head + r->count) % r->n; /* unchanged by evictions */
    fi_ring_slot *s = &r->slots[index];
    /* a reused slot's buffers stay (and stay counted) until the call's files replace them;
     * a compact call's new bytes are known only once its chunks are taken (fi_ring_done) */
    size_t retained = s->bytes, need = r->store ? 0 : bytes;
    while (r->count > 0 && held(r) - retained + need > r->budget)
        evict_oldest(r, 0);
    int too_big = (r->store ? 0 : held(r) - retained) + bytes > r->budget;
    slot_take(r, s);
    fi_ring_files_free(out);
    files_move(out, &s->files); /* the call writes its own copy: see fi_ring_open */
    if (too_big) {
        fi_ring_files_free(out);
        r->used -= s->bytes;
        s->bytes = 0;
    }
    out->inputs.len = out->outputs.len = 0;
    fi_ring_manifest *m[2] = {&out->cin, &out->cout};
    for (int i = 0; i < 2; i++) { /* the evicted call's chunks go; its buffers stay for reuse */
        fi_compact_tensors_free(m[i]->store, m[i]->t, m[i]->n);
        m[i]->t = NULL;
        m[i]->n = 0;
        m[i]->store = r->store;
        fi_buf_reset(&m[i]->tail);
    }
    fi_buf_reset(&out->meta);
    fi_buf_reset(&out->trigger_keys);
    s->dir = copy;
    s->generation = ++r->generation;
    r->count++;
    t->index = index;
    t->generation = s->generation;
    return too_big;
}

int fi_ring_open(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *out)
{
    fi_ring_slot *s = &r->slots[t->index];
    if (s->generation != t->generation || !s->dir)
        return -1;
    slot_take(r, s);
    fi_ring_files_free(out);
    files_move(out, &s->files);
    return 0;
}

void fi_ring_done(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *files)
{
    fi_ring_slot *s = &r->slots[t->index];
    if (s->generation != t->generation) { /* evicted, or the ring fired, meanwhile */
        fi_ring_files_free(files);
        return;
    }
    fi_ring_files_free(&s->files);
    files_move(&s->files, files);
    size_t now = files_bytes(&s->files);
    r->used = r->used - s->bytes + now;
    s->bytes = now;
    atomic_store(&s->state, FI_SLOT_READY);
    /* the call's outputs may have pushed the ring over its budget: older calls go */
    while (r->count > 1 && held(r) > r->budget && r->head != t->index)
        evict_oldest(r, 0);
}

size_t fi_ring_bytes(const fi_ring *r) { return held(r); }

void fi_ring_free(fi_ring *r)
{
    if (!r)
        return;
    fi_ring_uninstall_signals(r);
    for (long long i = 0; r->slots && i < r->n; i++) {
        free(r->slots[i].dir);
        fi_ring_files_free(&r->slots[i].files);
    }
    free(r->slots);
    fi_chunk_store_free(r->store); /* after the slots: they release their chunks into it */
    free(r->root);
    free(r->ext);
    free(r);
}

int fi_ring_fire(fi_ring *r, const char *trigger)
{
    if (!fi_ring_recording(r))
        return 0;
    atomic_fetch_add(&r->fired, 1);
    int written = fi_crash_write_ring(r, trigger, NULL);
    reset(r);
    return written;
}
