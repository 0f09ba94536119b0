/* compact.c: the compact dump layout: tensors captured as chunk references (hashed, their
 * statistics taken and new chunks appended to a pack in the same pass over each chunk),
 * the manifest that names them, and the reader that rebuilds the tensors from manifest
 * and packs, parsing both as untrusted input. */
#include "compact.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "tensor.h"

#define MANIFEST_MAX ((size_t)64 << 20)
#define PACKS_MAX 1024
#define SPAN_MAX ((uint64_t)1 << 40)

/* ----------------------------------------------------------------- capture */

static int add_ref(fi_compact_tensor *t, uint64_t offset, fi_chunk *c)
{
    if (t->nref == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        fi_chunk_ref *r = realloc(t->ref, cap * sizeof(*r));
        if (!r)
            return -1;
        t->ref = r;
        t->cap = cap;
    }
    t->ref[t->nref++] = (fi_chunk_ref){offset, c};
    return 0;
}

/* One chunk, its hash h taken: referenced, and appended to the sink's pack when the pack
 * lacks it; *part (may be NULL), a statistics partial taken of it, is kept with the chunk
 * when the chunk has none (*part is then NULL). */
static int capture_chunk(fi_chunk_store *store, const char *p, size_t len, uint64_t offset,
                         const fi_chunk_hash *h, fi_stats_stream **part, fi_pack_sink *sink,
                         fi_compact_tensor *t)
{
    int added;
    fi_chunk *c = fi_chunk_put(store, p, len, h, &added);
    if (!c)
        return -1;
    if (add_ref(t, offset, c) < 0) {
        fi_chunk_release(store, c);
        return -1;
    }
    if (added)
        t->new_bytes += len;
    if (part && *part && !c->part) {
        c->part = *part;
        *part = NULL;
    }
    if (sink && sink->fd >= 0 && c->pack != sink->index && !sink->err) {
        if (fi_chunk_pack_write(sink->fd, c, p) < 0)
            sink->err = errno ? errno : EIO;
        else {
            c->pack = sink->index;
            sink->written += FI_PACK_HEADER + len;
        }
    }
    return 0;
}

/* A chunk of a tensor being captured: where its bytes are and its offset in the span. */
typedef struct {
    const char *p;
    size_t len;
    uint64_t offset;
} chunk_at;

/* The chunks of s (its kept parts, or its whole span, cut at FI_CHUNK_MAX) in order, or
 * NULL when out of memory: in local (room for LOCAL_CHUNKS) when they fit. */
#define LOCAL_CHUNKS 4
static chunk_at *list_chunks(const fi_saved_tensor *s, size_t *count, chunk_at *local)
{
    fi_byte_range whole = {0, s->span_bytes};
    const fi_byte_range *range = s->keep ? s->keep->range : &whole;
    size_t nrange = s->keep ? s->keep->n : 1, n = 0;
    for (size_t i = 0; i < nrange; i++) {
        uint64_t a = range[i].start,
                 b = range[i].end > s->span_bytes ? s->span_bytes : range[i].end;
        n += a < b ? (size_t)((b - a + FI_CHUNK_MAX - 1) / FI_CHUNK_MAX) : 0;
    }
    chunk_at *c = local && n <= LOCAL_CHUNKS ? local : malloc((n ? n : 1) * sizeof(*c));
    if (!c)
        return NULL;
    const char *packed = s->keep ? s->keep->packed : NULL;
    size_t k = 0;
    for (size_t i = 0; i < nrange; i++) {
        uint64_t a = range[i].start,
                 b = range[i].end > s->span_bytes ? s->span_bytes : range[i].end;
        const char *src = packed ? packed : (const char *)s->t.data + a;
        if (packed)
            packed += range[i].end - range[i].start;
        for (uint64_t off = 0; a + off < b; off += FI_CHUNK_MAX)
            c[k++] = (chunk_at){src + off,
                                b - a - off < FI_CHUNK_MAX ? (size_t)(b - a - off) : FI_CHUNK_MAX,
                                a + off};
    }
    *count = k;
    return c;
}

/* Hashes (into h) and statistics (into st, may be NULL) of a run of chunks: one thread's.
 * The statistics of a chunk are read only when they must be: a chunk the store holds with
 * a statistics partial adds it to st; one without gets a new partial (into part[i], which
 * capture_chunk keeps with the chunk) while st can take one; bytes whose partial st cannot
 * take are fed to st in order (docs/dump-format.md#chunk-statistics). */
typedef struct {
    const fi_chunk_store *store;
    const chunk_at *c;
    size_t n;
    fi_chunk_hash *h;
    fi_stats_stream **part;
    fi_stats_stream *st;
    fi_dtype dtype;
    uint64_t reused;            /* chunks whose kept partial was added */
    uint64_t hashed, memo_hits; /* chunks hashed, and given their hash by the store */
    fi_stats *whole; /* a one-chunk stream: the chunk's kept statistics go here (whole_taken) */
    int whole_taken;
} hash_job;

/* Chunk i's statistics into st: its partial added, or its bytes fed. */
static void stats_of_chunk(hash_job *j, fi_stats_stream *st, size_t i)
{
    const fi_chunk *known = fi_chunk_peek(j->store, j->c[i].len, &j->h[i]);
    if (j->whole && known && known->whole && known->whole_dtype == j->dtype) {
        *j->whole = *known->whole; /* the same bytes as the same dtype: the same bits */
        j->whole_taken = 1;
        return;
    }
    const fi_stats_stream *part = known && known->part ? known->part : j->part[i];
    if (!part && fi_stats_stream_exact(st))
        part = j->part[i] = fi_stats_part_new(j->dtype, j->c[i].p, j->c[i].len);
    if (!part || fi_stats_stream_add(st, part) < 0)
        fi_stats_stream_feed(st, j->c[i].p, j->c[i].len);
    else if (part != j->part[i])
        j->reused++;
}

static void *hash_chunks(void *arg)
{
    hash_job *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        if (fi_chunk_store_hash(j->store, j->c[i].p, j->c[i].len, &j->h[i]))
            j->memo_hits++;
        else
            j->hashed++;
        if (j->st)
            stats_of_chunk(j, j->st, i);
    }
    return NULL;
}

#define CAPTURE_MAX_THREADS 64
#define CAPTURE_MIN_BYTES ((uint64_t)4 << 20) /* per thread */

/* Every chunk's hash, and st (of dtype) fed every chunk in order: the chunks split over up
 * to threads threads for a large tensor, each thread's statistics a fork of st joined in
 * order (fi_stats_stream_join: the bits of one stream); the chunks of a fork whose join
 * cannot be shown exact go to st again, in order. part[0..n) (when st is set) gets the
 * new partials. The threads only read the store. -1 when out of memory. */
static int hash_all(fi_chunk_store *store, const chunk_at *c, size_t n, fi_chunk_hash *h,
                    fi_stats_stream **part, fi_stats_stream *st, fi_dtype dtype, int threads,
                    fi_stats *whole, int *whole_taken)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += c[i].len;
    uint64_t want = bytes / CAPTURE_MIN_BYTES;
    int nt = threads < 1 ? 1 : threads > CAPTURE_MAX_THREADS ? CAPTURE_MAX_THREADS : threads;
    nt = want < (uint64_t)nt ? (want < 1 ? 1 : (int)want) : nt;
    nt = (size_t)nt > n || (st && !fi_stats_stream_exact(st)) ? 1 : nt;
    hash_job job[CAPTURE_MAX_THREADS];
    pthread_t thread[CAPTURE_MAX_THREADS];
    int started[CAPTURE_MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++) {
        size_t first = n * (size_t)t / (size_t)nt, last = n * (size_t)(t + 1) / (size_t)nt;
        job[t] = (hash_job){.store = store,
                            .c = c + first,
                            .n = last - first,
                            .h = h + first,
                            .part = part + first,
                            .st = st,
                            .dtype = dtype,
                            .whole = n == 1 ? whole : NULL};
        if (st && t > 0 && !(job[t].st = fi_stats_stream_fork(st))) {
            while (--t > 0)
                fi_stats_stream_free(job[t].st);
            return -1;
        }
    }
    for (int t = 1; t < nt; t++)
        started[t] = pthread_create(&thread[t], NULL, hash_chunks, &job[t]) == 0;
    hash_chunks(&job[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(thread[t], NULL);
        else
            hash_chunks(&job[t]);
    }
    for (int t = 1; st && t < nt; t++) { /* each join frees the fork; st is unchanged by a
                                          * refused one, and then takes the chunks itself */
        if (fi_stats_stream_join(st, job[t].st) == 0)
            continue;
        job[t].reused = 0;
        for (size_t i = 0; i < job[t].n; i++)
            stats_of_chunk(&job[t], st, i);
    }
    *whole_taken = job[0].whole_taken;
    for (int t = 0; t < nt; t++) {
        fi_chunk_store_parts_added_count(store, job[t].reused);
        fi_chunk_store_hash_count(store, job[t].hashed, job[t].memo_hits);
    }
    return 0;
}

/* t describing s, with no chunks yet. -1 with an exception set. */
static int capture_head(const fi_saved_tensor *s, fi_compact_tensor *t)
{
    memset(t, 0, sizeof(*t));
    t->pages_kept = t->pages_total = t->pages_out_of_range = -1;
    t->key = malloc(s->key_len + 1);
    if (!t->key) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(t->key, s->key, s->key_len);
    t->key[s->key_len] = '\0';
    t->dtype = s->t.dtype;
    t->ndim = s->t.ndim;
    memcpy(t->shape, s->t.shape, sizeof t->shape);
    memcpy(t->stride, s->t.stride, sizeof t->stride);
    t->requires_grad = s->requires_grad;
    t->span_bytes = s->span_bytes;
    return 0;
}

int fi_compact_capture(fi_chunk_store *store, const fi_saved_tensor *s, fi_pack_sink *sink,
                       fi_stats_stream *st, int threads, fi_compact_tensor *t, fi_stats *whole)
{
    if (capture_head(s, t) < 0)
        return -1;
    size_t n = 0;
    chunk_at c_local[LOCAL_CHUNKS]; /* a small tensor's chunks: no allocations */
    fi_chunk_hash h_local[LOCAL_CHUNKS];
    fi_stats_stream *part_local[LOCAL_CHUNKS] = {NULL};
    chunk_at *c = list_chunks(s, &n, c_local);
    int local = c == c_local;
    fi_chunk_hash *h = local ? h_local : c ? malloc((n ? n : 1) * sizeof(*h)) : NULL;
    fi_stats_stream **part = local ? part_local : h ? calloc(n ? n : 1, sizeof(*part)) : NULL;
    int taken = 0;
    int r = part && hash_all(store, c, n, h, part, st, s->t.dtype, threads, whole, &taken) == 0
                ? 0
                : -1;
    for (size_t i = 0; r == 0 && i < n; i++)
        r = capture_chunk(store, c[i].p, c[i].len, c[i].offset, &h[i], &part[i], sink, t);
    for (size_t i = 0; part && i < n; i++)
        fi_stats_stream_free(part[i]); /* those no chunk kept */
    if (!local) {
        free(c);
        free(h);
        free(part);
    }
    if (r < 0) {
        fi_compact_tensor_clear(store, t);
        PyErr_NoMemory();
        return -1;
    }
    return taken;
}

/* The device path (docs/flight-recorder.md, "Chunk dedup on the device"): s's chunks hashed
 * where s lives; a chunk the store holds costs its hash and a reference, and only the
 * others (and those the sink's pack lacks, when the store keeps no bytes) are copied to the
 * host, in one batch, then captured as on the host. st is given for CPU tensors only (the
 * test device of csrc/core/device_chunks.c) and fed in order from their own memory. */
static int capture_on_device(fi_chunk_store *store, const fi_saved_tensor *s, fi_pack_sink *sink,
                             fi_stats_stream *st, fi_chunk_device *dev, fi_compact_tensor *t)
{
    if (capture_head(s, t) < 0)
        return -1;
    size_t n = 0, nbytes = 0, missing = 0;
    chunk_at *c = list_chunks(s, &n, NULL);
    size_t cells = n ? n : 1;
    int64_t *off = c ? malloc(4 * cells * sizeof(int64_t)) : NULL;
    fi_chunk_hash *h = off ? malloc(cells * sizeof(*h)) : NULL;
    fi_chunk **found = h ? calloc(cells, sizeof(*found)) : NULL;
    char *bytes = NULL;
    int r = found ? 0 : -1;
    if (r < 0)
        PyErr_NoMemory();
    int64_t *len = off ? off + cells : NULL, *moff = off ? off + 2 * cells : NULL,
            *mlen = off ? off + 3 * cells : NULL;
    for (size_t i = 0; r == 0 && i < n; i++) {
        off[i] = (int64_t)(c[i].p - (const char *)s->t.data);
        len[i] = (int64_t)c[i].len;
    }
    if (r == 0)
        r = dev->hash(dev, &s->t, off, len, (int64_t)n, fi_chunk_store_key(store), h);
    for (size_t i = 0; r == 0 && i < n; i++) {
        dev->hashed += c[i].len;
        fi_chunk *f = fi_chunk_find(store, c[i].len, &h[i]);
        if (f && (!sink || sink->fd < 0 || sink->err || f->pack == sink->index)) {
            found[i] = f;
            continue;
        }
        if (f)
            fi_chunk_release(store, f);
        moff[missing] = off[i];
        mlen[missing++] = len[i];
        nbytes += c[i].len;
    }
    if (r == 0 && missing && !(bytes = malloc(nbytes))) {
        PyErr_NoMemory();
        r = -1;
    }
    if (r == 0 && missing)
        r = dev->copy(dev, &s->t, moff, mlen, (int64_t)missing, bytes);
    if (r == 0)
        dev->copied += nbytes;
    const char *next = bytes;
    for (size_t i = 0; r == 0 && i < n; i++) {
        if (found[i]) {
            if (add_ref(t, c[i].offset, found[i]) < 0) {
                r = -1;
                break;
            }
            found[i] = NULL; /* t holds it now */
            continue;
        }
        r = capture_chunk(store, next, c[i].len, c[i].offset, &h[i], NULL, sink, t);
        next += c[i].len;
    }
    for (size_t i = 0; r == 0 && st && i < n; i++) /* a CPU tensor's own memory */
        fi_stats_stream_feed(st, c[i].p, c[i].len);
    int oom = r < 0 && !PyErr_Occurred();
    for (size_t i = 0; found && i < n; i++)
        if (found[i])
            fi_chunk_release(store, found[i]);
    free(found);
    free(h);
    free(off);
    free(bytes);
    free(c);
    if (r < 0) {
        fi_compact_tensor_clear(store, t);
        if (oom)
            PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void fi_compact_tensor_clear(fi_chunk_store *store, fi_compact_tensor *t)
{
    for (size_t i = 0; i < t->nref; i++)
        fi_chunk_release(store, t->ref[i].chunk);
    free(t->ref);
    free(t->key);
    memset(t, 0, sizeof(*t));
    t->pages_kept = t->pages_total = t->pages_out_of_range = -1;
}

/* ---------------------------------------------------------------- manifest */

int fi_compact_manifest_head(fi_buf *b, const char *pack_name)
{
    fi_buf_puts(b, "{\"format\": \"" FI_COMPACT_FORMAT "\", \"version\": " FI_COMPACT_VERSION
                   ", \"packs\": [");
    fi_json_str(b, pack_name, strlen(pack_name));
    fi_buf_puts(b, "], ");
    return b->oom ? -1 : 0;
}

static void put_ints(fi_buf *b, const int64_t *v, int n)
{
    fi_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        if (i)
            fi_buf_puts(b, ", ");
        fi_buf_put_i64(b, v[i]);
    }
    fi_buf_putc(b, ']');
}

int fi_compact_manifest_tail(fi_buf *b, const fi_compact_tensor *ts, size_t n)
{
    fi_buf_puts(b, "\"tensors\": {");
    for (size_t i = 0; i < n; i++) {
        const fi_compact_tensor *t = &ts[i];
        if (i)
            fi_buf_puts(b, ", ");
        fi_json_str(b, t->key, strlen(t->key));
        fi_buf_puts(b, ": {\"dtype\": \"torch.");
        fi_buf_puts(b, fi_dtype_name(t->dtype));
        fi_buf_puts(b, "\", \"shape\": ");
        put_ints(b, t->shape, t->ndim);
        fi_buf_puts(b, ", \"stride\": ");
        put_ints(b, t->stride, t->ndim);
        fi_buf_puts(b,
                    t->requires_grad ? ", \"requires_grad\": true" : ", \"requires_grad\": false");
        fi_buf_puts(b, ", \"span_bytes\": ");
        fi_buf_put_u64(b, t->span_bytes);
        if (t->pages_total >= 0) {
            fi_buf_puts(b, ", \"pages\": {\"kept\": ");
            fi_buf_put_i64(b, t->pages_kept);
            fi_buf_puts(b, ", \"total\": ");
            fi_buf_put_i64(b, t->pages_total);
            fi_buf_puts(b, ", \"out_of_range\": ");
            fi_buf_put_i64(b, t->pages_out_of_range);
            fi_buf_putc(b, '}');
        }
        fi_buf_puts(b, ", \"chunks\": [");
        for (size_t k = 0; k < t->nref; k++) {
            fi_buf_puts(b, k ? ", [" : "[");
            fi_buf_put_u64(b, t->ref[k].offset);
            fi_buf_puts(b, ", ");
            fi_buf_put_u64(b, t->ref[k].chunk->len);
            fi_buf_puts(b, ", 0, ");
            fi_buf_put_u64(b, t->ref[k].chunk->id);
            fi_buf_putc(b, ']');
        }
        fi_buf_puts(b, "]}");
    }
    fi_buf_puts(b, "}}\n");
    return b->oom ? -1 : 0;
}

/* ------------------------------------------------------------------ writer */

struct fi_compact_writer {
    fi_chunk_store *store;
    char *dir; /* ROOT/chunks */
    char pack_name[64];
    int fd;
    int64_t pack_index;
};

fi_compact_writer *fi_compact_writer_new(const char *root)
{
    fi_compact_writer *w = calloc(1, sizeof(*w));
    size_t n = strlen(root) + sizeof "/" FI_COMPACT_CHUNKS_DIR;
    if (!w || !(w->dir = malloc(n)) || !(w->store = fi_chunk_store_new(0))) {
        fi_compact_writer_free(w);
        return NULL;
    }
    snprintf(w->dir, n, "%s/" FI_COMPACT_CHUNKS_DIR, root);
    w->fd = -1;
    return w;
}

void fi_compact_writer_free(fi_compact_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    fi_chunk_store_free(w->store);
    free(w->dir);
    free(w);
}

/* The pack, opened (and the chunks folder made) when first needed, or anew when its file
 * was deleted: the chunks it held are then written again into the new one. */
static int open_writer_pack(fi_compact_writer *w)
{
    struct stat st;
    if (w->fd >= 0 && fstat(w->fd, &st) == 0 && st.st_nlink > 0)
        return 0;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        w->pack_index++;
    }
    if (mkdir(w->dir, 0700) < 0 && errno != EEXIST) {
        PyErr_Format(PyExc_OSError, "cannot create %s: %s", w->dir, strerror(errno));
        return -1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(w->pack_name, sizeof w->pack_name, "%ld-%lld%09ld." FI_COMPACT_PACK_EXT,
             (long)getpid(), (long long)now.tv_sec, (long)now.tv_nsec);
    size_t n = strlen(w->dir) + sizeof w->pack_name + 2;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/%s", w->dir, w->pack_name);
    w->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (w->fd < 0)
        PyErr_Format(PyExc_OSError, "cannot create %s: %s", path, strerror(errno));
    free(path);
    return w->fd < 0 ? -1 : 0;
}

/* dir/name of path written whole: as path.tmp, then renamed. */
static int write_file_whole(const char *path, const fi_buf *b)
{
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    if (!tmp) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(tmp, n, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int r = fd < 0 ? -1 : 0;
    for (size_t at = 0; r == 0 && at < b->len;) {
        ssize_t k = write(fd, b->data + at, b->len - at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            r = -1;
        else
            at += (size_t)k;
    }
    if (fd >= 0 && close(fd) < 0)
        r = -1;
    if (r == 0 && rename(tmp, path) < 0)
        r = -1;
    if (r < 0) {
        PyErr_Format(PyExc_OSError, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return r;
}

/* The statistics stream of a tensor whose statistics are asked for: a CPU tensor saved as
 * itself whose kept parts (or whole span) are its elements; NULL otherwise. */
static fi_stats_stream *stats_stream_for(PyObject *dict, const fi_saved_tensor *s)
{
    if (PyDict_GetItem(dict, s->key_obj) != s->obj || s->t.device_type != FI_DEVICE_CPU ||
        (s->keep && s->keep->packed) || s->span_bytes != s->nbytes || s->itemsize == 0)
        return NULL;
    int64_t numel = s->keep ? fi_kept_elements(s, s->nbytes) : (int64_t)(s->nbytes / s->itemsize);
    return numel >= 0 ? fi_stats_stream_new(s->t.dtype, numel) : NULL;
}

int fi_compact_capture_dict(fi_chunk_store *store, PyObject *dict, const fi_save_opts *opts,
                            fi_pack_sink *sink, fi_compact_tensor **out, size_t *count)
{
    fi_saved_tensor *ts;
    size_t n;
    *out = NULL;
    *count = 0;
    if (fi_tensors_collect(dict, &ts, &n, opts->keep, opts->keep_ctx, opts->device, opts->seen) < 0)
        return -1;
    fi_compact_tensor *ct = calloc(n ? n : 1, sizeof(*ct));
    fi_stats *stats = calloc(n ? n : 1, sizeof(*stats));
    size_t done = 0;
    int r = ct && stats ? 0 : -1;
    if (r < 0)
        PyErr_NoMemory();
    for (; r == 0 && done < n; done++) {
        fi_saved_tensor *s = &ts[done];
        fi_stats_stream *st = opts->sink ? stats_stream_for(dict, s) : NULL;
        fi_chunk_device *dev = opts->device;
        /* a tensor of one chunk: statistics kept with the chunk (fi_chunk.whole) */
        int one = st && !s->keep && s->nbytes <= FI_CHUNK_MAX;
        r = dev && dev->takes(dev, s->t.device_type) && !(s->keep && s->keep->packed)
                ? capture_on_device(store, s, sink, st, dev, &ct[done])
                : fi_compact_capture(store, s, sink, st, opts->threads, &ct[done],
                                     one ? &stats[done] : NULL);
        if (r == 1) {
            fi_stats_stream_free(st);
            r = 0;
        } else if (st) {
            fi_stats_stream_end(st, &stats[done]);
            if (r == 0 && one && ct[done].nref == 1)
                fi_chunk_keep_stats(ct[done].ref[0].chunk, s->t.dtype, &stats[done]);
        }
        if (r == 0 && s->keep && s->keep->pages_total >= 0) {
            ct[done].pages_kept = (int64_t)s->keep->n;
            ct[done].pages_total = s->keep->pages_total;
            ct[done].pages_out_of_range = s->keep->pages_out_of_range;
        }
    }
    for (size_t i = 0; r == 0 && opts->sink && i < n; i++)
        if (stats[i].kind != FI_STATS_NONE)
            opts->sink(opts->sink_ctx, ts[i].obj, &stats[i]);
    free(stats);
    fi_tensors_release(ts, n);
    if (r < 0) {
        for (size_t i = 0; ct && i + 1 < done; i++) /* the failed one cleared itself */
            fi_compact_tensor_clear(store, &ct[i]);
        free(ct);
        return -1;
    }
    *out = ct;
    *count = n;
    return 0;
}

void fi_compact_tensors_free(fi_chunk_store *store, fi_compact_tensor *ct, size_t n)
{
    for (size_t i = 0; ct && i < n; i++)
        fi_compact_tensor_clear(store, &ct[i]);
    free(ct);
}

Py_ssize_t fi_compact_save(fi_compact_writer *w, const char *path, PyObject *dict,
                           const fi_save_opts *opts)
{
    fi_compact_tensor *ct;
    size_t n;
    fi_pack_sink ps = {w->fd, w->pack_index, 0, 0};
    if (open_writer_pack(w) < 0)
        return -1;
    ps.fd = w->fd;
    ps.index = w->pack_index;
    if (fi_compact_capture_dict(w->store, dict, opts, &ps, &ct, &n) < 0)
        return -1;
    Py_ssize_t written = -1;
    fi_buf b;
    fi_buf_init(&b);
    if (ps.err) {
        PyErr_Format(PyExc_OSError, "cannot write %s/%s: %s", w->dir, w->pack_name,
                     strerror(ps.err));
    } else if (fi_compact_manifest_head(&b, w->pack_name) < 0 ||
               fi_compact_manifest_tail(&b, ct, n) < 0) {
        PyErr_NoMemory();
    } else if (write_file_whole(path, &b) == 0) {
        written = (Py_ssize_t)(ps.written + b.len);
    }
    fi_buf_free(&b);
    /* the pack keeps one reference to each chunk written to it, so that the store knows it
     * for the rest of the process; the call's own go (all of them when the save failed) */
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < ct[i].nref; k++)
            if (written < 0 || ct[i].ref[k].chunk->refs > 1)
                fi_chunk_release(w->store, ct[i].ref[k].chunk);
        ct[i].nref = 0;
    }
    fi_compact_tensors_free(w->store, ct, n);
    return written;
}

/* ------------------------------------------------------------------ reader */

/* A pack mapped for reading, its records indexed by id. */
typedef struct {
    uint8_t *map;
    size_t size;
    struct rec {
        uint64_t id, offset;
        uint32_t len;
    } *rec;
    size_t nrec;
} pack_view;

static int bad(const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg)
        PyErr_Format(PyExc_ValueError, "%s: not a valid chunk manifest: %U", path, msg);
    Py_XDECREF(msg);
    return -1;
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int cmp_rec(const void *a, const void *b)
{
    uint64_t x = ((const struct rec *)a)->id, y = ((const struct rec *)b)->id;
    return (x > y) - (x < y);
}

/* A pack name: letters, digits, '.', '_', '-', not starting with '.', ending in ".pack". */
static int pack_name_ok(const char *s)
{
    static const char suffix[] = "." FI_COMPACT_PACK_EXT;
    size_t n = strlen(s), k = sizeof suffix - 1;
    if (n <= k || n > 200 || s[0] == '.' || strcmp(s + n - k, suffix) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Maps dir/name and indexes its records; a record cut short at the end (a write-out that
 * was killed) ends the pack. */
static int open_pack(const char *manifest, const char *dir, const char *name, pack_view *pv)
{
    memset(pv, 0, sizeof(*pv));
    if (!pack_name_ok(name))
        return bad(manifest, "pack name %s is not a file name of the chunks folder", name);
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(path, n, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat st;
    int r = -1;
    if (fd < 0 || fstat(fd, &st) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: pack %s: %s", manifest, path,
                     errno == ELOOP ? "is a symbolic link; links inside a dump are not followed"
                                    : strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        PyErr_Format(PyExc_ValueError, "%s: pack %s is not a regular file", manifest, path);
        goto done;
    }
    pv->size = (size_t)st.st_size;
    if (pv->size > 0) {
        pv->map = mmap(NULL, pv->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (pv->map == MAP_FAILED) {
            pv->map = NULL;
            PyErr_Format(PyExc_ValueError, "%s: pack %s: %s", manifest, path, strerror(errno));
            goto done;
        }
    }
    size_t cap = 0;
    for (size_t at = 0; at + FI_PACK_HEADER <= pv->size;) {
        const uint8_t *h = pv->map + at;
        uint32_t len = (uint32_t)get_le(h + 4, 4);
        if (memcmp(h, "FIck", 4) != 0 || len > FI_CHUNK_MAX || len > pv->size - at - FI_PACK_HEADER)
            break;
        if (pv->nrec == cap) {
            cap = cap ? 2 * cap : 256;
            struct rec *nr = realloc(pv->rec, cap * sizeof(*nr));
            if (!nr) {
                PyErr_NoMemory();
                goto done;
            }
            pv->rec = nr;
        }
        pv->rec[pv->nrec++] = (struct rec){get_le(h + 8, 8), at + FI_PACK_HEADER, len};
        at += FI_PACK_HEADER + len;
    }
    if (pv->nrec > 1)
        qsort(pv->rec, pv->nrec, sizeof(struct rec), cmp_rec);
    r = 0;
done:
    if (fd >= 0)
        close(fd);
    free(path);
    return r;
}

static void close_pack(pack_view *pv)
{
    if (pv->map)
        munmap(pv->map, pv->size);
    free(pv->rec);
    memset(pv, 0, sizeof(*pv));
}

static const struct rec *find_rec(const pack_view *pv, uint64_t id)
{
    struct rec key = {id, 0, 0};
    return pv->nrec ? bsearch(&key, pv->rec, pv->nrec, sizeof(struct rec), cmp_rec) : NULL;
}

/* The bytes of a regular file of at most limit bytes, as a Python bytes object. */
static PyObject *read_small_file(const char *path, size_t limit)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        if (errno == ELOOP)
            PyErr_Format(PyExc_ValueError,
                         "%s: is a symbolic link; links inside a dump are not followed", path);
        else
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size > limit) {
        close(fd);
        return PyErr_Format(PyExc_ValueError, "%s: %s", path,
                            S_ISREG(st.st_mode) ? "larger than 64 MiB" : "not a regular file");
    }
    PyObject *b = PyBytes_FromStringAndSize(NULL, st.st_size);
    char *p = b ? PyBytes_AS_STRING(b) : NULL;
    size_t got = 0;
    while (b && got < (size_t)st.st_size) {
        ssize_t k = read(fd, p + got, (size_t)st.st_size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            Py_CLEAR(b);
            PyErr_Format(PyExc_ValueError, "%s: cannot read: %s", path,
                         k < 0 ? strerror(errno) : "file shrank");
            break;
        }
        got += (size_t)k;
    }
    close(fd);
    return b;
}

static fi_dtype dtype_named(const char *s)
{
    if (strncmp(s, "torch.", 6) != 0)
        return FI_DTYPE_UNKNOWN;
    for (int d = 1; d < FI_DTYPE_COUNT; d++)
        if (strcmp(s + 6, fi_dtype_name((fi_dtype)d)) == 0)
            return (fi_dtype)d;
    return FI_DTYPE_UNKNOWN;
}

/* A JSON int within [lo, hi]. */
static int get_int(PyObject *v, long long lo, long long hi, long long *out)
{
    if (!PyLong_CheckExact(v))
        return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || x < lo || x > hi)
        return -1;
    *out = x;
    return 0;
}

static int int_list(PyObject *v, int64_t *dst, int *n)
{
    if (!PyList_Check(v) || PyList_GET_SIZE(v) > FI_MAX_DIMS)
        return -1;
    *n = (int)PyList_GET_SIZE(v);
    for (int i = 0; i < *n; i++) {
        long long x;
        if (get_int(PyList_GET_ITEM(v, i), 0, INT64_MAX, &x) < 0)
            return -1;
        dst[i] = x;
    }
    return 0;
}

/* One tensor of the manifest, rebuilt: zeros where no chunk lies. ranges (may be NULL)
 * gets the (start, end) of each chunk. */
static PyObject *load_tensor(const char *path, PyObject *key, PyObject *desc,
                             const pack_view *packs, size_t npacks, PyObject *ranges)
{
    if (!PyDict_Check(desc))
        return bad(path, "tensor %R is not an object", key), NULL;
    fi_loaded_tensor lt;
    memset(&lt, 0, sizeof lt);
    lt.key = key;
    PyObject *dt = PyDict_GetItemString(desc, "dtype");
    PyObject *shape = PyDict_GetItemString(desc, "shape");
    PyObject *stride = PyDict_GetItemString(desc, "stride");
    PyObject *rg = PyDict_GetItemString(desc, "requires_grad");
    PyObject *span = PyDict_GetItemString(desc, "span_bytes");
    PyObject *chunks = PyDict_GetItemString(desc, "chunks");
    int nstride = -1;
    long long span_bytes;
    if (!dt || !PyUnicode_Check(dt) || !PyUnicode_AsUTF8(dt) ||
        (lt.dtype = dtype_named(PyUnicode_AsUTF8(dt))) == FI_DTYPE_UNKNOWN)
        return bad(path, "tensor %R: dtype missing or unknown", key), NULL;
    if (!fi_dtype_to_py(lt.dtype))
        return bad(path, "tensor %R: dtype %s is not in this torch", key, fi_dtype_name(lt.dtype)),
               NULL;
    if (!shape || int_list(shape, lt.shape, &lt.ndim) < 0 || !stride ||
        int_list(stride, lt.stride, &nstride) < 0 || nstride != lt.ndim)
        return bad(path, "tensor %R: shape and stride must be lists of as many ints", key), NULL;
    if (!rg || !PyBool_Check(rg) || !span || get_int(span, 0, (long long)SPAN_MAX, &span_bytes) < 0)
        return bad(path, "tensor %R: requires_grad or span_bytes missing or out of range", key),
               NULL;
    lt.requires_grad = rg == Py_True;
    uint64_t nbytes, elems;
    if (fi_view_bytes(path, key, lt.dtype, lt.ndim, lt.shape, lt.stride, &nbytes, &elems) < 0)
        return NULL;
    if (elems * fi_dtype_size(lt.dtype) > (uint64_t)span_bytes)
        return bad(path, "tensor %R: its view spans more than span_bytes", key), NULL;
    if (!chunks || !PyList_Check(chunks))
        return bad(path, "tensor %R: chunks must be a list", key), NULL;
    char *data;
    PyObject *buf = fi_zeros_bytes((uint64_t)span_bytes, &data);
    if (!buf) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError) ||
            PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            PyErr_Clear();
            bad(path, "tensor %R: cannot allocate its %lld bytes", key, span_bytes);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks); i++) {
        PyObject *c = PyList_GET_ITEM(chunks, i);
        long long off, len, pack, id;
        if (!PyList_Check(c) || PyList_GET_SIZE(c) != 4 ||
            get_int(PyList_GET_ITEM(c, 0), 0, span_bytes, &off) < 0 ||
            get_int(PyList_GET_ITEM(c, 1), 0, (long long)FI_CHUNK_MAX, &len) < 0 ||
            get_int(PyList_GET_ITEM(c, 2), 0, (long long)npacks - 1, &pack) < 0 ||
            get_int(PyList_GET_ITEM(c, 3), 0, INT64_MAX, &id) < 0 || len > span_bytes - off) {
            Py_DECREF(buf);
            return bad(path,
                       "tensor %R: chunk %zd is not [offset, length, pack, id] within the span",
                       key, i),
                   NULL;
        }
        const struct rec *r = find_rec(&packs[pack], (uint64_t)id);
        if (!r || r->len != (uint32_t)len) {
            Py_DECREF(buf);
            return bad(path, "tensor %R: chunk %lld of %lld bytes is not in its pack", key, id,
                       len),
                   NULL;
        }
        memcpy(data + off, packs[pack].map + r->offset, (size_t)len);
        if (ranges) {
            PyObject *pair = Py_BuildValue("(LL)", off, off + len);
            PyObject *list = PyDict_GetItem(ranges, key);
            if (!pair || !list || PyList_Append(list, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(buf);
                return NULL;
            }
            Py_DECREF(pair);
        }
    }
    lt.data_nbytes = (uint64_t)span_bytes;
    return fi_tensor_over_bytes(buf, &lt);
}

/* The chunks folder beside the manifest's call directory: CALL/../chunks. */
static char *chunks_dir(const char *manifest)
{
    const char *slash = strrchr(manifest, '/');
    size_t dl = slash ? (size_t)(slash - manifest) : 1;
    static const char up[] = "/../" FI_COMPACT_CHUNKS_DIR;
    char *dir = malloc(dl + sizeof up);
    if (!dir)
        return NULL;
    if (slash)
        memcpy(dir, manifest, dl);
    else
        dir[0] = '.';
    memcpy(dir + dl, up, sizeof up);
    return dir;
}

static PyObject *load_manifest(const char *path, int want_ranges)
{
    PyObject *bytes = read_small_file(path, MANIFEST_MAX);
    if (!bytes)
        return NULL;
    PyObject *doc = fi_json_parse(PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes), path);
    Py_DECREF(bytes);
    if (!doc)
        return NULL;
    PyObject *result = NULL, *ranges = NULL;
    pack_view *packs = NULL;
    size_t npacks = 0;
    char *dir = NULL;
    PyObject *fmt = PyDict_Check(doc) ? PyDict_GetItemString(doc, "format") : NULL;
    PyObject *ver = fmt ? PyDict_GetItemString(doc, "version") : NULL;
    PyObject *names = fmt ? PyDict_GetItemString(doc, "packs") : NULL;
    PyObject *tensors = fmt ? PyDict_GetItemString(doc, "tensors") : NULL;
    long long version;
    if (!fmt || !PyUnicode_Check(fmt) || PyUnicode_CompareWithASCIIString(fmt, FI_COMPACT_FORMAT)) {
        bad(path, "format is not \"" FI_COMPACT_FORMAT "\"");
        goto done;
    }
    if (!ver || get_int(ver, atoi(FI_COMPACT_VERSION), atoi(FI_COMPACT_VERSION), &version) < 0) {
        bad(path, "version is not " FI_COMPACT_VERSION);
        goto done;
    }
    if (!names || !PyList_Check(names) || PyList_GET_SIZE(names) > PACKS_MAX || !tensors ||
        !PyDict_Check(tensors)) {
        bad(path, "packs must be a list of names and tensors an object");
        goto done;
    }
    dir = chunks_dir(path);
    packs = calloc((size_t)PyList_GET_SIZE(names) + 1, sizeof(*packs));
    if (!dir || !packs) {
        PyErr_NoMemory();
        goto done;
    }
    for (; npacks < (size_t)PyList_GET_SIZE(names); npacks++) {
        PyObject *nm = PyList_GET_ITEM(names, (Py_ssize_t)npacks);
        const char *s = PyUnicode_Check(nm) ? PyUnicode_AsUTF8(nm) : NULL;
        if (!s) {
            PyErr_Clear();
            bad(path, "pack names must be strings");
            goto done;
        }
        if (open_pack(path, dir, s, &packs[npacks]) < 0)
            goto done;
    }
    result = PyDict_New();
    ranges = want_ranges ? PyDict_New() : NULL;
    if (!result || (want_ranges && !ranges))
        goto fail;
    PyObject *key, *desc;
    Py_ssize_t pos = 0;
    while (PyDict_Next(tensors, &pos, &key, &desc)) {
        if (ranges) {
            PyObject *l = PyList_New(0);
            if (!l || PyDict_SetItem(ranges, key, l) < 0) {
                Py_XDECREF(l);
                goto fail;
            }
            Py_DECREF(l);
        }
        PyObject *t = load_tensor(path, key, desc, packs, npacks, ranges);
        if (!t || PyDict_SetItem(result, key, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
    }
    if (ranges) {
        PyObject *pair = PyTuple_Pack(2, result, ranges);
        Py_SETREF(result, pair);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_XDECREF(ranges);
    for (size_t i = 0; packs && i < npacks; i++)
        close_pack(&packs[i]);
    free(packs);
    free(dir);
    Py_DECREF(doc);
    return result;
}

PyDoc_STRVAR(
    load_chunks_doc,
    "load_chunks(path, ranges=False) -> dict[str, Tensor]\n\n"
    "Read a compact-layout manifest (CALL/inputs.chunks.json) and the packs it names in\n"
    "CALL/../chunks into tensors of the recorded shape, stride and dtype; bytes no chunk\n"
    "holds (pages the call did not read) are zeros. With ranges=True returns (tensors,\n"
    "{key: [(start, end), ...]}), the byte ranges of each tensor's span that chunks hold.");

static PyObject *load_chunks(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"path", "ranges", NULL};
    PyObject *path = NULL;
    int want_ranges = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|p:load_chunks", kwlist,
                                     PyUnicode_FSConverter, &path, &want_ranges))
        return NULL;
    PyObject *r = load_manifest(PyBytes_AS_STRING(path), want_ranges);
    Py_DECREF(path);
    return r;
}

PyDoc_STRVAR(chunk_hash_doc,
             "_chunk_hash(data, key, repeat=1) -> bytes\n\n"
             "The 32-byte chunk hash (four little-endian uint64) of data (at most 64 KiB) under\n"
             "key (bytes of FI_CHUNK_KEY_WORDS little-endian uint32), computed repeat times (a\n"
             "benchmark hook); the path FLASHINFER_CPU_ISA allows.");

static PyObject *chunk_hash_py(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer data, key;
    long repeat = 1;
    if (!PyArg_ParseTuple(args, "y*y*|l:_chunk_hash", &data, &key, &repeat))
        return NULL;
    PyObject *r = NULL;
    if ((size_t)data.len > FI_CHUNK_MAX || (size_t)key.len != FI_CHUNK_KEY_WORDS * 4) {
        PyErr_Format(PyExc_ValueError, "_chunk_hash: data of at most %zu bytes and a key of %zu",
                     (size_t)FI_CHUNK_MAX, (size_t)FI_CHUNK_KEY_WORDS * 4);
    } else {
        uint32_t *k = malloc(FI_CHUNK_KEY_WORDS * 4);
        if (!k) {
            PyErr_NoMemory();
        } else {
            memcpy(k, key.buf, FI_CHUNK_KEY_WORDS * 4);
            fi_chunk_hash h = {{0}};
            Py_BEGIN_ALLOW_THREADS
            for (long i = 0; i < repeat; i++)
                fi_chunk_hash_cpu(data.buf, (size_t)data.len, k, &h);
            Py_END_ALLOW_THREADS
            uint8_t out[32];
            for (int w = 0; w < 4; w++)
                for (int b = 0; b < 8; b++)
                    out[8 * w + b] = (uint8_t)(h.h[w] >> (8 * b));
            r = PyBytes_FromStringAndSize((const char *)out, 32);
            free(k);
        }
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&key);
    return r;
}

static PyMethodDef compact_methods[] = {
    {"_chunk_hash", chunk_hash_py, METH_VARARGS, chunk_hash_doc},
    {"load_chunks", (PyCFunction)(void (*)(void))load_chunks, METH_VARARGS | METH_KEYWORDS,
     load_chunks_doc},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------ CompactWriter type */

typedef struct {
    PyObject_HEAD
    fi_compact_writer *w;
} writer_object;

static PyObject *writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"root", NULL};
    PyObject *root = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&:CompactWriter", kwlist,
                                     PyUnicode_FSConverter, &root))
        return NULL;
    writer_object *self = (writer_object *)type->tp_alloc(type, 0);
    if (self && !(self->w = fi_compact_writer_new(PyBytes_AS_STRING(root)))) {
        Py_CLEAR(self);
        PyErr_NoMemory();
    }
    Py_DECREF(root);
    return (PyObject *)self;
}

static void writer_dealloc(writer_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    fi_compact_writer_free(self->w);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* A statistics sink for tests: stats[tensor] = (min, max, mean, nan_count, inf_count). */
static void stats_into_dict(void *ctx, PyObject *tensor, const fi_stats *st)
{
    PyObject *v = Py_BuildValue("(dddLL)", st->min, st->max, st->mean, (long long)st->nan_count,
                                (long long)st->inf_count);
    if (!v || PyDict_SetItem(ctx, tensor, v) < 0)
        PyErr_Clear();
    Py_XDECREF(v);
}

PyDoc_STRVAR(writer_save_doc,
             "save(path, tensors, keep=None, threads=1, stats=None) -> int\n\n"
             "Write tensors (a dict) as the compact manifest at path (CALL/inputs.chunks.json)\n"
             "and their chunks new to this writer to its pack in CALL/../chunks; keep as for\n"
             "save_tensors; a large tensor's chunks are hashed on up to threads threads (the\n"
             "same files). With a dict stats, the statistics the capture takes of each float\n"
             "CPU tensor go to stats[tensor] as (min, max, mean, nan_count, inf_count) (tests).\n"
             "Returns the bytes written (new chunks and manifest).");

static PyObject *writer_save(writer_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "tensors", "keep", "threads", "stats", NULL};
    PyObject *path = NULL, *dict, *keep = NULL, *stats = Py_None;
    int threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O!|OiO:save", kwlist, PyUnicode_FSConverter,
                                     &path, &PyDict_Type, &dict, &keep, &threads, &stats))
        return NULL;
    if (stats != Py_None && !PyDict_Check(stats)) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_TypeError, "save: stats must be a dict or None");
        return NULL;
    }
    fi_keep_map m;
    Py_ssize_t n = -1;
    fi_save_opts opts = {stats == Py_None ? NULL : stats_into_dict,
                         stats,
                         fi_keep_map_find,
                         &m,
                         threads,
                         NULL,
                         NULL};
    if (fi_keep_map_parse(keep, dict, &m) == 0)
        n = fi_compact_save(self->w, PyBytes_AS_STRING(path), dict, &opts);
    fi_keep_map_free(&m);
    Py_DECREF(path);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *writer_unique_bytes(writer_object *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(fi_chunk_store_bytes(self->w->store));
}

static PyObject *writer_chunks(writer_object *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(fi_chunk_store_count(self->w->store));
}

static PyObject *writer_partials_added(writer_object *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(fi_chunk_store_parts_added(self->w->store));
}

static PyMethodDef writer_methods[] = {
    {"save", (PyCFunction)(void (*)(void))writer_save, METH_VARARGS | METH_KEYWORDS,
     writer_save_doc},
    {"unique_bytes", (PyCFunction)writer_unique_bytes, METH_NOARGS,
     "unique_bytes() -> int\n\nBytes of the distinct chunks written so far."},
    {"chunks", (PyCFunction)writer_chunks, METH_NOARGS,
     "chunks() -> int\n\nThe number of distinct chunks written so far."},
    {"_partials_added", (PyCFunction)writer_partials_added, METH_NOARGS,
     "_partials_added() -> int\n\nChunks whose statistics came from the partial kept with\n"
     "them instead of their bytes, so far (tests)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot writer_slots[] = {
    {Py_tp_new, writer_new},
    {Py_tp_dealloc, writer_dealloc},
    {Py_tp_methods, writer_methods},
    {Py_tp_doc, "CompactWriter(root)\n--\n\nThe compact layout's writer for dump root ROOT: "
                "each distinct chunk goes once to ROOT/chunks/PID-NS.pack."},
    {0, NULL},
};

static PyType_Spec writer_spec = {
    "flashinfer_native._C.CompactWriter",
    sizeof(writer_object),
    0,
    Py_TPFLAGS_DEFAULT,
    writer_slots,
};

int fi_compact_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, compact_methods) < 0)
        return -1;
    PyObject *type = PyType_FromSpec(&writer_spec);
    if (!type)
        return -1;
    int r = PyModule_AddObjectRef(module, "CompactWriter", type);
    Py_DECREF(type);
    return r;
}
