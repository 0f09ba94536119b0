/* crash_writer.c: the in-memory ring written out as dump directories. Everything here runs
 * inside signal handlers too: it only reads memory prepared at call time and uses
 * open/write/fsync/rename/mkdir/unlink/rmdir/close (async-signal-safe per POSIX) and
 * memcpy/strlen (async-signal-safe since POSIX.1-2016). No malloc, no stdio, no locks but
 * the ring's own writer flag: paths are built in stack buffers. */
#include "crash_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "compact.h"
#include "dump_format.h"
#include "ptzip.h"

/* ---------------------------------------------------------- one writer at a time */

long fi_crash_tid(void) { return (long)syscall(SYS_gettid); }

int fi_ring_writer_try(fi_ring *r)
{
    long me = fi_crash_tid(), none = 0;
    if (atomic_compare_exchange_strong(&r->writer, &none, me))
        return 1;
    return none == me ? -1 : 0;
}

void fi_ring_writer_release(fi_ring *r) { atomic_store(&r->writer, 0); }

/* --------------------------------------------------------------------- paths */

/* dst = a + b + c, NUL-terminated; -1 (ENAMETOOLONG) when it does not fit PATH_MAX. */
static int join3(char *dst, const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    if (la + lb + lc + 1 > PATH_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(dst, a, la);
    memcpy(dst + la, b, lb);
    memcpy(dst + la + lb, c, lc + 1);
    return 0;
}

/* The last component of path. */
static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* A call directory's temporary name while its files are written: a hidden sibling, which
 * readers skip (flashinfer_native/dumpdir.py), renamed to dir once whole. */
static int partial_name(char *dst, const fi_ring *r, const char *dir)
{
    return join3(dst, r->root, "/.", base_name(dir)) < 0 ? -1 : join3(dst, dst, ".partial", "");
}

static int write_all_raw(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0)
            errno = ENOSPC;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* dir/name holding head then tail, whole or not at all: written to dir/name.tmp, fsync'd,
 * renamed into place. On failure errno is that of the failing step. */
static int write_whole2(const fi_ring *ring, const char *dir, const char *name, const char *head,
                        size_t head_len, const char *tail, size_t tail_len)
{
    char *path = ring->scratch->file, *tmp = ring->scratch->file_tmp;
    if (join3(path, dir, "/", name) < 0 || join3(tmp, path, ".tmp", "") < 0)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int r = write_all_raw(fd, head, head_len) < 0 || write_all_raw(fd, tail, tail_len) < 0 ||
                    fsync(fd) < 0
                ? -1
                : 0;
    int err = errno;
    if (close(fd) < 0 && r == 0) {
        r = -1;
        err = errno;
    }
    if (r == 0 && rename(tmp, path) < 0) {
        r = -1;
        err = errno;
    }
    if (r < 0) {
        unlink(tmp);
        errno = err;
    }
    return r;
}

static int write_whole(const fi_ring *r, const char *dir, const char *name, const char *data,
                       size_t len)
{
    return write_whole2(r, dir, name, data, len, "", 0);
}

/* mkdir -p, on a copy of path in r's scratch. */
static int make_dirs(const fi_ring *r, const char *path)
{
    char *p = r->scratch->dirs;
    if (join3(p, path, "", "") < 0)
        return -1;
    for (char *c = p + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = '\0';
        if (mkdir(p, 0700) < 0 && errno != EEXIST)
            return -1;
        *c = '/';
    }
    return mkdir(p, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

/* Removes what a write of a call may leave in dir (its files and their .tmp names), then
 * dir itself; errno is kept. */
static void remove_partial(const fi_ring *r, const char *dir)
{
    int err = errno;
    static const char *const stems[] = {FI_DUMP_INPUTS ".", FI_DUMP_OUTPUTS "."};
    static const char *const names[] = {FI_DUMP_METADATA_FILE,
                                        FI_DUMP_INPUTS "." FI_DUMP_EXT_CHUNKS,
                                        FI_DUMP_OUTPUTS "." FI_DUMP_EXT_CHUNKS};
    char name[64], *path = r->scratch->removed;
    for (int i = 0; i < 5; i++) {
        if (i < 2 ? join3(name, stems[i], r->ext, "") < 0 : join3(name, names[i - 2], "", "") < 0)
            continue;
        if (join3(path, dir, "/", name) < 0)
            continue;
        unlink(path);
        if (join3(path, path, ".tmp", "") == 0)
            unlink(path);
    }
    rmdir(dir);
    errno = err;
}

/* ------------------------------------------------------- the compact layout's packs */

static char *decimal(char *buf, unsigned long long v, int min_digits);
static int assemble(char *line, size_t cap, size_t *len, const char *const *parts, size_t n);

/* The name of the pack of write-out k: PREFIX<k>.pack (under ROOT/chunks). */
static int pack_name(char *dst, size_t cap, const fi_ring *r, uint64_t k)
{
    char num[24];
    const char *d = decimal(num, (unsigned long long)k, 1);
    if (strlen(r->pack_prefix) + strlen(d) + sizeof "." FI_DUMP_PACK_EXT > cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return join3(dst, r->pack_prefix, d, "." FI_DUMP_PACK_EXT);
}

/* Calls the chunks of m, each reference once. */
#define FOR_CHUNKS(m, c)                                                                           \
    for (size_t i_ = 0; i_ < (m)->n; i_++)                                                         \
        for (size_t k_ = 0; k_ < (m)->t[i_].nref && ((c) = (m)->t[i_].ref[k_].chunk); k_++)

/* A slot's manifests that this write-out writes (written before: not again). */
static int manifest_missing(const fi_ring_slot *s, int i)
{
    const fi_ring_manifest *m = i ? &s->files.cout : &s->files.cin;
    return m->tail.len > 0 && !(s->wrote & (i ? FI_WROTE_OUTPUTS : FI_WROTE_INPUTS));
}

/* A pack being written: its descriptor, the bytes of whole records, the records. */
typedef struct {
    int fd;
    off_t end;
    long long packed;
    int err; /* errno of the first chunk that could not be written, 0 when none */
} pack_out;

/* Appends to the pack the chunks of s's missing manifests not in it yet, marking them with
 * k. A chunk the disk refuses is cut off again (the pack keeps
 * whole records only) and the call's other chunks are left: the call is lost, the calls
 * after it may still fit. -1 only when the pack cannot be cut back. */
static int pack_slot(pack_out *p, const fi_ring_slot *s, uint64_t k)
{
    for (int i = 0; i < 2; i++) {
        if (!manifest_missing(s, i))
            continue;
        const fi_ring_manifest *m = i ? &s->files.cout : &s->files.cin;
        fi_chunk *c;
        FOR_CHUNKS(m, c)
        {
            if (c->fired == k)
                continue;
            if (fi_chunk_pack_write(p->fd, c, c->data) < 0) {
                if (!p->err)
                    p->err = errno ? errno : EIO;
                return ftruncate(p->fd, p->end) < 0 || lseek(p->fd, p->end, SEEK_SET) < 0 ? -1 : 0;
            }
            c->fired = k;
            p->end += FI_PACK_HEADER + (off_t)c->len;
            p->packed++;
        }
    }
    return 0;
}

/* Unmarks the chunks a failed pack k held: nothing on disk holds them. */
static void unmark(fi_ring *r, uint64_t k)
{
    for (long long i = 0; i < r->n; i++) {
        const fi_ring_slot *s = &r->slots[i];
        for (int j = 0; s->generation && j < 2; j++) {
            const fi_ring_manifest *m = j ? &s->files.cout : &s->files.cin;
            fi_chunk *c;
            FOR_CHUNKS(m, c)
            {
                if (c->fired == k)
                    c->fired = 0;
            }
        }
    }
}

static fi_ring_slot *ready_slot(fi_ring *r, long long g);

/* The compact layout: every chunk the READY calls' manifests to be written need, each once,
 * in one pack ROOT/chunks/PREFIX<k>.pack written (and fsync'd) before any manifest names it,
 * in the order the calls are written (the call of first, then newest first): when the disk
 * fills up, what is lost is the oldest. A manifest names one pack (its chunks' references
 * were built at call time with pack index 0), so a later write-out of the same calls (one
 * that waited for a signal's) packs again the chunks its manifests need; a chunk is marked
 * with the last write-out that packed it (fired), and a call with a chunk not in pack k is
 * lost with *err (write_slot). -1 (errno set; its chunks unmarked, the pack removed) when
 * the pack cannot be written at all. */
static int write_pack(fi_ring *r, uint64_t k, long long first, int *err)
{
    char name[128], *dir = r->scratch->pack_dir, *path = r->scratch->pack_path;
    *err = 0;
    if (pack_name(name, sizeof name, r, k) < 0 ||
        join3(dir, r->root, "/" FI_DUMP_CHUNKS_DIR, "") < 0 || make_dirs(r, dir) < 0 ||
        join3(path, dir, "/", name) < 0)
        return -1;
    pack_out p = {open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), 0, 0, 0};
    if (p.fd < 0)
        return -1;
    int rc = 0;
    fi_ring_slot *s = ready_slot(r, first);
    if (s)
        rc = pack_slot(&p, s, k);
    long long newest = atomic_load(&r->generation);
    for (long long g = newest; rc == 0 && g > 0 && g > newest - r->n; g--)
        if (g != first && (s = ready_slot(r, g)))
            rc = pack_slot(&p, s, k);
    if (rc == 0 && fsync(p.fd) < 0)
        rc = -1;
    int e = errno;
    if (close(p.fd) < 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    *err = p.err;
    if (rc == 0)
        return 0;
    unlink(path);
    unmark(r, k);
    errno = e;
    return -1;
}

/* The head of a manifest of m (the compact layout, docs/dump-format.md) in buf, naming
 * pack k, which must hold every chunk of m. Its length, 0 (errno set) when it does not fit
 * or a chunk is not in pack k (errno pack_err: why the pack lacks it). */
static size_t manifest_head(char *buf, size_t cap, const fi_ring *r, const fi_ring_manifest *m,
                            uint64_t k, int pack_err)
{
    fi_chunk *c;
    FOR_CHUNKS(m, c)
    {
        if (c->fired != k) {
            errno = pack_err ? pack_err : EIO;
            return 0;
        }
    }
    char name[128];
    if (pack_name(name, sizeof name, r, k) < 0)
        return 0;
    size_t len = 0;
    const char *parts[] = {"{\"format\": \"" FI_COMPACT_FORMAT
                           "\", \"version\": " FI_COMPACT_VERSION ", \"packs\": [\"",
                           name, "\"], "};
    if (assemble(buf, cap, &len, parts, 3) < 0) {
        errno = ENAMETOOLONG;
        return 0;
    }
    return len;
}

/* ------------------------------------------------------------------- one call */

/* Writes what is missing of s's call: a new directory whole under its temporary name, then
 * renamed; one written before gets the files and records it lacks. Its tensors are tensor
 * files, or manifests naming the packs that hold their chunks (pack_err: why this
 * write-out's pack lacks some, 0 when it lacks none). Records go to session_fd too (-1: none).
 * Returns 1 written, 0 nothing was missing, -1 failed (errno set; nothing of this call is
 * left under a name readers take). */
static int write_slot(const fi_ring *r, fi_ring_slot *s, int session_fd, int pack_err)
{
    const fi_ring_files *f = &s->files;
    const fi_image *images[2] = {&f->inputs, &f->outputs};
    const fi_ring_manifest *manifests[2] = {&f->cin, &f->cout};
    static const char *const chunk_names[2] = {FI_DUMP_INPUTS "." FI_DUMP_EXT_CHUNKS,
                                               FI_DUMP_OUTPUTS "." FI_DUMP_EXT_CHUNKS};
    const unsigned bits[2] = {FI_WROTE_INPUTS, FI_WROTE_OUTPUTS};
    int fresh = !(s->wrote & FI_WROTE_DIR);
    unsigned missing = 0;
    for (int i = 0; i < 2; i++)
        if ((images[i]->len > 0 || manifests[i]->tail.len > 0) && !(s->wrote & bits[i]))
            missing |= bits[i];
    if (!fresh && !missing && s->meta_written == f->meta.len)
        return 0;
    char *dir = r->scratch->slot_dir, name[64];
    if (fresh) {
        if (partial_name(dir, r, s->dir) < 0)
            return -1;
        remove_partial(r, dir); /* a write-out that died on it (SIGKILL) */
        if (mkdir(dir, 0700) < 0)
            return -1;
    } else if (join3(dir, s->dir, "", "") < 0) {
        return -1;
    }
    char head[512];
    for (int i = 0; i < 2; i++) {
        if (!(missing & bits[i]))
            continue;
        if (manifests[i]->tail.len > 0) { /* its chunks are in the packs (write_pack) */
            size_t head_len = 0;
            if (!(head_len = manifest_head(head, sizeof head, r, manifests[i], r->packs_written,
                                           pack_err)) ||
                write_whole2(r, dir, chunk_names[i], head, head_len, manifests[i]->tail.data,
                             manifests[i]->tail.len) < 0)
                goto fail;
        }
        if (images[i]->len == 0)
            continue;
        if (images[i]->crc_deferred &&
            fi_ptzip_fill_crcs((uint8_t *)images[i]->data, images[i]->len) < 0) {
            errno = EINVAL;
            goto fail;
        }
        if (join3(name, i ? FI_DUMP_OUTPUTS "." : FI_DUMP_INPUTS ".", r->ext, "") < 0 ||
            write_whole(r, dir, name, images[i]->data, images[i]->len) < 0)
            goto fail;
    }
    /* metadata.jsonl last: a directory counts as a dump once it has one */
    if (write_whole(r, dir, FI_DUMP_METADATA_FILE, f->meta.data, f->meta.len) < 0)
        goto fail;
    if (fresh && rename(dir, s->dir) < 0)
        goto fail;
    s->wrote |= FI_WROTE_DIR | missing;
    if (session_fd >= 0)
        write_all_raw(session_fd, f->meta.data + s->meta_written, f->meta.len - s->meta_written);
    s->meta_written = f->meta.len;
    return 1;
fail:
    if (fresh)
        remove_partial(r, dir);
    return -1;
}

/* ------------------------------------------------------------ trigger record */

/* Decimal text of v at the end of buf (which holds 24 bytes); returns its start. */
static char *decimal(char *buf, unsigned long long v, int min_digits)
{
    char *p = buf + 23;
    *p = '\0';
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
        min_digits--;
    } while (v || min_digits > 0);
    return p;
}

char *fi_crash_decimal(char buf[24], unsigned long long v) { return decimal(buf, v, 1); }

const char *fi_crash_errno_text(int e)
{
    /* strerror is not async-signal-safe: the texts a write-out can meet, as glibc words them */
    switch (e) {
    case ENOSPC:
        return "No space left on device";
    case EDQUOT:
        return "Disk quota exceeded";
    case EFBIG:
        return "File too large";
    case EIO:
        return "Input/output error";
    case EACCES:
        return "Permission denied";
    case EPERM:
        return "Operation not permitted";
    case EROFS:
        return "Read-only file system";
    case ENOENT:
        return "No such file or directory";
    case ENOTDIR:
        return "Not a directory";
    case EEXIST:
        return "File exists";
    case ENOTEMPTY:
        return "Directory not empty";
    case ENAMETOOLONG:
        return "File name too long";
    case EMFILE:
        return "Too many open files";
    case ENFILE:
        return "Too many open files in system";
    case ENOMEM:
        return "Cannot allocate memory";
    case EINVAL:
        return "Invalid argument";
    default:
        return "I/O error";
    }
}

/* Appends the parts to line (of cap bytes, len used); 0, or -1 when they do not fit. */
static int assemble(char *line, size_t cap, size_t *len, const char *const *parts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(parts[i]);
        if (*len + k >= cap)
            return -1;
        memcpy(line + *len, parts[i], k);
        *len += k;
    }
    return 0;
}

/* s as the inside of a JSON string in dst (cap bytes): '"', '\\' and control characters
 * escaped, other bytes as they are (UTF-8 stays UTF-8). -1 when it does not fit. */
static int json_escape(char *dst, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[7] = {'\\', (char)*p, 0};
        if (*p < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[*p >> 4];
            esc[5] = hex[*p & 15];
            esc[6] = 0;
        } else if (*p != '"' && *p != '\\') {
            esc[0] = (char)*p;
            esc[1] = 0;
        }
        size_t k = strlen(esc);
        if (n + k >= cap)
            return -1;
        memcpy(dst + n, esc, k);
        n += k;
    }
    dst[n] = '\0';
    return 0;
}

/* {"record_type": "trigger", "trigger": T, ["signal": S,] "time": unix seconds,
 *  "process_id": P, "calls_written": K, ["calls_written_before": B,] ["calls_lost": L,
 *  "error": E,] <the triggering call's keys>} on one line, one write(2) of at most
 * FI_TRIGGER_RECORD_MAX bytes. When the call's keys would make it longer (a dump directory
 * of a very long path) they are left out and "call_keys_left_out": their length says so.
 * Sets res->record and what goes with it. */
static void write_trigger_line(const fi_ring *r, int fd, const char *trigger, const char *signame,
                               const fi_ring_slot *call, fi_ring_result *res)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char a[24], b[24], c[24], d[24], e[24], g[24], k[24];
    char name[6 * FI_TRIGGER_NAME_MAX + 1];
    if (json_escape(name, sizeof name, trigger) < 0)
        memcpy(name, "?", 2); /* dump_ring refuses longer names: cannot happen */
    const char *keys = call && call->files.trigger_keys.len ? call->files.trigger_keys.data : "";
    const char *parts[] = {
        "{\"record_type\": \"trigger\", \"trigger\": \"",
        name,
        signame ? "\", \"signal\": \"" : "",
        signame ? signame : "",
        "\", \"time\": ",
        decimal(a, (unsigned long long)ts.tv_sec, 1),
        ".",
        decimal(b, (unsigned long long)(ts.tv_nsec / 1000), 6),
        ", \"process_id\": ",
        decimal(c, (unsigned long long)getpid(), 1),
        ", \"calls_written\": ",
        decimal(d, (unsigned long long)res->written, 1),
        res->before ? ", \"calls_written_before\": " : "",
        res->before ? decimal(e, (unsigned long long)res->before, 1) : "",
        res->lost ? ", \"calls_lost\": " : "",
        res->lost ? decimal(g, (unsigned long long)res->lost, 1) : "",
        res->lost ? ", \"error\": \"" : "",
        res->lost ? fi_crash_errno_text(res->error) : "",
        res->lost ? "\"" : "",
        keys[0] ? ", " : "",
        keys,
        "}\n",
    };
    size_t n_parts = sizeof parts / sizeof parts[0];
    /* one write(2) per part would interleave with other processes' records: assemble */
    char *line = r->scratch->line;
    size_t len = 0;
    res->record = FI_RECORD_WHOLE;
    if (assemble(line, FI_TRIGGER_RECORD_MAX, &len, parts, n_parts) < 0) {
        res->record = FI_RECORD_SHORT;
        res->keys_left_out = strlen(keys);
        parts[n_parts - 3] = ", \"call_keys_left_out\": ";
        parts[n_parts - 2] = decimal(k, (unsigned long long)res->keys_left_out, 1);
        len = 0;
        assemble(line, FI_TRIGGER_RECORD_MAX, &len, parts, n_parts); /* fits: the rest is bounded */
    }
    if (fd < 0 || write_all_raw(fd, line, len) < 0) {
        res->record_error = fd < 0 ? res->record_error : errno;
        res->record = FI_RECORD_LOST;
    }
}

/* ------------------------------------------------------------------ write-out */

void fi_ring_test_hold(const fi_ring *r, char what)
{
    if (r->hold_fd < 0)
        return;
    while (write(r->hold_note_fd, &what, 1) < 0 && errno == EINTR)
        ;
    char c;
    while (read(r->hold_fd, &c, 1) < 0 && errno == EINTR)
        ;
}

/* The slot of generation g when it holds a READY call. */
static fi_ring_slot *ready_slot(fi_ring *r, long long g)
{
    if (g <= 0)
        return NULL;
    fi_ring_slot *s = &r->slots[(g - 1) % r->n];
    if (atomic_load(&s->state) != FI_SLOT_READY || s->generation != g)
        return NULL;
    return s;
}

/* Writes what is missing of s's call and counts the outcome in res; the first call of a
 * write-out is followed by the test hook's hold. */
static void write_one(fi_ring *r, fi_ring_slot *s, int session_fd, int pack_err,
                      fi_ring_result *res, int *first_done)
{
    int was_written = s->wrote != 0;
    int k = write_slot(r, s, session_fd, pack_err);
    if (k > 0) {
        res->written++;
    } else if (k < 0) {
        if (res->lost++ == 0)
            res->error = errno;
    } else if (was_written) {
        res->before++;
    }
    if (!*first_done) {
        *first_done = 1;
        fi_ring_test_hold(r, 'h'); /* a write-out is under way */
    }
}

long long fi_crash_newest_of_thread(fi_ring *r, long tid)
{
    long long newest = atomic_load(&r->generation);
    for (long long g = newest; g > 0 && g > newest - r->n; g--) {
        fi_ring_slot *s = ready_slot(r, g);
        if (s && s->owner_tid == tid)
            return g;
    }
    return 0;
}

int fi_crash_write_ring(fi_ring *r, const char *trigger, const char *signame, long long first,
                        fi_ring_result *res)
{
    res->written = res->before = res->lost = 0;
    res->error = res->record_error = 0;
    res->record = FI_RECORD_WHOLE;
    res->keys_left_out = 0;
    char *session = r->scratch->session;
    if (make_dirs(r, r->root) < 0 || join3(session, r->root, "/", FI_DUMP_SESSION_FILE) < 0)
        return -1;
    int fd = open(session, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        res->record_error = errno;
    /* the compact layout: the chunks first, in this write-out's pack; a call whose manifests
     * cannot name them is lost with the pack's errno */
    int pack_err = 0;
    if (r->store && write_pack(r, ++r->packs_written, first, &pack_err) < 0)
        pack_err = errno ? errno : EIO;
    /* the triggering call first, then the calls before it, newest first: when the disk
     * fills up, what is lost is the oldest */
    int first_done = 0;
    long long newest = atomic_load(&r->generation);
    fi_ring_slot *call = ready_slot(r, first);
    if (call)
        write_one(r, call, fd, pack_err, res, &first_done);
    for (long long g = newest; g > 0 && g > newest - r->n; g--) {
        fi_ring_slot *s = g == first ? NULL : ready_slot(r, g);
        if (!s)
            continue;
        if (!call)
            call = s; /* no triggering call: the trigger record names the newest */
        write_one(r, s, fd, pack_err, res, &first_done);
    }
    write_trigger_line(r, fd, trigger, signame, call, res);
    if (fd >= 0)
        close(fd);
    return 0;
}
