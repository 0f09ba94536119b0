/* ring_memory.c: the in-memory ring's slots, each holding one call's complete files: claimed
 * by a new call, published when its records are written, evicted oldest first; and the
 * trigger that writes them out (crash_writer.c) and starts the ring again. */
#include "ring_memory.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crash_writer.h"
#include "dump_format.h"
#include "fork_watch.h"
#include "ring_signals.h"

/* The names of this process's packs: "ring-PID-NS-" (unique per process and ring). */
static void set_pack_prefix(fi_ring *r)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(r->pack_prefix, sizeof r->pack_prefix, FI_DUMP_RING_PACK_PREFIX "%ld-%lld%09ld-",
             (long)getpid(), (long long)now.tv_sec, (long)now.tv_nsec);
    r->packs_written = 0;
}

fi_ring *fi_ring_new(long long n, const char *root, size_t budget, long long max_triggers,
                     const char *ext, int compact)
{
    fi_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->n = n;
    r->root = strdup(root);
    r->ext = strdup(ext);
    r->slots = calloc((size_t)n, sizeof(fi_ring_slot));
    r->scratch = malloc(sizeof(*r->scratch));
    r->budget = budget;
    r->max_triggers = max_triggers;
    r->hold_fd = r->hold_note_fd = -1;
    r->fork_epoch = fi_fork_epoch();
    if (compact)
        r->store = fi_chunk_store_new(1);
    if (!r->root || !r->ext || !r->slots || !r->scratch || (compact && !r->store)) {
        fi_ring_free(r);
        return NULL;
    }
    set_pack_prefix(r);
    for (long long i = 0; i < n; i++) /* slots never move: their inline buffers stay put */
        fi_ring_files_init(&r->slots[i].files);
    return r;
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

/* Moves src's contents to dst (whose own buffers are already released); src is left empty.
 * A short buffer lives in its struct's inline array, so it is copied, not pointed at. */
static void buf_move(fi_buf *dst, fi_buf *src)
{
    if (src->data == src->inline_data) {
        fi_buf_init(dst);
        memcpy(dst->inline_data, src->inline_data, src->len + 1);
        dst->len = src->len;
        dst->oom = src->oom;
    } else { /* the heap block changes hands; the inline array is not in use */
        dst->data = src->data;
        dst->len = src->len;
        dst->cap = src->cap;
        dst->oom = src->oom;
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

/* ------------------------------------------------------------- the slots */

/* Makes s BUSY for a call to change it, unless a write-out runs: a write-out pins every
 * slot, so that nothing it reads is changed or freed meanwhile. Both sides set their own
 * flag before they read the other's (sequentially consistent atomics), so one of them
 * always sees the other: the write-out skips a BUSY slot, the call leaves a slot alone
 * while a write-out runs. 0, or -1 (s unchanged) when a write-out runs. */
static int slot_take(fi_ring *r, fi_ring_slot *s)
{
    if (atomic_load(&r->writer))
        return -1;
    int before = atomic_exchange(&s->state, FI_SLOT_BUSY);
    if (atomic_load(&r->writer)) {
        atomic_store(&s->state, before);
        return -1;
    }
    return 0;
}

/* Drops the oldest call, taken BUSY or with the ring held for a write-out; keep_buffers
 * leaves its buffers for reuse by the next call. */
static void drop_oldest(fi_ring *r, int keep_buffers)
{
    fi_ring_slot *s = &r->slots[r->head];
    free(s->dir);
    s->dir = NULL;
    if (!keep_buffers) {
        fi_ring_files_free(&s->files);
        r->used -= s->bytes;
        s->bytes = 0;
    }
    s->generation = 0;
    s->wrote = 0;
    s->meta_written = 0;
    atomic_store(&s->state, FI_SLOT_EMPTY);
    r->head = (r->head + 1) % r->n;
    r->count--;
}

/* Evicts the oldest call from a call's path: -1 while a write-out runs. */
static int evict_oldest(fi_ring *r, int keep_buffers)
{
    if (slot_take(r, &r->slots[r->head]) < 0)
        return -1;
    drop_oldest(r, keep_buffers);
    return 0;
}

/* Writes c to the test hook's note descriptor. */
static void note(const fi_ring *r, char c)
{
    while (write(r->hold_note_fd, &c, 1) < 0 && errno == EINTR)
        ;
}

/* Empties the ring and frees its buffers; the caller holds it for a write-out. */
static void reset(fi_ring *r)
{
    while (r->count > 0)
        drop_oldest(r, 0);
    for (long long i = 0; i < r->n; i++) {
        r->used -= r->slots[i].bytes;
        r->slots[i].bytes = 0;
        fi_ring_files_free(&r->slots[i].files);
    }
    atomic_store(&r->restart_pending, 0);
}

/* reset with the ring held for a write-out. free() may wait for a malloc lock that the
 * thread of a signal handler waiting for the ring holds: freeing tells such a handler to
 * give up its turn rather than wait (ring_signals.c), so the two never wait for each other. */
static void reset_held(fi_ring *r)
{
    atomic_store(&r->freeing, 1);
    fi_ring_test_hold(r, 'f');
    reset(r);
    atomic_store(&r->freeing, 0);
}

int fi_ring_recording(fi_ring *r)
{
    if (atomic_load(&r->writer))
        return 0; /* the ring restarts after the write-out: a call now would not be kept */
    if (atomic_load(&r->restart_pending) || atomic_load(&r->fired) >= r->max_triggers) {
        /* a signal handler wrote the ring, or the last trigger fired (then the memory goes
         * back for good): reset it, holding it so that no handler reads it meanwhile */
        if (fi_ring_writer_try(r) != 1)
            return 0;
        if (atomic_load(&r->restart_pending) || r->count > 0 || r->used > 0)
            reset_held(r);
        fi_ring_writer_release(r);
    }
    return atomic_load(&r->fired) < r->max_triggers;
}

int fi_ring_claim(fi_ring *r, const char *dir, size_t bytes, fi_ring_ticket *t, fi_ring_files *out)
{
    /* found before anything is evicted; a compact call's bytes span more than the chunks it
     * adds (equal chunks are stored once), known only once they are taken: it makes room at
     * fi_ring_done, and its outputs are measured by fi_ring_call_fits */
    int too_big = bytes > r->budget;
    size_t need = r->store ? 0 : bytes;
    if (r->count == r->n && evict_oldest(r, 1) < 0)
        return FI_CLAIM_BUSY;
    long long index = (r->head + r->count) % r->n; /* unchanged by evictions */
    fi_ring_slot *s = &r->slots[index];
    /* a reused slot's buffers stay (and stay counted) until the call's files replace them */
    size_t retained = s->bytes;
    while (!too_big && r->count > 0 && held(r) - retained + need > r->budget)
        if (evict_oldest(r, 0) < 0)
            return FI_CLAIM_BUSY;
    char *copy = strdup(dir);
    if (!copy)
        return FI_CLAIM_NO_MEMORY;
    if (slot_take(r, s) < 0) {
        free(copy);
        return FI_CLAIM_BUSY;
    }
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
    free(s->dir);
    s->dir = copy;
    s->owner_tid = fi_fork_tid(); /* fi_crash_tid's value, read once per thread */
    s->wrote = 0;
    s->meta_written = 0;
    s->generation = atomic_load(&r->generation) + 1;
    atomic_store(&r->generation, s->generation);
    r->count++;
    t->index = index;
    t->generation = s->generation;
    return too_big ? FI_CLAIM_TOO_BIG : FI_CLAIM_OK;
}

int fi_ring_open(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *out)
{
    fi_ring_slot *s = &r->slots[t->index];
    if (s->generation != t->generation || !s->dir || slot_take(r, s) < 0)
        return -1;
    fi_ring_files_free(out);
    files_move(out, &s->files);
    return 0;
}

void fi_ring_done(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *files)
{
    fi_ring_slot *s = &r->slots[t->index];
    if (s->generation != t->generation) { /* evicted, or the ring restarted, meanwhile */
        fi_ring_files_free(files);
        return;
    }
    /* the slot is BUSY, the call's own since fi_ring_claim or fi_ring_open */
    fi_ring_files_free(&s->files);
    files_move(&s->files, files);
    size_t now = files_bytes(&s->files);
    r->used = r->used - s->bytes + now;
    s->bytes = now;
    atomic_store(&s->state, FI_SLOT_READY);
    /* the call's outputs may have pushed the ring over its budget: older calls go */
    while (r->count > 1 && held(r) > r->budget && r->head != t->index)
        if (evict_oldest(r, 0) < 0)
            break;
}

void fi_ring_evict_others(fi_ring *r, const fi_ring_ticket *t)
{
    long long keep = t ? t->index : -1;
    while (r->count > 0 && r->head != keep)
        if (evict_oldest(r, 0) < 0)
            return;
    for (long long i = 0; i < r->n; i++) { /* buffers kept for reuse by emptied slots */
        fi_ring_slot *s = &r->slots[i];
        if (i == keep || s->generation || !s->bytes || slot_take(r, s) < 0)
            continue;
        fi_ring_files_free(&s->files);
        r->used -= s->bytes;
        s->bytes = 0;
        atomic_store(&s->state, FI_SLOT_EMPTY);
    }
}

/* The bytes of the distinct chunks m references, each chunk counted at its first reference
 * (marked with mark, a number no earlier count used). */
static size_t manifest_chunk_bytes(const fi_ring_manifest *m, uint64_t mark)
{
    size_t bytes = 0;
    for (size_t i = 0; i < m->n; i++)
        for (size_t k = 0; k < m->t[i].nref; k++) {
            fi_chunk *c = m->t[i].ref[k].chunk;
            if (c->counted != mark) {
                c->counted = mark;
                bytes += c->len;
            }
        }
    return bytes;
}

int fi_ring_call_fits(fi_ring *r, const fi_ring_files *own, size_t more)
{
    uint64_t mark = ++r->count_mark;
    size_t bytes = files_bytes(own) + manifest_chunk_bytes(&own->cin, mark) +
                   manifest_chunk_bytes(&own->cout, mark);
    return bytes + more <= r->budget;
}

size_t fi_ring_bytes(const fi_ring *r) { return held(r); }

void fi_ring_hold_writeouts(fi_ring *r, int hold_fd, int note_fd)
{
    r->hold_fd = hold_fd;
    r->hold_note_fd = note_fd;
}

int fi_ring_forked(const fi_ring *r) { return r->fork_epoch != fi_fork_epoch(); }

void fi_ring_restart_in_child(fi_ring *r)
{
    /* the parent's write-out, if one ran when it forked, has no thread here */
    atomic_store(&r->writer, 0);
    reset(r);
    atomic_store(&r->generation, 0);
    r->head = 0;
    atomic_store(&r->fired, 0);
    r->fork_epoch = fi_fork_epoch();
    set_pack_prefix(r); /* the child's packs must not take the parent's names */
}

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
    free(r->scratch);
    free(r);
}

int fi_ring_fire(fi_ring *r, const char *trigger, long long first, void (*wait)(void),
                 fi_ring_result *out)
{
    memset(out, 0, sizeof(*out));
    int held, waited = 0;
    while ((held = fi_ring_writer_try(r)) == 0) { /* a signal handler on another thread writes */
        if (!waited++ && r->hold_note_fd >= 0)
            note(r, 'w'); /* test hook: this trigger waits */
        wait();
    }
    if (held < 0)
        return 0; /* cannot happen in normal context: this thread writes it already */
    int rc = 0;
    if (atomic_load(&r->fired) < r->max_triggers) {
        atomic_fetch_add(&r->fired, 1);
        out->fired = 1;
        rc = fi_crash_write_ring(r, trigger, NULL, first, out);
        reset_held(r);
    }
    fi_ring_writer_release(r);
    return rc;
}
