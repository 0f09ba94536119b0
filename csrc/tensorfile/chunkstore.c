/* chunkstore.c: chunks stored once by content: a hash table of refcounted chunks keyed by
 * length and keyed hash, their bytes in buffers recycled through a free list (a fresh
 * buffer per chunk would fault in new pages on every call), and the pack record writer. */
#include "chunkstore.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* Full-size buffers kept for reuse when their chunks go: up to 16 MiB of them. */
#define FREE_MAX 256

/* The hashes last put from up to 2 x MEMO_SETS source addresses (two per set, the set
 * picked by address), in a store that keeps bytes: a chunk captured again from the same
 * address is compared with the stored bytes of the hash it had there before, and takes
 * that hash without hashing when they are equal (fi_chunk_store_hash). */
#define MEMO_SETS 128

typedef struct {
    const void *p; /* only a key: never read through (the source may be gone) */
    size_t len;
    fi_chunk_hash h;
} memo_entry;

struct fi_chunk_store {
    uint32_t key[FI_CHUNK_KEY_WORDS];
    int keep_data;
    fi_chunk **bucket;
    size_t nbuckets, count, bytes;
    uint64_t next_id;
    char *free_buf[FREE_MAX];
    int nfree;
    uint64_t parts_added;
    uint64_t hashed, memo_hits;
    memo_entry memo[MEMO_SETS][2]; /* [0]: the one put last */
};

/* Random key words from the kernel (getrandom, else /dev/urandom). 0 or -1. */
static int draw_key(uint32_t *key, size_t n)
{
    char *p = (char *)key;
    size_t left = n * sizeof(uint32_t);
    while (left > 0) {
        ssize_t k = getrandom(p, left, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        p += k;
        left -= (size_t)k;
    }
    if (left == 0)
        return 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && left > 0) {
        ssize_t k = read(fd, p, left);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        p += k;
        left -= (size_t)k;
    }
    if (fd >= 0)
        close(fd);
    return left == 0 ? 0 : -1;
}

fi_chunk_store *fi_chunk_store_new(int keep_data)
{
    fi_chunk_store *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->keep_data = keep_data;
    s->nbuckets = 1024;
    s->bucket = calloc(s->nbuckets, sizeof(fi_chunk *));
    s->next_id = 1;
    if (!s->bucket || draw_key(s->key, FI_CHUNK_KEY_WORDS) < 0) {
        free(s->bucket);
        free(s);
        return NULL;
    }
    return s;
}

void fi_chunk_store_free(fi_chunk_store *s)
{
    if (!s)
        return;
    for (size_t b = 0; b < s->nbuckets; b++) {
        for (fi_chunk *c = s->bucket[b], *next; c; c = next) {
            next = c->next;
            free(c->data);
            fi_stats_stream_free(c->part);
            free(c->whole);
            free(c);
        }
    }
    for (int i = 0; i < s->nfree; i++)
        free(s->free_buf[i]);
    free(s->bucket);
    memset(s->key, 0, sizeof s->key);
    free(s);
}

const uint32_t *fi_chunk_store_key(const fi_chunk_store *s) { return s->key; }

static size_t memo_set(const void *data)
{
    uintptr_t a = (uintptr_t)data >> 6;
    return (a ^ (a >> 7) ^ (a >> 14) ^ (a >> 21)) & (MEMO_SETS - 1);
}

/* What data's address last put, or NULL. */
static const memo_entry *memo_find(const fi_chunk_store *s, const void *data, size_t len)
{
    const memo_entry *e = s->memo[memo_set(data)];
    for (int w = 0; w < 2; w++)
        if (e[w].p == data && e[w].len == len)
            return &e[w];
    return NULL;
}

/* Remembers that data's address put the chunk of hash h: in its set's first entry, the
 * other entry keeping the one put before from another address. */
static void memo_put(fi_chunk_store *s, const void *data, size_t len, const fi_chunk_hash *h)
{
    memo_entry *e = s->memo[memo_set(data)];
    if (e[0].p != data)
        e[1] = e[0];
    e[0] = (memo_entry){data, len, *h};
}

/* Equal bytes have equal hashes: a stored chunk whose bytes are data's gives its hash, which
 * is fi_chunk_hash_cpu's of data, bit for bit (the chunk was put under that hash). Only
 * reads the store, so the capture's threads may call it at once. */
int fi_chunk_store_hash(const fi_chunk_store *s, const void *data, size_t len, fi_chunk_hash *h)
{
    if (s->keep_data) {
        const memo_entry *e = memo_find(s, data, len);
        const fi_chunk *c = e ? fi_chunk_peek(s, len, &e->h) : NULL;
        if (c && c->data && memcmp(c->data, data, len) == 0) {
            *h = e->h;
            return 1;
        }
    }
    fi_chunk_hash_cpu(data, len, s->key, h);
    return 0;
}

void fi_chunk_store_hash_count(fi_chunk_store *s, uint64_t hashed, uint64_t memo_hits)
{
    s->hashed += hashed;
    s->memo_hits += memo_hits;
}

uint64_t fi_chunk_store_hashed(const fi_chunk_store *s, uint64_t *memo_hits)
{
    if (memo_hits)
        *memo_hits = s->memo_hits;
    return s->hashed;
}

void fi_chunk_store_parts_added_count(fi_chunk_store *s, uint64_t n) { s->parts_added += n; }
uint64_t fi_chunk_store_parts_added(const fi_chunk_store *s) { return s->parts_added; }

size_t fi_chunk_store_bytes(const fi_chunk_store *s) { return s->bytes; }
size_t fi_chunk_store_count(const fi_chunk_store *s) { return s->count; }

/* The hash is keyed and random, so its first word spreads chunks over the buckets. */
static size_t bucket_of(const fi_chunk_store *s, const fi_chunk_hash *h)
{
    return (size_t)(h->h[0] ^ (h->h[0] >> 29)) & (s->nbuckets - 1);
}

static void grow(fi_chunk_store *s)
{
    size_t n = s->nbuckets * 2;
    fi_chunk **b = calloc(n, sizeof(fi_chunk *));
    if (!b)
        return; /* longer chains, still correct */
    fi_chunk **old = s->bucket;
    size_t old_n = s->nbuckets;
    s->bucket = b;
    s->nbuckets = n;
    for (size_t i = 0; i < old_n; i++) {
        for (fi_chunk *c = old[i], *next; c; c = next) {
            next = c->next;
            size_t k = bucket_of(s, &c->hash);
            c->next = b[k];
            b[k] = c;
        }
    }
    free(old);
}

static char *take_buffer(fi_chunk_store *s, size_t len)
{
    if (len == FI_CHUNK_MAX && s->nfree > 0)
        return s->free_buf[--s->nfree];
    return malloc(len ? len : 1);
}

static void give_buffer(fi_chunk_store *s, char *p, size_t len)
{
    if (len == FI_CHUNK_MAX && s->nfree < FREE_MAX)
        s->free_buf[s->nfree++] = p;
    else
        free(p);
}

const fi_chunk *fi_chunk_peek(const fi_chunk_store *s, size_t len, const fi_chunk_hash *h)
{
    for (const fi_chunk *c = s->bucket[bucket_of(s, h)]; c; c = c->next)
        if (c->len == len && memcmp(&c->hash, h, sizeof *h) == 0)
            return c;
    return NULL;
}

fi_chunk *fi_chunk_find(fi_chunk_store *s, size_t len, const fi_chunk_hash *h)
{
    fi_chunk *c = (fi_chunk *)fi_chunk_peek(s, len, h); /* the store's own: not const */
    if (c)
        c->refs++;
    return c;
}

fi_chunk *fi_chunk_put(fi_chunk_store *s, const void *data, size_t len, const fi_chunk_hash *h,
                       int *added)
{
    *added = 0;
    if (s->keep_data)
        memo_put(s, data, len, h);
    fi_chunk *c = fi_chunk_find(s, len, h);
    if (c)
        return c;
    size_t k = bucket_of(s, h);
    c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (s->keep_data) {
        c->data = take_buffer(s, len);
        if (!c->data) {
            free(c);
            return NULL;
        }
        memcpy(c->data, data, len);
    }
    c->hash = *h;
    c->len = (uint32_t)len;
    c->id = s->next_id++;
    c->refs = 1;
    c->pack = -1;
    c->next = s->bucket[k];
    s->bucket[k] = c;
    s->count++;
    s->bytes += len;
    *added = 1;
    if (s->count > 2 * s->nbuckets)
        grow(s);
    return c;
}

void fi_chunk_release(fi_chunk_store *s, fi_chunk *c)
{
    if (!c || --c->refs > 0)
        return;
    fi_chunk **p = &s->bucket[bucket_of(s, &c->hash)];
    while (*p && *p != c)
        p = &(*p)->next;
    if (*p)
        *p = c->next;
    s->count--;
    s->bytes -= c->len;
    if (c->data)
        give_buffer(s, c->data, c->len);
    fi_stats_stream_free(c->part);
    free(c->whole);
    free(c);
}

void fi_chunk_keep_stats(fi_chunk *c, fi_dtype dtype, const fi_stats *st)
{
    if (!c->whole && !(c->whole = malloc(sizeof(*c->whole))))
        return;
    *c->whole = *st;
    c->whole_dtype = dtype;
}

/* ------------------------------------------------------------------ packs */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int write_all_raw(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int fi_chunk_pack_write(int fd, const fi_chunk *c, const void *data)
{
    uint8_t h[FI_PACK_HEADER] = {'F', 'I', 'c', 'k'};
    put_le(h + 4, c->len, 4);
    put_le(h + 8, c->id, 8);
    if (write_all_raw(fd, (const char *)h, sizeof h) < 0)
        return -1;
    return write_all_raw(fd, data, c->len);
}
