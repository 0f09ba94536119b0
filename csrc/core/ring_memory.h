/* ring_memory.h: the in-memory ring (FLASHINFER_DUMP_RING with FLASHINFER_DUMP_ON): the
 * last N calls as complete file images, written out when a trigger fires (docs/ring.md). */
#ifndef FI_RING_MEMORY_H
#define FI_RING_MEMORY_H

#include <stdatomic.h>
#include <stddef.h>

#include "compact.h"
#include "strbuf.h"
#include "tensorio.h"

/* A call's tensors in the compact layout (docs/dump-format.md): references to chunks of the
 * ring's store and the manifest's tail, both made at call time. */
typedef struct {
    fi_chunk_store *store; /* borrowed: the ring's, which outlives every slot */
    fi_compact_tensor *t;  /* owns its chunk references */
    size_t n;
    fi_buf tail; /* empty: no manifest */
} fi_ring_manifest;

/* One recorded call: its directory's files, built at call time. */
typedef struct {
    fi_image inputs, outputs;   /* tensor file images (len 0: no file) */
    fi_ring_manifest cin, cout; /* or, in the compact layout, the tensors' manifests */
    fi_buf meta;                /* metadata.jsonl: one line per record */
    fi_buf trigger_keys;        /* "\"function_name\": ..., \"dump_dir\": ...": for trigger lines */
} fi_ring_files;

/* A claimed slot: where a call's files go, valid while generation matches. */
typedef struct {
    long long index, generation;
} fi_ring_ticket;

/* A slot is only read by a write-out while READY; whoever changes it makes it BUSY first. */
enum { FI_SLOT_EMPTY, FI_SLOT_BUSY, FI_SLOT_READY };

typedef struct {
    atomic_int state;
    long long generation;
    char *dir;
    fi_ring_files files;
    size_t bytes; /* what its buffers hold (the budget counts capacity) */
} fi_ring_slot;

/* The ring. Changed in normal context under the GIL; read by the write-out
 * (crash_writer.c), which also runs inside signal handlers (ring_signals.c). */
typedef struct fi_ring {
    long long n;
    char *root;
    char *ext;             /* tensor file extension: "pt" or "safetensors" */
    fi_chunk_store *store; /* the compact layout's chunks (NULL: FlashInfer's layout) */
    char pack_prefix[64];  /* "ring-PID-NS-": a write-out's pack is chunks/PREFIX<K>.pack */
    fi_ring_slot *slots;   /* n slots, never moved: their inline buffers stay put */
    long long head, count; /* index of the oldest call; calls held */
    long long generation;  /* last generation handed out */
    size_t budget, used;
    long long max_triggers;
    atomic_llong fired;
    atomic_int flushing;        /* a writer is reading slots (maybe a signal handler) */
    atomic_int restart_pending; /* a signal handler fired: reset at the next claim */
} fi_ring;

/* A ring of n calls under root, keeping at most budget_gb and firing at most max_triggers
 * times; ext names the tensor files ("pt"); compact: calls keep their tensors as chunks of
 * one store, which the budget counts once each. NULL when out of memory. */
fi_ring *fi_ring_new(long long n, const char *root, double budget_gb, long long max_triggers,
                     const char *ext, int compact);
void fi_ring_free(fi_ring *r);

/* Whether calls are still recorded (false once max_triggers fired). */
int fi_ring_recording(fi_ring *r);

/* A call's files while it writes them: its own, outside the ring, so that nothing another
 * thread does to the ring meanwhile (evicting the slot, firing) can touch them. */
void fi_ring_files_init(fi_ring_files *f);
void fi_ring_files_free(fi_ring_files *f);

/* Makes room for a call of about bytes tensor bytes (evicting the oldest calls) and
 * claims the newest slot, named dir. Its buffers move to out (emptied, for reuse) until
 * fi_ring_done. Returns 0, or 1 when the call alone exceeds the budget (the slot then
 * gets no tensor files), -1 when out of memory. */
int fi_ring_claim(fi_ring *r, const char *dir, size_t bytes, fi_ring_ticket *t, fi_ring_files *out);

/* Moves a claimed slot's files to out, to add to them: -1 when the slot was evicted or
 * the ring fired since (the call is then not recorded). fi_ring_done moves files back
 * into the slot and publishes them, or frees them when the slot is gone; either way
 * files is left empty. A slot is not written by a trigger while its files are out. */
int fi_ring_open(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *out);
void fi_ring_done(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *files);

/* Writes the ring's calls (call order) as dump directories plus a trigger record in
 * session.jsonl naming trigger and the newest call, then starts the ring again.
 * Returns the number of calls written, -1 (errno set) when the root cannot be written. */
int fi_ring_fire(fi_ring *r, const char *trigger);

/* Bytes the ring holds now: its buffers, and its chunks once each. */
size_t fi_ring_bytes(const fi_ring *r);

/* Releases a manifest's chunk references and buffer (it is left empty). */
void fi_ring_manifest_clear(fi_ring_manifest *m);

#endif
