/* strbuf.h: a growable byte buffer for building log records and JSON lines.
 * Starts in an inline array so short records never touch the heap. */
#ifndef FI_STRBUF_H
#define FI_STRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#define FI_BUF_INLINE 512

typedef struct {
    char *data; /* inline or heap, always NUL-terminated */
    size_t len;
    size_t cap;
    int oom; /* set once an allocation failed; later appends are ignored */
    char inline_data[FI_BUF_INLINE];
} fi_buf;

void fi_buf_init(fi_buf *b);
void fi_buf_free(fi_buf *b);
void fi_buf_reset(fi_buf *b);
/* fi_buf_append when the buffer must grow (or has failed to). */
int fi_buf_append_slow(fi_buf *b, const char *s, size_t n);

/* Each append returns 0, or -1 after an allocation failure (b->oom set). Inline: a log
 * record is a hundred or more small appends, most of them of constant strings. */
static inline int fi_buf_append(fi_buf *b, const char *s, size_t n)
{
    if (n >= b->cap - b->len || b->oom) /* no room for s and the NUL */
        return fi_buf_append_slow(b, s, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static inline int fi_buf_puts(fi_buf *b, const char *s) { return fi_buf_append(b, s, strlen(s)); }

static inline int fi_buf_putc(fi_buf *b, char c) { return fi_buf_append(b, &c, 1); }
/* Decimal digits, without printf (records are built on every call). */
int fi_buf_put_u64(fi_buf *b, unsigned long long v);
int fi_buf_put_i64(fi_buf *b, long long v);
/* printf's "%.6f", digit for digit, without printf for the values it can prove. */
int fi_buf_put_fixed6(fi_buf *b, double v);
int fi_buf_printf(fi_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fi_buf_vprintf(fi_buf *b, const char *fmt, va_list ap);
/* Two spaces per level. */
int fi_buf_indent(fi_buf *b, int level);

#endif
