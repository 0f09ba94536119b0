/* dump_record.h: a dump record (docs/dump-format.md#record-fields) built as JSON text in C, once
 * per call: an object whose members keep their order, a key set again keeping its place and
 * taking the new value, as the Python dict it replaces did. Each value is kept as its JSON
 * text; a nested object that is extended later (tensor_info, tensor_details) is a child. */
#ifndef FI_DUMP_RECORD_H
#define FI_DUMP_RECORD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "strbuf.h"

typedef struct fi_record fi_record;

struct fi_record {
    fi_buf text; /* the keys' bytes and the values' JSON text, one after another */
    struct fi_record_member {
        size_t key, klen; /* the key as JSON text ("..." escaped) in text */
        size_t val, vlen; /* its value's JSON text in text (child NULL) */
        fi_record *child; /* or its value, a nested object (owned) */
        uint32_t hash;    /* of the key (dump_record.c: key_hash) */
    } *m;
    size_t n, cap;
    uint64_t keys; /* bit (hash & 63) of each member's key hash: a key whose bit is clear is
                    * not a member, without looking */
    size_t open;   /* the member fi_record_begin started, while its value is written */
    size_t start;  /* where that value starts in text */
    int open_new;  /* that member is new */
};

void fi_record_init(fi_record *r);
void fi_record_free(fi_record *r);

/* Starts key's value: the caller appends its JSON text to the buffer returned, then calls
 * fi_record_end. NULL (MemoryError) when out of memory. */
fi_buf *fi_record_begin(fi_record *r, const char *key, size_t klen);
/* 0, or -1 with MemoryError set when the buffer ran out of memory meanwhile. */
int fi_record_end(fi_record *r);

/* key's value as a nested object (made empty when key is new or held a value); NULL with
 * MemoryError set. */
fi_record *fi_record_child(fi_record *r, const char *key);
/* key's value becomes the object from holds (moved: from is left empty). -1 MemoryError. */
int fi_record_take(fi_record *r, const char *key, fi_record *from);
/* Sets each member of from in r, as dict.update does. -1 MemoryError. */
int fi_record_update(fi_record *r, const fi_record *from);

/* key = JSON text as it is, a string, an integer, a float (as repr), a bool, or obj as json.dumps
 * writes it; -1 with an exception set. */
int fi_record_set_raw(fi_record *r, const char *key, const char *json);
int fi_record_set_str(fi_record *r, const char *key, const char *s);
int fi_record_set_int(fi_record *r, const char *key, long long v);
int fi_record_set_double(fi_record *r, const char *key, double v);
int fi_record_set_bool(fi_record *r, const char *key, int v);
int fi_record_set_py(fi_record *r, const char *key, PyObject *obj);

/* The JSON text of key's value ("..." for a string), or NULL when r has no such member or it
 * is a nested object; *len gets its length. */
const char *fi_record_get(const fi_record *r, const char *key, size_t *len);

/* Appends r as json.dumps would write the dict it stands for. -1 MemoryError. */
int fi_record_render(const fi_record *r, fi_buf *out);

/* dst (freed first) takes what src holds; src is left empty. */
void fi_record_move(fi_record *dst, fi_record *src);

/* A deep copy of src in dst (initialised here). -1 MemoryError (dst then holds nothing). */
int fi_record_copy(fi_record *dst, const fi_record *src);

#endif
