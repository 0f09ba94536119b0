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
    char digits[24];
    int n = sizeof digits;
    do {
        digits[--n] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
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
