/* ring_memory.h: the in-memory ring (FLASHINFER_DUMP_RING with FLASHINFER_DUMP_ON): the
 * last N calls as complete file images, written out when a trigger fires (docs/ring.md). */
#ifndef FI_RING_MEMORY_H
#define FI_RING_MEMORY_H

#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

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

/* A write-out reads a slot only while it is READY; a call that changes a slot makes it BUSY
 * first, and only while no write-out runs (see slot_take in ring_memory.c). */
enum { FI_SLOT_EMPTY, FI_SLOT_BUSY, FI_SLOT_READY };

/* What write-outs wrote of a slot's call already, so that a later one writes only the rest. */
enum { FI_WROTE_DIR = 1, FI_WROTE_INPUTS = 2, FI_WROTE_OUTPUTS = 4 };

typedef struct {
    atomic_int state;
    long long generation; /* the call's number in the ring (1, 2, ...; 0: none) */
    long owner_tid;       /* the thread that made the call */
    char *dir;
    fi_ring_files files;
    size_t bytes;        /* what its buffers hold (the budget counts capacity) */
    unsigned wrote;      /* FI_WROTE_* */
    size_t meta_written; /* bytes of files.meta in its metadata.jsonl and session.jsonl */
} fi_ring_slot;

/* The ring. Its calls change it in normal context under the GIL; a write-out (crash_writer.c)
 * reads it in normal context or inside a signal handler (ring_signals.c), on any thread. One
 * write-out runs at a time: it holds writer, and no call changes a slot meanwhile. */
/* The longest trigger record line of session.jsonl (ring_memory.h's fi_ring_result). */
#define FI_TRIGGER_RECORD_MAX 4096

/* The write-out's path and line buffers. A write-out may run in a signal handler on
 * whatever alternate stack the thread has (faulthandler's is 16 KB or less), so they live
 * here, made with the ring, not on that stack; write-outs are one at a time
 * (fi_ring_writer_try), so one set serves them all. Each function that uses one has its
 * own. */
typedef struct fi_crash_scratch {
    char session[PATH_MAX];           /* fi_crash_write_ring */
    char slot_dir[PATH_MAX];          /* write_slot */
    char pack_dir[PATH_MAX];          /* write_pack */
    char pack_path[PATH_MAX];         /* write_pack */
    char file[PATH_MAX];              /* write_whole2 */
    char file_tmp[PATH_MAX];          /* write_whole2 */
    char dirs[PATH_MAX];              /* make_dirs */
    char removed[PATH_MAX];           /* remove_partial */
    char line[FI_TRIGGER_RECORD_MAX]; /* write_trigger_line */
} fi_crash_scratch;

typedef struct fi_ring {
    long long n;
    fi_crash_scratch *scratch; /* the write-out's buffers (see above) */
    char *root;
    char *ext;               /* tensor file extension: "pt" or "safetensors" */
    fi_chunk_store *store;   /* the compact layout's chunks (NULL: FlashInfer's layout) */
    char pack_prefix[64];    /* "ring-PID-NS-": a write-out's pack is chunks/PREFIX<K>.pack */
    fi_ring_slot *slots;     /* n slots, never moved: their inline buffers stay put */
    long long head, count;   /* index of the oldest call; calls held */
    atomic_llong generation; /* the last generation handed out; slot (g - 1) % n holds g */
    size_t budget, used;
    long long max_triggers;
    atomic_llong fired;         /* triggers written (counted under writer) */
    atomic_long writer;         /* the thread id of the write-out running, 0 when none */
    atomic_int restart_pending; /* a signal handler wrote the ring: reset it in normal context */
    atomic_int freeing;         /* the writer frees the ring's calls (after writing them) */
    unsigned long fork_epoch;   /* fi_fork_epoch() when the ring was made */
    int hold_fd, hold_note_fd;  /* test hook (fi_ring_hold_writeouts), -1 when unset */
    uint64_t count_mark;        /* the last mark fi_ring_call_fits gave chunks it counted */
    uint64_t packs_written;     /* the compact layout's write-outs: pack PREFIX<k> is the k-th */
} fi_ring;

/* A ring of n calls under root, keeping at most budget bytes and firing at most max_triggers
 * times; ext names the tensor files ("pt"); compact: calls keep their tensors as chunks of
 * one store, which the budget counts once each. NULL when out of memory. */
fi_ring *fi_ring_new(long long n, const char *root, size_t budget, long long max_triggers,
                     const char *ext, int compact);
void fi_ring_free(fi_ring *r);

/* Whether calls are recorded now: not once max_triggers fired (the memory is then given
 * back), nor while a write-out runs (a call then is not kept: the ring restarts after it). */
int fi_ring_recording(fi_ring *r);

/* A call's files while it writes them: its own, outside the ring, so that nothing another
 * thread does to the ring meanwhile (evicting the slot, firing) can touch them. */
void fi_ring_files_init(fi_ring_files *f);
void fi_ring_files_free(fi_ring_files *f);

enum { FI_CLAIM_OK, FI_CLAIM_TOO_BIG, FI_CLAIM_BUSY, FI_CLAIM_NO_MEMORY };

/* Claims the newest slot, named dir, for a call of bytes tensor bytes. A call larger than the
 * whole budget is found so before anything is evicted: FI_CLAIM_TOO_BIG, and the slot gets
 * records only. Otherwise the oldest calls are evicted until it fits. The slot's buffers move
 * to out (emptied, for reuse) until fi_ring_done. FI_CLAIM_BUSY: a write-out runs, the call
 * is not recorded. */
int fi_ring_claim(fi_ring *r, const char *dir, size_t bytes, fi_ring_ticket *t, fi_ring_files *out);

/* Moves a claimed slot's files to out, to add to them: -1 when the slot was evicted, the ring
 * restarted since, or a write-out runs (the rest of the call is then not recorded).
 * fi_ring_done moves files back into the slot and publishes them, or frees them when the slot
 * is gone; either way files is left empty. */
int fi_ring_open(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *out);
void fi_ring_done(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *files);

/* Evicts every call but the one of t (NULL: every call) and frees their buffers: memory for
 * a retry after a failed allocation. */
void fi_ring_evict_others(fi_ring *r, const fi_ring_ticket *t);

/* Whether a call whose files are own still fits the budget alone with more bytes added (its
 * chunks counted once each). */
int fi_ring_call_fits(fi_ring *r, const fi_ring_files *own, size_t more);

/* The outcome of a write-out (crash_writer.c). */
typedef struct {
    long long written;    /* calls written now */
    long long before;     /* calls an earlier write-out had written already */
    long long lost;       /* calls that could not be written */
    int error;            /* errno of the first failure, 0 when none */
    int fired;            /* 0 when FLASHINFER_DUMP_MAX_TRIGGERS had been reached: nothing done */
    int record;           /* the trigger record in session.jsonl: FI_RECORD_* */
    int record_error;     /* FI_RECORD_LOST: errno */
    size_t keys_left_out; /* FI_RECORD_SHORT: bytes of the triggering call's keys left out */
} fi_ring_result;

/* The trigger record: written whole; written without the triggering call's keys (the line
 * would pass FI_TRIGGER_RECORD_MAX bytes); not written (session.jsonl refused it). */
enum { FI_RECORD_WHOLE, FI_RECORD_SHORT, FI_RECORD_LOST };

/* The longest trigger name dump_ring takes, in bytes. */
#define FI_TRIGGER_NAME_MAX 128

/* Writes the ring for trigger (normal context): the call of first (a generation, 0: none)
 * first, then the others newest first, and a trigger record in session.jsonl; the ring then
 * starts again. Waits for a write-out running on another thread (wait is called while it
 * does, e.g. to let the GIL go). 0, or -1 (errno set) when the root cannot be made. */
int fi_ring_fire(fi_ring *r, const char *trigger, long long first, void (*wait)(void),
                 fi_ring_result *out);

/* Bytes the ring holds now: its buffers, and its chunks once each. */
size_t fi_ring_bytes(const fi_ring *r);

/* Releases a manifest's chunk references and buffer (it is left empty). */
void fi_ring_manifest_clear(fi_ring_manifest *m);

/* Test hook: every write-out, after its first call, writes 'h' to note_fd and blocks until
 * a byte can be read from hold_fd, and again ('f') before it frees the calls it wrote; a
 * trigger that has to wait for a write-out writes 'w' (-1: off). */
void fi_ring_hold_writeouts(fi_ring *r, int hold_fd, int note_fd);

/* The process forked since the ring was made (pthread_atfork): the ring is the parent's. */
int fi_ring_forked(const fi_ring *r);

/* Forgets the parent's calls in a forked child, without writing them: an empty ring of the
 * child's own. */
void fi_ring_restart_in_child(fi_ring *r);

#endif
