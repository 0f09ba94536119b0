/* ring.c: the flight recorder's ring. On disk: a FIFO of call directories. In memory: slots
 * holding each call's complete files, written by async-signal-safe code when a trigger fires. */
#include "ring.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ptzip.h"

/* A slot is only read by the writer while READY; whoever changes it makes it BUSY first. */
enum { SLOT_EMPTY, SLOT_BUSY, SLOT_READY };

typedef struct {
    atomic_int state;
    long long generation;
    char *dir;
    fi_ring_files files;
    size_t bytes; /* what its buffers hold (the budget counts capacity) */
} slot;

struct fi_ring {
    long long n;
    char *root;
    char *ext;             /* tensor file extension: "pt" or "safetensors" */
    slot *slots;           /* memory ring */
    char **dirs;           /* disk ring */
    long long head, count; /* index of the oldest call; calls held */
    long long generation;  /* last generation handed out */
    size_t budget, used;
    long long max_triggers;
    atomic_llong fired;
    atomic_int flushing;        /* a writer is reading slots (maybe a signal handler) */
    atomic_int restart_pending; /* a signal handler fired: reset at the next claim */
};

fi_ring *fi_ring_new(long long n, const char *root, double budget_gb, long long max_triggers,
                     const char *ext)
{
    fi_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->n = n;
    r->root = strdup(root);
    r->ext = strdup(ext);
    r->slots = calloc((size_t)n, sizeof(slot));
    r->dirs = calloc((size_t)n, sizeof(char *));
    double budget = budget_gb * 1024.0 * 1024.0 * 1024.0;
    r->budget = budget >= (double)SIZE_MAX ? SIZE_MAX : (size_t)budget;
    r->max_triggers = max_triggers;
    if (!r->root || !r->ext || !r->slots || !r->dirs) {
        fi_ring_free(r);
        return NULL;
    }
    for (long long i = 0; i < n; i++) { /* slots never move: their inline buffers stay put */
        fi_buf_init(&r->slots[i].files.meta);
        fi_buf_init(&r->slots[i].files.trigger_keys);
    }
    return r;
}

/* ------------------------------------------------------------- disk ring */

/* Removes path and everything under it; errors are ignored (best effort). */
static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            size_t n = strlen(path) + strlen(e->d_name) + 2;
            char *child = malloc(n);
            if (!child)
                continue;
            snprintf(child, n, "%s/%s", path, e->d_name);
            if (unlink(child) < 0 && (errno == EISDIR || errno == EPERM))
                remove_tree(child); /* Linux: EISDIR, POSIX: EPERM */
            free(child);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Deletes a call directory: metadata.jsonl first, so that readers (which take a directory
 * with metadata.jsonl for a dump) never see a dump losing its files. */
static void delete_call_dir(const char *dir)
{
    size_t n = strlen(dir) + 32;
    char *meta = malloc(n);
    if (meta) {
        snprintf(meta, n, "%s/metadata.jsonl", dir);
        unlink(meta);
        free(meta);
    }
    remove_tree(dir);
}

int fi_ring_disk_push(fi_ring *r, const char *dir)
{
    char *copy = strdup(dir);
    if (!copy)
        return -1;
    if (r->count == r->n) {
        char *oldest = r->dirs[r->head];
        r->head = (r->head + 1) % r->n;
        r->count--;
        delete_call_dir(oldest);
        free(oldest);
    }
    r->dirs[(r->head + r->count) % r->n] = copy;
    r->count++;
    return 0;
}

/* ----------------------------------------------------------- memory ring */

void fi_ring_files_free(fi_ring_files *f)
{
    fi_image_free(&f->inputs);
    fi_image_free(&f->outputs);
    fi_buf_free(&f->meta);
    fi_buf_free(&f->trigger_keys);
}

static size_t files_bytes(const fi_ring_files *f)
{
    return f->inputs.cap + f->outputs.cap + f->meta.cap + f->trigger_keys.cap;
}

/* Marks s BUSY, then waits out a writer on another thread that may be reading it. */
static void slot_take(fi_ring *r, slot *s)
{
    atomic_store(&s->state, SLOT_BUSY);
    while (atomic_load(&r->flushing))
        sched_yield();
}

/* Drops the oldest call; keep_buffers leaves its buffers for reuse by the next call. */
static void evict_oldest(fi_ring *r, int keep_buffers)
{
    slot *s = &r->slots[r->head];
    slot_take(r, s);
    free(s->dir);
    s->dir = NULL;
    if (!keep_buffers) {
        fi_ring_files_free(&s->files);
        r->used -= s->bytes;
        s->bytes = 0;
    }
    s->generation = 0;
    atomic_store(&s->state, SLOT_EMPTY);
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

static void files_move(fi_ring_files *dst, fi_ring_files *src)
{
    dst->inputs = src->inputs;
    dst->outputs = src->outputs;
    src->inputs = src->outputs = (fi_image){0};
    buf_move(&dst->meta, &src->meta);
    buf_move(&dst->trigger_keys, &src->trigger_keys);
}

void fi_ring_files_init(fi_ring_files *f)
{
    f->inputs = f->outputs = (fi_image){0};
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
    slot *s = &r->slots[index];
    /* a reused slot's buffers stay (and stay counted) until the call's files replace them */
    size_t retained = s->bytes;
    while (r->count > 0 && r->used - retained + bytes > r->budget)
        evict_oldest(r, 0);
    int too_big = r->used - retained + bytes > r->budget;
    slot_take(r, s);
    fi_ring_files_free(out);
    files_move(out, &s->files); /* the call writes its own copy: see fi_ring_open */
    if (too_big) {
        fi_ring_files_free(out);
        r->used -= s->bytes;
        s->bytes = 0;
    }
    out->inputs.len = out->outputs.len = 0;
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
    slot *s = &r->slots[t->index];
    if (s->generation != t->generation || !s->dir)
        return -1;
    slot_take(r, s);
    fi_ring_files_free(out);
    files_move(out, &s->files);
    return 0;
}

void fi_ring_done(fi_ring *r, const fi_ring_ticket *t, fi_ring_files *files)
{
    slot *s = &r->slots[t->index];
    if (s->generation != t->generation) { /* evicted, or the ring fired, meanwhile */
        fi_ring_files_free(files);
        return;
    }
    fi_ring_files_free(&s->files);
    files_move(&s->files, files);
    size_t now = files_bytes(&s->files);
    r->used = r->used - s->bytes + now;
    s->bytes = now;
    atomic_store(&s->state, SLOT_READY);
    /* the call's outputs may have pushed the ring over its budget: older calls go */
    while (r->count > 1 && r->used > r->budget && r->head != t->index)
        evict_oldest(r, 0);
}

size_t fi_ring_bytes(const fi_ring *r) { return r->used; }

static void uninstall_signals(fi_ring *r);

void fi_ring_free(fi_ring *r)
{
    if (!r)
        return;
    uninstall_signals(r);
    for (long long i = 0; r->slots && i < r->n; i++) {
        free(r->slots[i].dir);
        fi_ring_files_free(&r->slots[i].files);
    }
    for (long long i = 0; r->dirs && i < r->n; i++)
        free(r->dirs[i]);
    free(r->slots);
    free(r->dirs);
    free(r->root);
    free(r->ext);
    free(r);
}

/* ------------------------------------------- the writer (async-signal-safe)
 * Everything below runs inside signal handlers too: it only reads memory prepared at
 * call time and uses open/write/fsync/rename/mkdir/close (async-signal-safe per POSIX)
 * and memcpy/strlen (async-signal-safe since POSIX.1-2016). No malloc, no stdio, no
 * locks: paths are built in stack buffers. */

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

static int write_slot(const fi_ring *r, const slot *s, int session_fd)
{
    const fi_ring_files *f = &s->files;
    char name[64];
    if (make_dirs(s->dir) < 0)
        return -1;
    const fi_image *images[2] = {&f->inputs, &f->outputs};
    const char *stems[2] = {"inputs.", "outputs."};
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
    if (write_whole(s->dir, "metadata.jsonl", f->meta.data, f->meta.len) < 0)
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
static void write_trigger_line(int fd, const char *trigger, const char *signame, const slot *newest,
                               long long written)
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

/* Writes every READY slot in call order and the trigger record. */
static int write_ring(fi_ring *r, const char *trigger, const char *signame)
{
    char session[PATH_MAX];
    if (make_dirs(r->root) < 0 || join3(session, r->root, "/", "session.jsonl") < 0)
        return -1;
    int fd = open(session, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    atomic_store(&r->flushing, 1);
    long long written = 0;
    const slot *newest = NULL;
    for (long long k = 0; k < r->count; k++) {
        const slot *s = &r->slots[(r->head + k) % r->n];
        if (atomic_load(&s->state) != SLOT_READY)
            continue;
        if (write_slot(r, s, fd) == 0)
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

int fi_ring_fire(fi_ring *r, const char *trigger)
{
    if (!fi_ring_recording(r))
        return 0;
    atomic_fetch_add(&r->fired, 1);
    int written = write_ring(r, trigger, NULL);
    reset(r);
    return written;
}

/* -------------------------------------------------------- signal handlers */

static const int handled_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGUSR1};
static const char *const signal_names[] = {"SIGSEGV", "SIGBUS",  "SIGFPE",
                                           "SIGILL",  "SIGABRT", "SIGUSR1"};
#define N_HANDLED (sizeof handled_signals / sizeof handled_signals[0])

static struct sigaction previous[N_HANDLED];
static fi_ring *_Atomic signal_ring;

/* Hands the signal on as if we were not there: the previous handler, or the default
 * action (re-raised; it is delivered when our handler returns, so core dumps and exit
 * statuses are what they would have been). SIGUSR1's default would end the process:
 * the recorder owns it then, and the process goes on. */
static void chain(size_t i, int sig, siginfo_t *info, void *uctx)
{
    const struct sigaction *old = &previous[i];
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction)
            old->sa_sigaction(sig, info, uctx);
        return;
    }
    if (old->sa_handler == SIG_IGN || (old->sa_handler == SIG_DFL && sig == SIGUSR1))
        return;
    if (old->sa_handler == SIG_DFL) {
        sigaction(sig, old, NULL);
        raise(sig);
        return;
    }
    old->sa_handler(sig);
}

static void on_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved_errno = errno;
    size_t i = 0;
    while (i < N_HANDLED - 1 && handled_signals[i] != sig)
        i++;
    fi_ring *r = atomic_load(&signal_ring);
    /* fetch_add claims the trigger: two signals at once write the ring once */
    if (r && !atomic_load(&r->restart_pending) &&
        atomic_fetch_add(&r->fired, 1) < r->max_triggers) {
        write_ring(r, "signal", signal_names[i]);
        atomic_store(&r->restart_pending, 1); /* freeing memory waits for normal context */
    }
    errno = saved_errno;
    chain(i, sig, info, uctx);
}

/* A stack overflow delivers SIGSEGV on the exhausted stack, where the handler has no room
 * to run: the thread that installs the handlers (the one that made the ring, usually the
 * main thread) gets an alternate signal stack, unless it has one already (faulthandler's,
 * say). The memory stays for the life of the process, as the handlers do. */
static int ensure_alt_stack(void)
{
    stack_t old;
    if (sigaltstack(NULL, &old) == 0 && !(old.ss_flags & SS_DISABLE))
        return 0;
    size_t size = 256 * 1024; /* the ring's write-out needs little; chained handlers more */
    stack_t ss = {.ss_sp = malloc(size), .ss_size = size, .ss_flags = 0};
    if (!ss.ss_sp)
        return -1;
    if (sigaltstack(&ss, NULL) < 0) {
        free(ss.ss_sp);
        return -1;
    }
    return 0;
}

int fi_ring_install_signals(fi_ring *r)
{
    static int installed;
    atomic_store(&signal_ring, r);
    if (installed)
        return 0;
    if (ensure_alt_stack() < 0)
        return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_HANDLED; i++)
        if (sigaction(handled_signals[i], &sa, &previous[i]) < 0)
            return -1;
    installed = 1;
    return 0;
}

/* A freed ring is no longer the handlers' ring. */
static void uninstall_signals(fi_ring *r)
{
    fi_ring *expected = r;
    atomic_compare_exchange_strong(&signal_ring, &expected, NULL);
}
