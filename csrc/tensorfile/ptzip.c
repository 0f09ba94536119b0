/* ptzip.c: PyTorch zip archives (torch.save's format): written record by record
 * straight from tensor memory, and parsed strictly (stored records only) for loading. */
#include "ptzip.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32.h"
#include "pickle.h"

#define PTZIP_ALIGN 64
#define ZIP32_MAX 0xffffffffu
#define ARCHIVE "archive"

typedef struct {
    char name[64];
    uint64_t header_off, size;
    uint32_t crc;
} record;

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    put16(p, (uint16_t)v);
    put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return get16(p) | (uint32_t)get16(p + 2) << 16; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Local header + name + zip64 sizes when needed + "FB" padding so the data starts on a
 * 64-byte boundary (what torch.load(mmap=True) maps). The CRC is patched in later. */
static int write_local_header(fi_out *o, record *rec, uint32_t crc)
{
    uint8_t h[30 + 64 + 20 + 4 + PTZIP_ALIGN];
    size_t name_len = strlen(rec->name);
    int zip64 = rec->size >= ZIP32_MAX;
    size_t pos = 30 + name_len + (zip64 ? 20 : 0);
    size_t pad = (PTZIP_ALIGN - (o->pos + pos + 4) % PTZIP_ALIGN) % PTZIP_ALIGN;
    rec->header_off = o->pos;
    put32(h, 0x04034b50);
    put16(h + 4, zip64 ? 45 : 20);
    put16(h + 6, 0x0800); /* names are UTF-8 */
    put16(h + 8, 0);      /* stored */
    put16(h + 10, 0);
    put16(h + 12, 0x21); /* 1980-01-01 */
    put32(h + 14, crc);
    put32(h + 18, zip64 ? ZIP32_MAX : (uint32_t)rec->size);
    put32(h + 22, zip64 ? ZIP32_MAX : (uint32_t)rec->size);
    put16(h + 26, (uint16_t)name_len);
    put16(h + 28, (uint16_t)(pos - 30 - name_len + 4 + pad));
    memcpy(h + 30, rec->name, name_len);
    if (zip64) {
        uint8_t *x = h + 30 + name_len;
        put16(x, 1);
        put16(x + 2, 16);
        put64(x + 4, rec->size);
        put64(x + 12, rec->size);
    }
    h[pos] = 'F';
    h[pos + 1] = 'B';
    put16(h + pos + 2, (uint16_t)pad);
    memset(h + pos + 4, 'Z', pad);
    return fi_out_write(o, h, pos + 4 + pad);
}

static int write_small_record(fi_out *o, record *rec, const char *name, const void *data,
                              size_t size)
{
    snprintf(rec->name, sizeof(rec->name), ARCHIVE "/%s", name);
    rec->size = size;
    rec->crc = fi_crc32(0, data, size);
    if (write_local_header(o, rec, rec->crc) < 0)
        return -1;
    return fi_out_write(o, data, size);
}

/* Tensor bytes go out in blocks, checksummed (and their statistics taken, when asked)
 * while still in cache; the CRC goes into the local header with one pwrite afterwards. */
static int write_tensor_record(fi_out *o, record *rec, size_t index, const fi_saved_tensor *s)
{
    snprintf(rec->name, sizeof(rec->name), ARCHIVE "/data/%zu", index);
    rec->size = s->span_bytes;
    if (write_local_header(o, rec, 0) < 0)
        return -1;
    uint32_t crc = 0;
    /* a ring image's CRCs are filled in when (if ever) it is written out */
    if (fi_out_write_dense(o, s, rec->size, o->defer_crc ? NULL : &crc) < 0)
        return -1;
    rec->crc = crc;
    if (crc == 0)
        return 0;
    uint8_t le[4];
    put32(le, crc);
    if (fi_out_flush(o) < 0)
        return -1;
    return fi_out_pwrite(o, le, 4, rec->header_off + 14);
}

static int write_central(fi_out *o, const record *recs, size_t n)
{
    uint64_t cd_start = o->pos;
    for (size_t i = 0; i < n; i++) {
        const record *rec = &recs[i];
        uint8_t h[46 + 64 + 28];
        size_t name_len = strlen(rec->name);
        int big_size = rec->size >= ZIP32_MAX, big_off = rec->header_off >= ZIP32_MAX;
        size_t extra = big_size || big_off ? 4 + (big_size ? 16 : 0) + (big_off ? 8 : 0) : 0;
        put32(h, 0x02014b50);
        put16(h + 4, 0x031e); /* made by unix, spec 3.0 */
        put16(h + 6, extra ? 45 : 20);
        put16(h + 8, 0x0800);
        put16(h + 10, 0);
        put16(h + 12, 0);
        put16(h + 14, 0x21);
        put32(h + 16, rec->crc);
        put32(h + 20, big_size ? ZIP32_MAX : (uint32_t)rec->size);
        put32(h + 24, big_size ? ZIP32_MAX : (uint32_t)rec->size);
        put16(h + 28, (uint16_t)name_len);
        put16(h + 30, (uint16_t)extra);
        put16(h + 32, 0);
        put16(h + 34, 0);
        put16(h + 36, 0);
        put32(h + 38, 0100644u << 16);
        put32(h + 42, big_off ? ZIP32_MAX : (uint32_t)rec->header_off);
        memcpy(h + 46, rec->name, name_len);
        uint8_t *x = h + 46 + name_len;
        if (extra) {
            put16(x, 1);
            put16(x + 2, (uint16_t)(extra - 4));
            x += 4;
            if (big_size) {
                put64(x, rec->size);
                put64(x + 8, rec->size);
                x += 16;
            }
            if (big_off)
                put64(x, rec->header_off);
        }
        if (fi_out_write(o, h, 46 + name_len + extra) < 0)
            return -1;
    }
    uint64_t cd_size = o->pos - cd_start, z64 = o->pos;
    uint8_t e[56 + 20 + 22];
    put32(e, 0x06064b50);
    put64(e + 4, 44);
    put16(e + 12, 0x031e);
    put16(e + 14, 45);
    put32(e + 16, 0);
    put32(e + 20, 0);
    put64(e + 24, n);
    put64(e + 32, n);
    put64(e + 40, cd_size);
    put64(e + 48, cd_start);
    put32(e + 56, 0x07064b50);
    put32(e + 60, 0);
    put64(e + 64, z64);
    put32(e + 72, 1);
    uint8_t *d = e + 76;
    put32(d, 0x06054b50);
    put16(d + 4, 0);
    put16(d + 6, 0);
    put16(d + 8, n >= 0xffff ? 0xffff : (uint16_t)n);
    put16(d + 10, n >= 0xffff ? 0xffff : (uint16_t)n);
    put32(d + 12, cd_size >= ZIP32_MAX ? ZIP32_MAX : (uint32_t)cd_size);
    put32(d + 16, cd_start >= ZIP32_MAX ? ZIP32_MAX : (uint32_t)cd_start);
    put16(d + 20, 0);
    return fi_out_write(o, e, sizeof(e));
}

int fi_ptzip_write(fi_out *o, const fi_saved_tensor *ts, size_t n, const char *pickle,
                   size_t pickle_len)
{
    size_t nrec = n + 7;
    record *recs = calloc(nrec, sizeof(record));
    if (!recs) {
        o->err = ENOMEM;
        return -1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char serial[48];
    snprintf(serial, sizeof(serial), "%020llu%020llu",
             (unsigned long long)now.tv_sec * 1000000000ull + (unsigned long long)now.tv_nsec,
             (unsigned long long)getpid() * 2654435761ull % 100000000000000000ull);
    size_t r = 0;
    int rc = write_small_record(o, &recs[r++], "data.pkl", pickle, pickle_len);
    rc = rc < 0 ? -1 : write_small_record(o, &recs[r++], ".format_version", "1", 1);
    rc = rc < 0 ? -1 : write_small_record(o, &recs[r++], ".storage_alignment", "64", 2);
    rc = rc < 0 ? -1 : write_small_record(o, &recs[r++], "byteorder", "little", 6);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = write_tensor_record(o, &recs[r++], i, &ts[i]);
    rc = rc < 0 ? -1 : write_small_record(o, &recs[r++], "version", "3\n", 2);
    rc = rc < 0 ? -1 : write_small_record(o, &recs[r++], ".data/serialization_id", serial, 40);
    rc = rc < 0 ? -1 : write_central(o, recs, r);
    free(recs);
    return rc;
}

/* The zip64 extra field of a central record: the 64-bit size and local header offset
 * where the 32-bit fields hold ZIP32_MAX (in that order, as write_central puts them). */
static void central_sizes(const uint8_t *c, uint64_t *size, uint64_t *off)
{
    *size = get32(c + 24);
    *off = get32(c + 42);
    const uint8_t *x = c + 46 + get16(c + 28);
    if (get16(c + 30) < 4 || get16(x) != 1)
        return;
    const uint8_t *f = x + 4;
    if (*size == ZIP32_MAX) {
        *size = get64(f);
        f += 16;
    }
    if (*off == ZIP32_MAX)
        *off = get64(f);
}

/* Async-signal-safe (pure computation over d): no allocation, no locks. */
int fi_ptzip_fill_crcs(uint8_t *d, size_t size)
{
    if (size < 98 || get32(d + size - 22) != 0x06054b50 || get32(d + size - 42) != 0x07064b50)
        return -1;
    uint64_t z64 = get64(d + size - 42 + 8);
    if (z64 > size - 56 || get32(d + z64) != 0x06064b50)
        return -1;
    uint64_t count = get64(d + z64 + 32), cd_size = get64(d + z64 + 40), p = get64(d + z64 + 48);
    if (p > size || cd_size > size - p)
        return -1;
    uint64_t cd_end = p + cd_size;
    for (uint64_t i = 0; i < count; i++) {
        uint8_t *c = d + p;
        if (p + 46 > cd_end || get32(c) != 0x02014b50)
            return -1;
        uint64_t next = p + 46 + get16(c + 28) + get16(c + 30) + get16(c + 32);
        if (next > cd_end)
            return -1;
        uint64_t rsize, off;
        central_sizes(c, &rsize, &off);
        if (get32(c + 16) == 0 && rsize > 0) {
            if (off > size - 30)
                return -1;
            uint64_t data = off + 30 + get16(d + off + 26) + get16(d + off + 28);
            if (data > size || rsize > size - data)
                return -1;
            uint32_t crc = fi_crc32(0, d + data, (size_t)rsize);
            put32(c + 16, crc);
            put32(d + off + 14, crc);
        }
        p = next;
    }
    return 0;
}

/* ---- reader ---- */

typedef struct {
    const uint8_t *name;
    size_t name_len;
    uint64_t data_off, size;
    uint32_t crc;
} entry;

int fi_ptzip_sniff(const uint8_t *data, size_t size)
{
    return size >= 4 && data[0] == 'P' && data[1] == 'K' &&
           ((data[2] == 3 && data[3] == 4) || (data[2] == 5 && data[3] == 6));
}

static int zip_error(const char *path, const char *problem)
{
    PyErr_Format(PyExc_ValueError, "%s: not a valid PyTorch zip file: %s", path, problem);
    return -1;
}

/* Finds the central directory (through the zip64 records when present). */
static int find_central(const char *path, const uint8_t *d, size_t size, uint64_t *cd_off,
                        uint64_t *cd_size, uint64_t *count)
{
    if (size < 22)
        return zip_error(path, "too short for an end of central directory record");
    size_t lowest = size - 22 > 65535 ? size - 22 - 65535 : 0;
    size_t e = size - 22 + 1;
    do {
        e--;
        if (get32(d + e) == 0x06054b50)
            break;
    } while (e > lowest);
    if (get32(d + e) != 0x06054b50)
        return zip_error(path, "end of central directory record not found");
    *count = get16(d + e + 10);
    *cd_size = get32(d + e + 12);
    *cd_off = get32(d + e + 16);
    if (e >= 20 && get32(d + e - 20) == 0x07064b50) {
        uint64_t z = get64(d + e - 20 + 8);
        if (size < 56 || z > size - 56 || get32(d + z) != 0x06064b50)
            return zip_error(path, "bad zip64 end of central directory record");
        *count = get64(d + z + 32);
        *cd_size = get64(d + z + 40);
        *cd_off = get64(d + z + 48);
    }
    if (*cd_off > size || *cd_size > size - *cd_off)
        return zip_error(path, "central directory lies outside the file");
    if (*count > *cd_size / 46)
        return zip_error(path, "more entries declared than the central directory holds");
    return 0;
}

/* Reads the zip64 extra field for the members that overflow 32 bits. */
static int zip64_extra(const uint8_t *x, size_t len, uint64_t *usize, uint64_t *csize,
                       uint64_t *off)
{
    while (len >= 4) {
        uint16_t id = get16(x), n = get16(x + 2);
        if ((size_t)n + 4 > len)
            return -1;
        if (id == 1) {
            const uint8_t *f = x + 4;
            size_t left = n;
            uint64_t *fields[3] = {usize, csize, off};
            for (int k = 0; k < 3; k++) {
                if (*fields[k] != ZIP32_MAX)
                    continue;
                if (left < 8)
                    return -1;
                *fields[k] = get64(f);
                f += 8;
                left -= 8;
            }
            return 0;
        }
        x += 4 + n;
        len -= 4 + (size_t)n;
    }
    return 0;
}

static int read_entries(const char *path, const uint8_t *d, size_t size, entry **out, size_t *nout)
{
    uint64_t cd_off, cd_size, count;
    if (find_central(path, d, size, &cd_off, &cd_size, &count) < 0)
        return -1;
    entry *es = PyMem_Calloc(count ? count : 1, sizeof(entry));
    if (!es) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t p = cd_off, end = cd_off + cd_size;
    for (uint64_t i = 0; i < count; i++) {
        char why[96];
        if (end - p < 46 || get32(d + p) != 0x02014b50) {
            snprintf(why, sizeof(why), "central directory entry %llu is malformed",
                     (unsigned long long)i);
            goto bad;
        }
        uint16_t method = get16(d + p + 10), nl = get16(d + p + 28), xl = get16(d + p + 30),
                 cl = get16(d + p + 32);
        uint64_t csize = get32(d + p + 20), usize = get32(d + p + 24), loff = get32(d + p + 42);
        if (end - p - 46 < (uint64_t)nl + xl + cl) {
            snprintf(why, sizeof(why), "central directory entry %llu overruns it",
                     (unsigned long long)i);
            goto bad;
        }
        if (zip64_extra(d + p + 46 + nl, xl, &usize, &csize, &loff) < 0) {
            snprintf(why, sizeof(why), "entry %llu has a bad zip64 field", (unsigned long long)i);
            goto bad;
        }
        if (method != 0 || csize != usize) {
            snprintf(why, sizeof(why), "entry %llu is compressed (method %u); only stored records",
                     (unsigned long long)i, method);
            goto bad;
        }
        if (size < 30 || loff > size - 30 || get32(d + loff) != 0x04034b50) {
            snprintf(why, sizeof(why), "entry %llu has no local header at offset %llu",
                     (unsigned long long)i, (unsigned long long)loff);
            goto bad;
        }
        uint64_t data_off = loff + 30 + get16(d + loff + 26) + get16(d + loff + 28);
        if (data_off > size || usize > size - data_off) {
            snprintf(why, sizeof(why), "entry %llu claims %llu bytes beyond the end of the file",
                     (unsigned long long)i, (unsigned long long)usize);
            goto bad;
        }
        es[i] = (entry){d + p + 46, nl, data_off, usize, get32(d + p + 16)};
        p += 46 + (uint64_t)nl + xl + cl;
        continue;
    bad:
        PyMem_Free(es);
        return zip_error(path, why);
    }
    *out = es;
    *nout = (size_t)count;
    return 0;
}

static const entry *find_entry(const entry *es, size_t n, const uint8_t *prefix, size_t prefix_len,
                               const char *mid, const char *name, size_t name_len)
{
    size_t mid_len = strlen(mid);
    for (size_t i = 0; i < n; i++) {
        const entry *e = &es[i];
        if (e->name_len == prefix_len + mid_len + name_len &&
            memcmp(e->name, prefix, prefix_len) == 0 &&
            memcmp(e->name + prefix_len, mid, mid_len) == 0 &&
            memcmp(e->name + prefix_len + mid_len, name, name_len) == 0)
            return e;
    }
    return NULL;
}

/* Points each tensor at its storage record data/<key> beside data.pkl. */
static int locate_storages(const char *path, const entry *es, size_t n, const entry *pkl,
                           size_t prefix_len, fi_loaded_tensor *ts, size_t nt)
{
    for (size_t k = 0; k < nt; k++) {
        fi_loaded_tensor *lt = &ts[k];
        const entry *rec = find_entry(es, n, pkl->name, prefix_len, "/data/", lt->storage_key,
                                      lt->storage_key_len);
        if (!rec || rec->size < lt->data_nbytes) {
            char key[72];
            size_t kl = lt->storage_key_len < 64 ? lt->storage_key_len : 64;
            memcpy(key, lt->storage_key, kl);
            key[kl] = '\0';
            PyErr_Format(PyExc_ValueError,
                         "%s: tensor %R: storage record data/%s is %s (needs %llu bytes)", path,
                         lt->key, key, rec ? "too short" : "missing",
                         (unsigned long long)lt->data_nbytes);
            return -1;
        }
        lt->data_offset = rec->data_off;
    }
    return 0;
}

int fi_ptzip_describe(const char *path, const uint8_t *data, size_t size, fi_loaded_tensor **out,
                      size_t *count)
{
    entry *es;
    size_t n;
    if (read_entries(path, data, size, &es, &n) < 0)
        return -1;
    const entry *pkl = NULL;
    size_t prefix_len = 0;
    for (size_t i = 0; i < n && !pkl; i++) {
        const uint8_t *slash = memchr(es[i].name, '/', es[i].name_len);
        if (slash && (size_t)(es[i].name + es[i].name_len - slash) == 9 &&
            memcmp(slash, "/data.pkl", 9) == 0) {
            pkl = &es[i];
            prefix_len = (size_t)(slash - es[i].name);
        }
    }
    int r = -1;
    if (!pkl)
        zip_error(path, "no data.pkl record");
    else if (fi_crc32(0, data + pkl->data_off, pkl->size) != pkl->crc)
        zip_error(path, "data.pkl fails its CRC-32 check");
    else if (fi_pickle_read_tensors(data + pkl->data_off, pkl->size, path, out, count) == 0) {
        r = locate_storages(path, es, n, pkl, prefix_len, *out, *count);
        if (r < 0)
            fi_loaded_tensors_free(*out, *count);
    }
    PyMem_Free(es);
    return r;
}
