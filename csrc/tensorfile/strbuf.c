/* strbuf.c: a growable byte buffer with an inline first block. A failed allocation sets
 * oom and later appends are ignored, so a caller checks once, after building a record. */
#include "strbuf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fi_buf_init(fi_buf *b)
{
    b->data = b->inline_data;
    b->len = 0;
    b->cap = FI_BUF_INLINE;
    b->oom = 0;
    b->inline_data[0] = '\0';
}

void fi_buf_free(fi_buf *b)
{
    if (b->data != b->inline_data)
        free(b->data);
    fi_buf_init(b);
}

void fi_buf_reset(fi_buf *b)
{
    b->len = 0;
    b->data[0] = '\0';
}

/* Makes room for extra more bytes plus the terminating NUL. */
static int reserve(fi_buf *b, size_t extra)
{
    if (b->oom)
        return -1;
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap * 2;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p;
    if (b->data == b->inline_data) {
        p = malloc(cap);
        if (p)
            memcpy(p, b->data, b->len + 1);
    } else {
        p = realloc(b->data, cap);
    }
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

int fi_buf_append_slow(fi_buf *b, const char *s, size_t n)
{
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int fi_buf_put_u64(fi_buf *b, unsigned long long v)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930"
                                "31323334353637383940414243444546474849505152535455565758596061"
                                "6263646566676869707172737475767778798081828384858687888990919293"
                                "949596979899";
    char digits[24];
    int n = sizeof digits;
    while (v >= 100) { /* two digits per division */
        unsigned k = (unsigned)(v % 100) * 2;
        v /= 100;
        digits[--n] = pairs[k + 1];
        digits[--n] = pairs[k];
    }
    if (v >= 10) {
        digits[--n] = pairs[v * 2 + 1];
        digits[--n] = pairs[v * 2];
    } else {
        digits[--n] = (char)('0' + v);
    }
    return fi_buf_append(b, digits + n, sizeof digits - (size_t)n);
}

int fi_buf_put_i64(fi_buf *b, long long v)
{
    if (v < 0) {
        fi_buf_putc(b, '-');
        return fi_buf_put_u64(b, 0ull - (unsigned long long)v);
    }
    return fi_buf_put_u64(b, (unsigned long long)v);
}

int fi_buf_put_fixed6(fi_buf *b, double v)
{
    /* v * 1e6 rounded to an integer is exact printf rounding unless the product lies
     * within a few ulps of a halfway point (its own rounding could have moved it across)
     * or is too large for the integer; those cases, and inf/nan, go to printf. */
    double scaled = fabs(v) * 1e6;
    if (!(scaled < 0x1p52))
        return fi_buf_printf(b, "%.6f", v);
    double whole = floor(scaled);
    double frac = scaled - whole;
    if (fabs(frac - 0.5) <= 8 * scaled * 0x1p-52 + 0x1p-60)
        return fi_buf_printf(b, "%.6f", v);
    unsigned long long units = (unsigned long long)whole + (frac > 0.5);
    char digits[32];
    int n = sizeof digits;
    for (int i = 0; i < 6; i++, units /= 10)
        digits[--n] = (char)('0' + units % 10);
    digits[--n] = '.';
    do {
        digits[--n] = (char)('0' + units % 10);
        units /= 10;
    } while (units);
    if (signbit(v))
        digits[--n] = '-';
    return fi_buf_append(b, digits + n, sizeof digits - (size_t)n);
}

int fi_buf_vprintf(fi_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(b->data + b->len, b->oom ? 0 : b->cap - b->len, fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return -1;
    }
    if (b->oom || (size_t)n >= b->cap - b->len) {
        if (reserve(b, (size_t)n) < 0) {
            va_end(ap2);
            return -1;
        }
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap2);
    }
    va_end(ap2);
    b->len += (size_t)n;
    return 0;
}

int fi_buf_printf(fi_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = fi_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return r;
}

int fi_buf_indent(fi_buf *b, int level)
{
    static const char spaces[] = "                                                                ";
    size_t n = (size_t)(level > 0 ? level : 0) * 2;
    while (n > 0) {
        size_t k = n < sizeof(spaces) - 1 ? n : sizeof(spaces) - 1;
        if (fi_buf_append(b, spaces, k) < 0)
            return -1;
        n -= k;
    }
    return 0;
}
