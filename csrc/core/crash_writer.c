/* crash_writer.c: the in-memory ring written out as dump directories. Everything here runs
 * inside signal handlers too: it only reads memory prepared at call time and uses
 * open/write/fsync/rename/mkdir/close (async-signal-safe per POSIX) and memcpy/strlen
 * (async-signal-safe since POSIX.1-2016). No malloc, no stdio, no locks: paths are built in
 * stack buffers. */
#include "crash_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compact.h"
#include "dump_format.h"
#include "ptzip.h"

/* dst = a + b + c, NUL-terminated; -1 when it does not fit PATH_MAX. */
static int join3(char *dst, const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    if (la + lb + lc + 1 > PATH_MAX)
        return -1;
    memcpy(dst, a, la);
    memcpy(dst + la, b, lb);
    memcpy(dst + la + lb, c, lc + 1);
    return 0;
}

static int write_all_raw(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* dir/name, whole or not at all: written to dir/name.tmp, fsync'd, renamed into place. */
static int write_whole(const char *dir, const char *name, const char *data, size_t len)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    if (join3(path, dir, "/", name) < 0 || join3(tmp, path, ".tmp", "") < 0)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int r = write_all_raw(fd, data, len) < 0 || fsync(fd) < 0 ? -1 : 0;
    if (close(fd) < 0)
        r = -1;
    if (r == 0 && rename(tmp, path) < 0)
        r = -1;
    if (r < 0)
        unlink(tmp);
    return r;
}

/* mkdir -p, on a stack copy of path. */
static int make_dirs(const char *path)
{
    char p[PATH_MAX];
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

/* dir/name holding head then tail, whole or not at all (as write_whole). */
static int write_whole2(const char *dir, const char *name, const char *head, size_t head_len,
                        const char *tail, size_t tail_len)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    if (join3(path, dir, "/", name) < 0 || join3(tmp, path, ".tmp", "") < 0)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int r = write_all_raw(fd, head, head_len) < 0 || write_all_raw(fd, tail, tail_len) < 0 ||
                    fsync(fd) < 0
                ? -1
                : 0;
    if (close(fd) < 0)
        r = -1;
    if (r == 0 && rename(tmp, path) < 0)
        r = -1;
    if (r < 0)
        unlink(tmp);
    return r;
}

/* The head of a manifest naming pack (the compact layout, docs/dump-format.md) in buf. */
static size_t manifest_head(char *buf, size_t cap, const char *pack)
{
    const char *parts[] = {"{\"format\": \"" FI_COMPACT_FORMAT "\", \"version\": 1, \"packs\": [\"",
                           pack, "\"], "};
    size_t len = 0;
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(parts[i]);
        if (len + k >= cap)
            return 0;
        memcpy(buf + len, parts[i], k);
        len += k;
    }
    return len;
}

static int write_slot(const fi_ring *r, const fi_ring_slot *s, int session_fd, const char *pack)
{
    const fi_ring_files *f = &s->files;
    char name[64];
    if (make_dirs(s->dir) < 0)
        return -1;
    const fi_ring_manifest *manifests[2] = {&f->cin, &f->cout};
    const char *chunk_names[2] = {"inputs.chunks.json", "outputs.chunks.json"};
    char head[512];
    size_t head_len = pack ? manifest_head(head, sizeof head, pack) : 0;
    for (int i = 0; pack && i < 2; i++) {
        if (manifests[i]->tail.len == 0)
            continue;
        if (head_len == 0 || write_whole2(s->dir, chunk_names[i], head, head_len,
                                          manifests[i]->tail.data, manifests[i]->tail.len) < 0)
            return -1;
    }
    const fi_image *images[2] = {&f->inputs, &f->outputs};
    const char *stems[2] = {FI_DUMP_INPUTS ".", FI_DUMP_OUTPUTS "."};
    for (int i = 0; i < 2; i++) {
        if (images[i]->len == 0)
            continue;
        if (images[i]->crc_deferred &&
            fi_ptzip_fill_crcs((uint8_t *)images[i]->data, images[i]->len) < 0)
            return -1;
        if (join3(name, stems[i], r->ext, "") < 0 ||
            write_whole(s->dir, name, images[i]->data, images[i]->len) < 0)
            return -1;
    }
    /* metadata.jsonl last: a directory counts as a dump once it has one */
    if (write_whole(s->dir, FI_DUMP_METADATA_FILE, f->meta.data, f->meta.len) < 0)
        return -1;
    return session_fd >= 0 ? write_all_raw(session_fd, f->meta.data, f->meta.len) : 0;
}

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

/* {"record_type": "trigger", "trigger": T, ["signal": S,] "time": unix seconds,
 *  "process_id": P, "calls_written": K, <the newest call's keys>} on one line. */
static void write_trigger_line(int fd, const char *trigger, const char *signame,
                               const fi_ring_slot *newest, long long written)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char a[24], b[24], c[24], d[24];
    const char *parts[] = {
        "{\"record_type\": \"trigger\", \"trigger\": \"",
        trigger,
        signame ? "\", \"signal\": \"" : "",
        signame ? signame : "",
        "\", \"time\": ",
        decimal(a, (unsigned long long)ts.tv_sec, 1),
        ".",
        decimal(b, (unsigned long long)(ts.tv_nsec / 1000), 6),
        ", \"process_id\": ",
        decimal(c, (unsigned long long)getpid(), 1),
        ", \"calls_written\": ",
        decimal(d, (unsigned long long)written, 1),
        newest && newest->files.trigger_keys.len ? ", " : "",
        newest && newest->files.trigger_keys.len ? newest->files.trigger_keys.data : "",
        "}\n",
    };
    /* one write(2) per part would interleave with other processes' records: assemble */
    char line[4096];
    size_t len = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t k = strlen(parts[i]);
        if (len + k >= sizeof line)
            return;
        memcpy(line + len, parts[i], k);
        len += k;
    }
    write_all_raw(fd, line, len);
}

/* The chunks of a manifest not yet in this write-out's pack, appended to it. */
static int write_chunks(int fd, const fi_ring_manifest *m, uint64_t fire)
{
    for (size_t i = 0; i < m->n; i++) {
        for (size_t k = 0; k < m->t[i].nref; k++) {
            fi_chunk *c = m->t[i].ref[k].chunk;
            if (c->fired == fire)
                continue;
            if (fi_chunk_pack_write(fd, c, c->data) < 0)
                return -1;
            c->fired = fire;
        }
    }
    return 0;
}

/* The compact layout: every chunk of the READY slots, each once, in one pack
 * ROOT/chunks/PREFIX<fire>.pack, written before any manifest naming it; its name in name. */
static int write_pack(fi_ring *r, uint64_t fire, char *name, size_t cap)
{
    char dir[PATH_MAX], path[PATH_MAX], num[24];
    const char *k = decimal(num, (unsigned long long)fire, 1);
    if (strlen(r->pack_prefix) + strlen(k) + 6 >= cap)
        return -1;
    join3(name, r->pack_prefix, k, ".pack");
    if (join3(dir, r->root, "/chunks", "") < 0 || make_dirs(dir) < 0 ||
        join3(path, dir, "/", name) < 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = 0;
    for (long long i = 0; rc == 0 && i < r->count; i++) {
        const fi_ring_slot *s = &r->slots[(r->head + i) % r->n];
        if (atomic_load(&s->state) != FI_SLOT_READY)
            continue;
        if (write_chunks(fd, &s->files.cin, fire) < 0 || write_chunks(fd, &s->files.cout, fire) < 0)
            rc = -1;
    }
    if (fsync(fd) < 0)
        rc = -1;
    if (close(fd) < 0)
        rc = -1;
    return rc;
}

int fi_crash_write_ring(fi_ring *r, const char *trigger, const char *signame)
{
    char session[PATH_MAX];
    if (make_dirs(r->root) < 0 || join3(session, r->root, "/", FI_DUMP_SESSION_FILE) < 0)
        return -1;
    int fd = open(session, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    atomic_store(&r->flushing, 1);
    long long written = 0;
    const fi_ring_slot *newest = NULL;
    char pack[128];
    /* the fired count is this write-out's number (it was counted before the write) */
    int have_pack =
        r->store && write_pack(r, (uint64_t)atomic_load(&r->fired), pack, sizeof pack) == 0;
    for (long long k = 0; k < r->count; k++) {
        const fi_ring_slot *s = &r->slots[(r->head + k) % r->n];
        if (atomic_load(&s->state) != FI_SLOT_READY)
            continue;
        if ((!r->store || have_pack) && write_slot(r, s, fd, r->store ? pack : NULL) == 0)
            written++;
        newest = s;
    }
    if (fd >= 0) {
        write_trigger_line(fd, trigger, signame, newest, written);
        close(fd);
    }
    atomic_store(&r->flushing, 0);
    return (int)written;
}
