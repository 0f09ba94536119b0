/* dump_record.c: a dump record as ordered JSON members, built in C once per call and
 * written as lines of metadata.jsonl / session.jsonl (docs/dump-format.md#record-fields). */
#include "dump_record.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

void fi_record_init(fi_record *r)
{
    fi_buf_init(&r->text);
    r->m = NULL;
    r->n = r->cap = 0;
    r->keys = 0;
    r->open = (size_t)-1;
    r->start = 0;
}

static void free_child(fi_record *child)
{
    if (!child)
        return;
    fi_record_free(child);
    free(child);
}

void fi_record_free(fi_record *r)
{
    for (size_t i = 0; i < r->n; i++)
        free_child(r->m[i].child);
    free(r->m);
    fi_buf_free(&r->text);
    fi_record_init(r);
}

static int no_memory(void)
{
    PyErr_NoMemory();
    return -1;
}

/* A hash of a key's JSON text between its quotes, from its length and its first and last
 * eight bytes (no chain through every byte): members are told apart by it first, and
 * compared whole when it matches. */
static uint32_t key_hash(const char *s, size_t n)
{
    uint64_t a = 0, b = 0;
    if (n >= 8) {
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
    } else {
        for (size_t i = 0; i < n; i++)
            a |= (uint64_t)(unsigned char)s[i] << (8 * i);
    }
    uint64_t h = (a ^ 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
    h ^= (b + n) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return (uint32_t)(h >> 32);
}

/* The bit of r->keys for key hash h. */
static uint64_t key_bit(uint32_t h) { return 1ull << (h >> 26); }

/* Appends a member whose key, as JSON text, is at text[at..at+klen), of hash h. */
static void add_member(fi_record *r, size_t at, size_t klen, uint32_t h)
{
    r->m[r->n++] = (struct fi_record_member){at, klen, 0, 0, NULL, h};
    r->keys |= key_bit(h);
}

/* Whether key needs no escaping in JSON (its quoted form is '"' key '"'), with *hash its
 * key_hash then. */
static int plain_key(const char *key, size_t klen, uint32_t *hash)
{
    *hash = key_hash(key, klen);
    return fi_json_plain_prefix(key, klen) == klen;
}

/* The index of the member whose key, as JSON text, is q[0..qlen), or r->n. */
static size_t find_quoted(const fi_record *r, const char *q, size_t qlen)
{
    uint32_t h = key_hash(q + 1, qlen - 2);
    if (!(r->keys & key_bit(h)))
        return r->n;
    for (size_t i = 0; i < r->n; i++)
        if (r->m[i].hash == h && r->m[i].klen == qlen &&
            memcmp(r->text.data + r->m[i].key, q, qlen) == 0)
            return i;
    return r->n;
}

/* The index of key's member, or r->n when r has none (or out of memory); *plain_hash is the
 * key's key_hash when it needs no escaping, else 0 with *plain 0. The members keep their
 * keys as JSON text, which fi_record_render copies as it is. */
static size_t find(const fi_record *r, const char *key, size_t klen, int *plain,
                   uint32_t *plain_hash)
{
    uint32_t h;
    *plain = plain_key(key, klen, &h);
    *plain_hash = *plain ? h : 0;
    if (*plain) {
        if (!(r->keys & key_bit(h)))
            return r->n;
        for (size_t i = 0; i < r->n; i++) {
            const char *k = r->text.data + r->m[i].key;
            if (r->m[i].hash == h && r->m[i].klen == klen + 2 && memcmp(k + 1, key, klen) == 0)
                return i;
        }
        return r->n;
    }
    fi_buf q;
    fi_buf_init(&q);
    fi_json_str(&q, key, klen);
    size_t i = q.oom ? r->n : find_quoted(r, q.data, q.len);
    fi_buf_free(&q);
    return i;
}

/* Room for one more member: 0, or -1 when out of memory. */
static int grow(fi_record *r)
{
    if (r->n < r->cap)
        return 0;
    size_t cap = r->cap ? r->cap * 2 : 24;
    struct fi_record_member *m = realloc(r->m, cap * sizeof(*m));
    if (!m)
        return -1;
    r->m = m;
    r->cap = cap;
    return 0;
}

/* key's member, appended (its key stored, *made set) when r has none; r->n when out of
 * memory. */
static size_t member(fi_record *r, const char *key, size_t klen, int *made)
{
    int plain;
    uint32_t h;
    size_t i = find(r, key, klen, &plain, &h);
    *made = 0;
    if (i < r->n)
        return i;
    if (grow(r) < 0)
        return r->n;
    size_t at = r->text.len;
    if (fi_json_str(&r->text, key, klen) < 0)
        return r->n;
    size_t qlen = r->text.len - at;
    if (!plain)
        h = key_hash(r->text.data + at + 1, qlen - 2);
    add_member(r, at, qlen, h);
    *made = 1;
    return i;
}

fi_buf *fi_record_begin(fi_record *r, const char *key, size_t klen)
{
    int made;
    size_t i = member(r, key, klen, &made);
    if (i == r->n) {
        PyErr_NoMemory();
        return NULL;
    }
    r->open = i;
    r->open_new = made;
    r->start = r->text.len;
    return &r->text;
}

/* Gives up the value fi_record_begin started: a new member goes again, an old one keeps its
 * value. */
static void abort_value(fi_record *r)
{
    size_t end = r->start;
    if (r->open_new) {
        end = r->m[r->open].key;
        r->n--;
    }
    r->text.len = end;
    r->text.data[end] = '\0';
    r->open = (size_t)-1;
}

int fi_record_end(fi_record *r)
{
    struct fi_record_member *m = &r->m[r->open];
    r->open = (size_t)-1;
    if (r->text.oom)
        return no_memory();
    free_child(m->child); /* a value replaces a nested object */
    m->child = NULL;
    m->val = r->start;
    m->vlen = r->text.len - r->start;
    return 0;
}

static fi_record *child_of(fi_record *r, const char *key, size_t klen)
{
    int made;
    size_t i = member(r, key, klen, &made);
    if (i == r->n) {
        PyErr_NoMemory();
        return NULL;
    }
    if (r->m[i].child)
        return r->m[i].child;
    fi_record *child = malloc(sizeof(*child));
    if (!child) {
        PyErr_NoMemory();
        return NULL;
    }
    fi_record_init(child);
    r->m[i].child = child;
    return child;
}

fi_record *fi_record_child(fi_record *r, const char *key) { return child_of(r, key, strlen(key)); }

/* Moves the buffer src into dst (an inline buffer's bytes are copied); src is left empty. */
static void move_buf(fi_buf *dst, fi_buf *src)
{
    dst->len = src->len;
    dst->cap = src->cap;
    dst->oom = src->oom;
    if (src->data == src->inline_data) {
        dst->data = dst->inline_data;
        memcpy(dst->inline_data, src->inline_data, src->len + 1);
    } else { /* the heap block changes hands; the inline array is not in use */
        dst->data = src->data;
    }
    fi_buf_init(src);
}

void fi_record_move(fi_record *dst, fi_record *src)
{
    fi_record_free(dst);
    move_buf(&dst->text, &src->text);
    dst->m = src->m;
    dst->n = src->n;
    dst->cap = src->cap;
    dst->keys = src->keys;
    src->m = NULL;
    src->n = src->cap = 0;
    src->keys = 0;
}

int fi_record_take(fi_record *r, const char *key, fi_record *from)
{
    fi_record *child = fi_record_child(r, key);
    if (!child)
        return -1;
    fi_record_move(child, from);
    return 0;
}

int fi_record_update(fi_record *r, const fi_record *from)
{
    for (size_t i = 0; i < from->n; i++) {
        const struct fi_record_member *m = &from->m[i];
        const char *q = from->text.data + m->key; /* the key as JSON text */
        size_t k = find_quoted(r, q, m->klen);
        if (k == r->n) {
            if (grow(r) < 0)
                return no_memory();
            size_t at = r->text.len;
            if (fi_buf_append(&r->text, q, m->klen) < 0)
                return no_memory();
            add_member(r, at, m->klen, m->hash);
        }
        free_child(r->m[k].child);
        r->m[k].child = NULL;
        if (m->child) {
            fi_record *child = malloc(sizeof(*child));
            if (!child || fi_record_copy(child, m->child) < 0) {
                free(child);
                return no_memory();
            }
            r->m[k].child = child;
            continue;
        }
        size_t at = r->text.len;
        if (fi_buf_append(&r->text, from->text.data + m->val, m->vlen) < 0)
            return no_memory();
        r->m[k].val = at;
        r->m[k].vlen = m->vlen;
    }
    return 0;
}

static fi_buf *begin(fi_record *r, const char *key) { return fi_record_begin(r, key, strlen(key)); }

int fi_record_set_str(fi_record *r, const char *key, const char *s)
{
    fi_buf *b = begin(r, key);
    if (!b)
        return -1;
    fi_json_str(b, s, strlen(s));
    return fi_record_end(r);
}

int fi_record_set_raw(fi_record *r, const char *key, const char *json)
{
    fi_buf *b = begin(r, key);
    if (!b)
        return -1;
    fi_buf_puts(b, json);
    return fi_record_end(r);
}

int fi_record_set_int(fi_record *r, const char *key, long long v)
{
    fi_buf *b = begin(r, key);
    if (!b)
        return -1;
    fi_buf_put_i64(b, v);
    return fi_record_end(r);
}

int fi_record_set_double(fi_record *r, const char *key, double v)
{
    fi_buf *b = begin(r, key);
    if (!b)
        return -1;
    fi_json_double(b, v);
    return fi_record_end(r);
}

int fi_record_set_bool(fi_record *r, const char *key, int v)
{
    fi_buf *b = begin(r, key);
    if (!b)
        return -1;
    fi_json_bool(b, v);
    return fi_record_end(r);
}

int fi_record_set_py(fi_record *r, const char *key, PyObject *obj)
{
    fi_buf *b = begin(r, key);
    if (!b)
        return -1;
    if (fi_json_from_py(b, obj) < 0) {
        abort_value(r);
        return -1;
    }
    return fi_record_end(r);
}

const char *fi_record_get(const fi_record *r, const char *key, size_t *len)
{
    int plain;
    uint32_t h;
    size_t i = find(r, key, strlen(key), &plain, &h);
    if (i == r->n || r->m[i].child)
        return NULL;
    *len = r->m[i].vlen;
    return r->text.data + r->m[i].val;
}

int fi_record_render(const fi_record *r, fi_buf *out)
{
    fi_buf_putc(out, '{');
    for (size_t i = 0; i < r->n; i++) {
        const struct fi_record_member *m = &r->m[i];
        if (i)
            fi_buf_append(out, ", ", 2);
        fi_buf_append(out, r->text.data + m->key, m->klen);
        fi_buf_append(out, ": ", 2);
        if (m->child)
            fi_record_render(m->child, out);
        else if (m->vlen == 0)
            fi_buf_append(out, "null", 4);
        else
            fi_buf_append(out, r->text.data + m->val, m->vlen);
    }
    return fi_buf_putc(out, '}') < 0 || out->oom ? no_memory() : 0;
}

int fi_record_copy(fi_record *dst, const fi_record *src)
{
    fi_record_init(dst);
    if (fi_buf_append(&dst->text, src->text.data, src->text.len) < 0)
        return no_memory();
    if (src->n) {
        dst->m = malloc(src->n * sizeof(*dst->m));
        if (!dst->m) {
            fi_record_free(dst);
            return no_memory();
        }
        memcpy(dst->m, src->m, src->n * sizeof(*dst->m));
        dst->n = dst->cap = src->n;
        dst->keys = src->keys;
        for (size_t i = 0; i < dst->n; i++)
            dst->m[i].child = NULL;
        for (size_t i = 0; i < dst->n; i++) {
            if (!src->m[i].child)
                continue;
            fi_record *child = malloc(sizeof(*child));
            if (!child || fi_record_copy(child, src->m[i].child) < 0) {
                free(child);
                fi_record_free(dst);
                return no_memory();
            }
            dst->m[i].child = child;
        }
    }
    return 0;
}
