/* chunkstore.h: the flight recorder's content-addressed chunk store (docs/dump-format.md,
 * "Chunk store"): large tensors are cut into chunks of a page or at most FI_CHUNK_MAX bytes,
 * each stored once by content and referenced by the calls that hold it. */
#ifndef FI_CHUNKSTORE_H
#define FI_CHUNKSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "flashinfer_kernels.h"

/* One stored chunk. A chunk is the same as another when its length and 256-bit keyed hash
 * are: for two distinct chunks the hash collides with probability at most 2^-128 over
 * the store's random key (kernels/cpu/chunk_hash.c). */
typedef struct fi_chunk {
    fi_chunk_hash hash;
    uint32_t len;
    uint64_t id;      /* unique in its store, never reused: what manifests name */
    int64_t refs;     /* references held by recorded calls */
    char *data;       /* the bytes, or NULL where the store keeps none (written to a pack) */
    int64_t pack;     /* the pack it was last written to (fi_chunk_pack_*), or -1 */
    uint64_t fired;   /* the ring's last write-out that wrote it */
    uint64_t counted; /* the ring's mark of the last count that counted it */
    /* its statistics partial (fi_stats_part_new), or NULL: a capture that meets the chunk
     * again adds it instead of reading the bytes (docs/dump-format.md#chunk-statistics) */
    fi_stats_stream *part;
    /* the statistics of a tensor that is this chunk whole, as whole_dtype, or NULL: a
     * capture that meets the chunk again as a tensor of that dtype takes them instead of
     * reading the bytes (fi_compact_capture) */
    fi_stats *whole;
    fi_dtype whole_dtype;
    struct fi_chunk *next;
} fi_chunk;

typedef struct fi_chunk_store fi_chunk_store;

/* A store; keep_data: chunks keep their bytes in memory (the in-memory ring) rather than
 * only in a pack on disk. NULL when out of memory or no random key could be drawn. */
fi_chunk_store *fi_chunk_store_new(int keep_data);
void fi_chunk_store_free(fi_chunk_store *s);

/* The store's key (FI_CHUNK_KEY_WORDS words), for hashing chunks elsewhere (the device). */
const uint32_t *fi_chunk_store_key(const fi_chunk_store *s);

/* The hash of data[0..len) under the store's key. In a store that keeps bytes, a chunk put
 * from the same address before whose stored bytes equal data's gives its hash without
 * hashing (1 returned; 0 when hashed). Only reads the store. */
int fi_chunk_store_hash(const fi_chunk_store *s, const void *data, size_t len, fi_chunk_hash *h);
/* Counts chunks hashed and chunks whose hash came from the stored bytes; the counts so far
 * (tests read them). */
void fi_chunk_store_hash_count(fi_chunk_store *s, uint64_t hashed, uint64_t memo_hits);
uint64_t fi_chunk_store_hashed(const fi_chunk_store *s, uint64_t *memo_hits);

/* A new reference to the stored chunk of len bytes whose hash is h, or NULL when the store
 * lacks it: what the device path asks before it copies a chunk (compact.c). */
fi_chunk *fi_chunk_find(fi_chunk_store *s, size_t len, const fi_chunk_hash *h);

/* A new reference to the chunk holding data[0..len) (len <= FI_CHUNK_MAX) whose hash is h:
 * found, or added (*added set; its bytes copied when the store keeps data). NULL when out
 * of memory. */
fi_chunk *fi_chunk_put(fi_chunk_store *s, const void *data, size_t len, const fi_chunk_hash *h,
                       int *added);

/* The chunk holding len bytes whose hash is h, or NULL; no reference is taken. Only reads
 * the store, so threads may look up while nothing changes it. */
const fi_chunk *fi_chunk_peek(const fi_chunk_store *s, size_t len, const fi_chunk_hash *h);

/* Keeps st, the statistics of a tensor of dtype that is c's bytes whole, with c (the last
 * kept when they differ; nothing when out of memory). */
void fi_chunk_keep_stats(fi_chunk *c, fi_dtype dtype, const fi_stats *st);

/* Drops a reference; the chunk goes when the last one does. */
void fi_chunk_release(fi_chunk_store *s, fi_chunk *c);

/* Counts n more chunks whose statistics a capture took from their kept partial instead of
 * their bytes, and gives the count so far: tests read it to see the bytes were not read. */
void fi_chunk_store_parts_added_count(fi_chunk_store *s, uint64_t n);
uint64_t fi_chunk_store_parts_added(const fi_chunk_store *s);

/* Bytes of the chunks held (each counted once however many calls hold it), and their
 * number. */
size_t fi_chunk_store_bytes(const fi_chunk_store *s);
size_t fi_chunk_store_count(const fi_chunk_store *s);

/* ---- packs: chunk records appended to a file, read back by id ----
 * A record is "FIck", the length (u32 LE), the id (u64 LE), then the bytes. */

#define FI_PACK_HEADER 16

/* Appends c's record to the open pack fd (async-signal-safe: write(2) only). 0 or -1. */
int fi_chunk_pack_write(int fd, const fi_chunk *c, const void *data);

#endif
