/* pickle.c: data.pkl of a PyTorch zip file: written for a dict of tensors exactly as
 * torch.save lays it out, and read by a tiny interpreter that knows only those opcodes. */
#include "pickle.h"

#include <string.h>

#include "tensor.h"

/* ---- writer ---- */

/* torch keeps these dtypes in legacy typed storages (_rebuild_tensor_v2); every other
 * dtype goes through UntypedStorage + dtype (_rebuild_tensor_v3), as torch.save does. */
static const char *legacy_storage_name(fi_dtype d)
{
    switch (d) {
    case FI_DTYPE_F64:
        return "DoubleStorage";
    case FI_DTYPE_F32:
        return "FloatStorage";
    case FI_DTYPE_F16:
        return "HalfStorage";
    case FI_DTYPE_BF16:
        return "BFloat16Storage";
    case FI_DTYPE_I64:
        return "LongStorage";
    case FI_DTYPE_I32:
        return "IntStorage";
    case FI_DTYPE_I16:
        return "ShortStorage";
    case FI_DTYPE_I8:
        return "CharStorage";
    case FI_DTYPE_U8:
        return "ByteStorage";
    case FI_DTYPE_BOOL:
        return "BoolStorage";
    case FI_DTYPE_C64:
        return "ComplexFloatStorage";
    case FI_DTYPE_C128:
        return "ComplexDoubleStorage";
    default:
        return NULL;
    }
}

static void put_u32(fi_buf *b, uint32_t v)
{
    unsigned char le[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24};
    fi_buf_append(b, (const char *)le, 4);
}

static void put_int(fi_buf *b, int64_t v)
{
    if (v >= 0 && v < 256) {
        fi_buf_putc(b, 'K');
        fi_buf_putc(b, (char)v);
    } else if (v >= 0 && v < 65536) {
        fi_buf_putc(b, 'M');
        fi_buf_putc(b, (char)(v & 0xff));
        fi_buf_putc(b, (char)(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        fi_buf_putc(b, 'J');
        put_u32(b, (uint32_t)v);
    } else {
        unsigned char le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (unsigned char)((uint64_t)v >> (8 * k));
        fi_buf_append(b, "\x8a\x08", 2);
        fi_buf_append(b, (const char *)le, 8);
    }
}

static void put_str(fi_buf *b, const char *s, size_t n)
{
    fi_buf_putc(b, 'X');
    put_u32(b, (uint32_t)n);
    fi_buf_append(b, s, n);
}

static void put_int_tuple(fi_buf *b, const int64_t *v, int n)
{
    if (n == 0) {
        fi_buf_putc(b, ')');
        return;
    }
    if (n > 3)
        fi_buf_putc(b, '(');
    for (int i = 0; i < n; i++)
        put_int(b, v[i]);
    fi_buf_putc(b, n == 1 ? '\x85' : n == 2 ? '\x86' : n == 3 ? '\x87' : 't');
}

int fi_pickle_write_tensors(fi_buf *b, const fi_saved_tensor *ts, size_t n)
{
    fi_buf_append(b, "\x80\x02}q\x00(", 6);
    for (size_t i = 0; i < n; i++) {
        const fi_saved_tensor *s = &ts[i];
        const char *legacy = legacy_storage_name(s->t.dtype);
        char key[32];
        int key_len = snprintf(key, sizeof(key), "%zu", i);
        put_str(b, s->key, s->key_len);
        fi_buf_puts(b, legacy ? "ctorch._utils\n_rebuild_tensor_v2\n"
                              : "ctorch._utils\n_rebuild_tensor_v3\n");
        fi_buf_append(b, "((", 2);
        put_str(b, "storage", 7);
        if (legacy) {
            fi_buf_puts(b, "ctorch\n");
            fi_buf_puts(b, legacy);
            fi_buf_putc(b, '\n');
        } else
            fi_buf_puts(b, "ctorch.storage\nUntypedStorage\n");
        put_str(b, key, (size_t)key_len);
        put_str(b, "cpu", 3);
        put_int(b, (int64_t)(legacy ? s->span_bytes / s->itemsize : s->span_bytes));
        fi_buf_append(b, "tQ", 2);
        put_int(b, 0);
        put_int_tuple(b, s->t.shape, s->t.ndim);
        put_int_tuple(b, s->t.stride, s->t.ndim);
        fi_buf_putc(b, s->requires_grad ? '\x88' : '\x89');
        fi_buf_puts(b, "ccollections\nOrderedDict\n)R");
        if (!legacy) {
            fi_buf_puts(b, "ctorch\n");
            fi_buf_puts(b, fi_dtype_name(s->t.dtype));
            fi_buf_putc(b, '\n');
        }
        fi_buf_append(b, "tR", 2);
    }
    fi_buf_append(b, "u.", 2);
    return b->oom ? -1 : 0;
}

/* ---- reader ---- */

typedef enum {
    V_MARK,
    V_NONE,
    V_BOOL,
    V_INT,
    V_STR,
    V_TUPLE,
    V_GLOBAL,
    V_STORAGE,
    V_TENSOR,
    V_DICT
} vkind;
typedef enum {
    G_REBUILD_V2,
    G_REBUILD_V3,
    G_ODICT,
    G_TYPED_STORAGE,
    G_UNTYPED_STORAGE,
    G_DTYPE
} gkind;

typedef struct value {
    vkind kind;
    gkind g;
    fi_dtype dtype; /* G_TYPED_STORAGE, G_DTYPE, V_STORAGE, V_TENSOR */
    int untyped;    /* V_STORAGE from UntypedStorage */
    int64_t i;      /* V_INT, V_BOOL; V_STORAGE: bytes */
    const char *s;  /* V_STR; V_STORAGE: record key */
    size_t n;
    struct value **items; /* V_TUPLE items; V_DICT key, value pairs */
    size_t nitems, cap;
    fi_loaded_tensor *tensor; /* V_TENSOR */
} value;

typedef struct {
    const uint8_t *p;
    size_t n, i;
    const char *path;
    void **allocs;
    size_t nallocs, cap_allocs;
    value **stack;
    size_t sp, cap_stack;
    value **memo;
    size_t nmemo;
} reader;

static int fail(reader *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    PyErr_Format(PyExc_ValueError, "%s: data.pkl: %s (at byte %zu)", r->path, msg, r->i);
    return -1;
}

/* Every allocation is recorded and freed together when reading ends. */
static void *ralloc(reader *r, size_t size)
{
    if (r->nallocs == r->cap_allocs) {
        size_t cap = r->cap_allocs ? r->cap_allocs * 2 : 64;
        void **a = realloc(r->allocs, cap * sizeof(void *));
        if (!a)
            return NULL;
        r->allocs = a;
        r->cap_allocs = cap;
    }
    void *p = calloc(1, size ? size : 1);
    if (p)
        r->allocs[r->nallocs++] = p;
    return p;
}

static value *new_value(reader *r, vkind kind)
{
    value *v = ralloc(r, sizeof(value));
    if (!v) {
        PyErr_NoMemory();
        return NULL;
    }
    v->kind = kind;
    return v;
}

static int push(reader *r, value *v)
{
    if (!v)
        return -1;
    if (r->sp == r->cap_stack) {
        size_t cap = r->cap_stack ? r->cap_stack * 2 : 64;
        value **s = realloc(r->stack, cap * sizeof(value *));
        if (!s) {
            PyErr_NoMemory();
            return -1;
        }
        r->stack = s;
        r->cap_stack = cap;
    }
    r->stack[r->sp++] = v;
    return 0;
}

static value *pop(reader *r)
{
    if (r->sp == 0 || r->stack[r->sp - 1]->kind == V_MARK) {
        fail(r, "stack underflow");
        return NULL;
    }
    return r->stack[--r->sp];
}

static const uint8_t *take(reader *r, size_t k)
{
    if (r->n - r->i < k) {
        fail(r, "truncated (needs %zu more bytes)", k);
        return NULL;
    }
    const uint8_t *q = r->p + r->i;
    r->i += k;
    return q;
}

static uint32_t le32(const uint8_t *q)
{
    return q[0] | q[1] << 8 | q[2] << 16 | (uint32_t)q[3] << 24;
}

/* Pops items down to the topmost mark into a new tuple. */
static value *pop_to_mark(reader *r)
{
    size_t m = r->sp;
    while (m > 0 && r->stack[m - 1]->kind != V_MARK)
        m--;
    if (m == 0) {
        fail(r, "no mark on the stack");
        return NULL;
    }
    value *t = new_value(r, V_TUPLE);
    if (!t)
        return NULL;
    t->nitems = r->sp - m;
    t->items = ralloc(r, t->nitems * sizeof(value *));
    if (!t->items) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(t->items, r->stack + m, t->nitems * sizeof(value *));
    r->sp = m - 1;
    return t;
}

static value *tuple_of(reader *r, size_t k)
{
    if (r->sp < k) {
        fail(r, "stack underflow");
        return NULL;
    }
    value *t = new_value(r, V_TUPLE);
    if (!t)
        return NULL;
    t->items = ralloc(r, k * sizeof(value *));
    if (!t->items) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t j = 0; j < k; j++) {
        value *v = r->stack[r->sp - k + j];
        if (v->kind == V_MARK) {
            fail(r, "mark inside a tuple");
            return NULL;
        }
        t->items[j] = v;
    }
    t->nitems = k;
    r->sp -= k;
    return t;
}

static int str_is(const value *v, const char *s)
{
    return v->kind == V_STR && v->n == strlen(s) && memcmp(v->s, s, v->n) == 0;
}

/* GLOBAL: only the names torch.save emits for tensors are known; nothing is imported. */
static value *global(reader *r)
{
    const uint8_t *start = r->p + r->i, *end = r->p + r->n;
    const uint8_t *nl1 = memchr(start, '\n', (size_t)(end - start));
    const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
    if (!nl2) {
        fail(r, "truncated GLOBAL");
        return NULL;
    }
    r->i = (size_t)(nl2 + 1 - r->p);
    char mod[64], name[64];
    size_t ml = (size_t)(nl1 - start), nl = (size_t)(nl2 - nl1 - 1);
    if (ml >= sizeof(mod) || nl >= sizeof(name)) {
        fail(r, "pickle global name too long");
        return NULL;
    }
    memcpy(mod, start, ml);
    mod[ml] = '\0';
    memcpy(name, nl1 + 1, nl);
    name[nl] = '\0';
    value *v = new_value(r, V_GLOBAL);
    if (!v)
        return NULL;
    if (strcmp(mod, "torch._utils") == 0 && strcmp(name, "_rebuild_tensor_v2") == 0) {
        v->g = G_REBUILD_V2;
        return v;
    }
    if (strcmp(mod, "torch._utils") == 0 && strcmp(name, "_rebuild_tensor_v3") == 0) {
        v->g = G_REBUILD_V3;
        return v;
    }
    if (strcmp(mod, "collections") == 0 && strcmp(name, "OrderedDict") == 0) {
        v->g = G_ODICT;
        return v;
    }
    if (strcmp(mod, "torch.storage") == 0 && strcmp(name, "UntypedStorage") == 0) {
        v->g = G_UNTYPED_STORAGE;
        v->dtype = FI_DTYPE_U8;
        return v;
    }
    if (strcmp(mod, "torch") == 0) {
        for (int d = FI_DTYPE_F64; d < FI_DTYPE_COUNT; d++) {
            const char *legacy = legacy_storage_name((fi_dtype)d);
            if (legacy && strcmp(name, legacy) == 0) {
                v->g = G_TYPED_STORAGE;
                v->dtype = (fi_dtype)d;
                return v;
            }
            /* Whether this torch has the dtype is checked when the tensor is built. */
            if (strcmp(name, fi_dtype_name((fi_dtype)d)) == 0) {
                v->g = G_DTYPE;
                v->dtype = (fi_dtype)d;
                return v;
            }
        }
    }
    fail(r, "pickle global '%s.%s' is not allowed", mod, name);
    return NULL;
}

/* BINPERSID: ('storage', StorageType, key, location, numel). */
static value *persistent_load(reader *r, value *pid)
{
    if (pid->kind != V_TUPLE || pid->nitems != 5 || !str_is(pid->items[0], "storage") ||
        pid->items[1]->kind != V_GLOBAL ||
        (pid->items[1]->g != G_TYPED_STORAGE && pid->items[1]->g != G_UNTYPED_STORAGE) ||
        pid->items[2]->kind != V_STR || pid->items[3]->kind != V_STR ||
        pid->items[4]->kind != V_INT) {
        fail(r, "persistent id is not ('storage', StorageType, key, location, numel)");
        return NULL;
    }
    int64_t numel = pid->items[4]->i;
    size_t itemsize = fi_dtype_size(pid->items[1]->dtype);
    if (numel < 0 || (uint64_t)numel > (uint64_t)INT64_MAX / itemsize) {
        fail(r, "storage size %lld out of range", (long long)numel);
        return NULL;
    }
    value *v = new_value(r, V_STORAGE);
    if (!v)
        return NULL;
    v->dtype = pid->items[1]->dtype;
    v->untyped = pid->items[1]->g == G_UNTYPED_STORAGE;
    v->i = numel * (int64_t)itemsize;
    v->s = pid->items[2]->s;
    v->n = pid->items[2]->n;
    return v;
}

static int int_tuple(reader *r, const value *t, int64_t *dst, const char *what)
{
    if (t->kind != V_TUPLE || t->nitems > FI_MAX_DIMS)
        return fail(r, "tensor %s is not a tuple of at most %d ints", what, FI_MAX_DIMS);
    for (size_t j = 0; j < t->nitems; j++) {
        if (t->items[j]->kind != V_INT)
            return fail(r, "tensor %s is not a tuple of ints", what);
        dst[j] = t->items[j]->i;
    }
    return (int)t->nitems;
}

static int empty_hooks(const value *v)
{
    return (v->kind == V_DICT && v->nitems == 0) || v->kind == V_NONE;
}

/* REDUCE: OrderedDict() or _rebuild_tensor_v2/_v3(storage, offset, size, stride,
 * requires_grad, hooks[, dtype][, metadata]). */
static value *reduce(reader *r, value *fn, value *args)
{
    if (fn->kind != V_GLOBAL || args->kind != V_TUPLE) {
        fail(r, "REDUCE of something that is not a known global");
        return NULL;
    }
    if (fn->g == G_ODICT) {
        if (args->nitems != 0) {
            fail(r, "OrderedDict with arguments");
            return NULL;
        }
        return new_value(r, V_DICT);
    }
    int v3 = fn->g == G_REBUILD_V3;
    if (fn->g != G_REBUILD_V2 && !v3) {
        fail(r, "REDUCE of a global that does not build tensors");
        return NULL;
    }
    size_t base = v3 ? 7 : 6;
    value **a = args->items;
    if (args->nitems < base || args->nitems > base + 1 || a[0]->kind != V_STORAGE ||
        a[0]->untyped != v3 || a[1]->kind != V_INT || a[4]->kind != V_BOOL || !empty_hooks(a[5]) ||
        (v3 && (a[6]->kind != V_GLOBAL || a[6]->g != G_DTYPE)) ||
        (args->nitems == base + 1 && !empty_hooks(a[base]))) {
        fail(r, "unexpected arguments to _rebuild_tensor_v%d", v3 ? 3 : 2);
        return NULL;
    }
    fi_loaded_tensor *lt = ralloc(r, sizeof(*lt));
    value *v = new_value(r, V_TENSOR);
    if (!lt || !v) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    lt->dtype = v3 ? a[6]->dtype : a[0]->dtype;
    int nd = int_tuple(r, a[2], lt->shape, "size");
    int ns = nd < 0 ? -1 : int_tuple(r, a[3], lt->stride, "stride");
    if (ns < 0)
        return NULL;
    if (nd != ns) {
        fail(r, "tensor size has %d dims but stride has %d", nd, ns);
        return NULL;
    }
    lt->ndim = nd;
    lt->storage_offset = a[1]->i;
    lt->requires_grad = a[4]->i != 0;
    lt->data_nbytes = (uint64_t)a[0]->i;
    lt->storage_key = a[0]->s;
    lt->storage_key_len = a[0]->n;
    v->tensor = lt;
    return v;
}

static int set_items(reader *r, value *d, value **kv, size_t n)
{
    if (d->kind != V_DICT)
        return fail(r, "SETITEM on something that is not a dict");
    if (d->nitems + n > d->cap) {
        size_t cap = (d->nitems + n) * 2;
        value **items = ralloc(r, cap * sizeof(value *));
        if (!items) {
            PyErr_NoMemory();
            return -1;
        }
        if (d->nitems)
            memcpy(items, d->items, d->nitems * sizeof(value *));
        d->items = items;
        d->cap = cap;
    }
    if (n > 0)
        memcpy(d->items + d->nitems, kv, n * sizeof(value *));
    d->nitems += n;
    return 0;
}

static int memo_put(reader *r, size_t idx)
{
    if (r->sp == 0 || r->stack[r->sp - 1]->kind == V_MARK)
        return fail(r, "memo put with an empty stack");
    if (idx >= r->n)
        return fail(r, "memo index %zu out of range", idx);
    if (idx >= r->nmemo) {
        size_t cap = idx + 1 > r->nmemo * 2 ? idx + 1 : r->nmemo * 2;
        if (cap > r->n)
            cap = r->n;
        value **m = realloc(r->memo, cap * sizeof(value *));
        if (!m) {
            PyErr_NoMemory();
            return -1;
        }
        memset(m + r->nmemo, 0, (cap - r->nmemo) * sizeof(value *));
        r->memo = m;
        r->nmemo = cap;
    }
    r->memo[idx] = r->stack[r->sp - 1];
    return 0;
}

static int memo_get(reader *r, size_t idx)
{
    if (idx >= r->nmemo || !r->memo[idx])
        return fail(r, "memo index %zu was never set", idx);
    return push(r, r->memo[idx]);
}

/* Runs the opcodes; on STOP returns the final value in *result. */
static int run(reader *r, value **result)
{
    size_t next_memo = 0;
    for (;;) {
        const uint8_t *q = take(r, 1);
        if (!q)
            return -1;
        uint8_t op = *q;
        value *v, *w;
        switch (op) {
        case 0x80: /* PROTO */
            if (!(q = take(r, 1)))
                return -1;
            if (*q < 2 || *q > 5)
                return fail(r, "pickle protocol %d not supported", *q);
            break;
        case '}': /* EMPTY_DICT */
            if (push(r, new_value(r, V_DICT)) < 0)
                return -1;
            break;
        case ')': /* EMPTY_TUPLE */
            if (push(r, new_value(r, V_TUPLE)) < 0)
                return -1;
            break;
        case 'N':
            if (push(r, new_value(r, V_NONE)) < 0)
                return -1;
            break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            if (!(v = new_value(r, V_BOOL)))
                return -1;
            v->i = op == 0x88;
            if (push(r, v) < 0)
                return -1;
            break;
        case '(': /* MARK */
            if (push(r, new_value(r, V_MARK)) < 0)
                return -1;
            break;
        case 'q': /* BINPUT */
        case 'r': /* LONG_BINPUT */
            if (!(q = take(r, op == 'q' ? 1 : 4)))
                return -1;
            if (memo_put(r, op == 'q' ? *q : le32(q)) < 0)
                return -1;
            next_memo = (op == 'q' ? *q : le32(q)) + 1;
            break;
        case 0x94: /* MEMOIZE */
            if (memo_put(r, next_memo++) < 0)
                return -1;
            break;
        case 'h': /* BINGET */
        case 'j': /* LONG_BINGET */
            if (!(q = take(r, op == 'h' ? 1 : 4)))
                return -1;
            if (memo_get(r, op == 'h' ? *q : le32(q)) < 0)
                return -1;
            break;
        case 'X':    /* BINUNICODE */
        case 0x8c: { /* SHORT_BINUNICODE */
            if (!(q = take(r, op == 'X' ? 4 : 1)))
                return -1;
            size_t len = op == 'X' ? le32(q) : *q;
            if (!(q = take(r, len)) || !(v = new_value(r, V_STR)))
                return -1;
            v->s = (const char *)q;
            v->n = len;
            if (push(r, v) < 0)
                return -1;
            break;
        }
        case 'K': /* BININT1 */
        case 'M': /* BININT2 */
        case 'J': /* BININT */
            if (!(q = take(r, op == 'K' ? 1 : op == 'M' ? 2 : 4)) || !(v = new_value(r, V_INT)))
                return -1;
            v->i = op == 'K' ? q[0] : op == 'M' ? (q[0] | q[1] << 8) : (int32_t)le32(q);
            if (push(r, v) < 0)
                return -1;
            break;
        case 0x8a: { /* LONG1 */
            if (!(q = take(r, 1)))
                return -1;
            size_t len = *q;
            if (len > 8)
                return fail(r, "integer of %zu bytes too large", len);
            if (!(q = take(r, len)) || !(v = new_value(r, V_INT)))
                return -1;
            uint64_t u = 0;
            for (size_t k = 0; k < len; k++)
                u |= (uint64_t)q[k] << (8 * k);
            if (len > 0 && len < 8 && (q[len - 1] & 0x80))
                u |= ~(uint64_t)0 << (8 * len);
            v->i = (int64_t)u;
            if (push(r, v) < 0)
                return -1;
            break;
        }
        case 'c': /* GLOBAL */
            if (push(r, global(r)) < 0)
                return -1;
            break;
        case 't': /* TUPLE */
            if (push(r, pop_to_mark(r)) < 0)
                return -1;
            break;
        case 0x85: /* TUPLE1..3 */
        case 0x86:
        case 0x87:
            if (push(r, tuple_of(r, (size_t)(op - 0x84))) < 0)
                return -1;
            break;
        case 'Q': /* BINPERSID */
            if (!(v = pop(r)) || push(r, persistent_load(r, v)) < 0)
                return -1;
            break;
        case 'R': /* REDUCE */
            if (!(w = pop(r)) || !(v = pop(r)) || push(r, reduce(r, v, w)) < 0)
                return -1;
            break;
        case 's': { /* SETITEM */
            value *kv[2];
            if (!(kv[1] = pop(r)) || !(kv[0] = pop(r)))
                return -1;
            if (r->sp == 0)
                return fail(r, "SETITEM without a dict");
            if (set_items(r, r->stack[r->sp - 1], kv, 2) < 0)
                return -1;
            break;
        }
        case 'u': /* SETITEMS */
            if (!(v = pop_to_mark(r)))
                return -1;
            if (v->nitems % 2 != 0)
                return fail(r, "SETITEMS with an odd number of items");
            if (r->sp == 0)
                return fail(r, "SETITEMS without a dict");
            if (set_items(r, r->stack[r->sp - 1], v->items, v->nitems) < 0)
                return -1;
            break;
        case '.': /* STOP */
            if (!(v = pop(r)))
                return -1;
            *result = v;
            return 0;
        default:
            r->i--;
            return fail(r, "unsupported pickle opcode 0x%02x", op);
        }
    }
}

static void reader_free(reader *r)
{
    for (size_t k = 0; k < r->nallocs; k++)
        free(r->allocs[k]);
    free(r->allocs);
    free(r->stack);
    free(r->memo);
}

int fi_pickle_read_tensors(const uint8_t *p, size_t n, const char *path, fi_loaded_tensor **out,
                           size_t *count)
{
    reader r = {.p = p, .n = n, .path = path};
    value *result = NULL;
    *out = NULL;
    *count = 0;
    if (run(&r, &result) < 0) {
        reader_free(&r);
        return -1;
    }
    if (result->kind != V_DICT) {
        r.i = n;
        fail(&r, "the pickled object is not a dict");
        reader_free(&r);
        return -1;
    }
    size_t nt = result->nitems / 2;
    fi_loaded_tensor *ts = PyMem_Calloc(nt ? nt : 1, sizeof(*ts));
    if (!ts) {
        reader_free(&r);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < nt; k++) {
        value *key = result->items[2 * k], *val = result->items[2 * k + 1];
        if (key->kind != V_STR || val->kind != V_TENSOR) {
            r.i = n;
            fail(&r, "dict item %zu is not str: tensor", k);
            goto error;
        }
        ts[k] = *val->tensor;
        ts[k].key = PyUnicode_DecodeUTF8(key->s, (Py_ssize_t)key->n, "strict");
        if (!ts[k].key)
            goto error;
    }
    reader_free(&r);
    *out = ts;
    *count = nt;
    return 0;
error:
    fi_loaded_tensors_free(ts, nt);
    reader_free(&r);
    return -1;
}
