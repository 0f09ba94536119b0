/* json.c: JSON writer byte-identical to json.dumps with default settings, and a
 * small strict JSON parser for headers we read back (safetensors). */
#include "json.h"

#include <math.h>
#include <string.h>

#include "float_repr.h"

static const char hexdigits[] = "0123456789abcdef";

/* One code point as json.dumps(ensure_ascii=True) writes it inside a string. */
static int put_codepoint(fi_buf *b, uint32_t c)
{
    char esc[12];
    switch (c) {
    case '"':
        return fi_buf_append(b, "\\\"", 2);
    case '\\':
        return fi_buf_append(b, "\\\\", 2);
    case '\n':
        return fi_buf_append(b, "\\n", 2);
    case '\r':
        return fi_buf_append(b, "\\r", 2);
    case '\t':
        return fi_buf_append(b, "\\t", 2);
    case '\b':
        return fi_buf_append(b, "\\b", 2);
    case '\f':
        return fi_buf_append(b, "\\f", 2);
    default:
        break;
    }
    if (c >= 0x20 && c < 0x7f)
        return fi_buf_putc(b, (char)c);
    if (c >= 0x10000) {
        uint32_t v = c - 0x10000;
        uint32_t hi = 0xd800 | (v >> 10), lo = 0xdc00 | (v & 0x3ff);
        if (put_codepoint(b, hi) < 0)
            return -1;
        return put_codepoint(b, lo);
    }
    esc[0] = '\\';
    esc[1] = 'u';
    esc[2] = hexdigits[(c >> 12) & 0xf];
    esc[3] = hexdigits[(c >> 8) & 0xf];
    esc[4] = hexdigits[(c >> 4) & 0xf];
    esc[5] = hexdigits[c & 0xf];
    return fi_buf_append(b, esc, 6);
}

/* Decodes one UTF-8 sequence at s[*i]; invalid input yields U+FFFD and one byte. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *i)
{
    unsigned char c = s[*i];
    int len = c < 0x80             ? 1
              : (c & 0xe0) == 0xc0 ? 2
              : (c & 0xf0) == 0xe0 ? 3
              : (c & 0xf8) == 0xf0 ? 4
                                   : 0;
    if (len == 1) {
        (*i)++;
        return c;
    }
    if (len == 0 || *i + (size_t)len > n) {
        (*i)++;
        return 0xfffd;
    }
    uint32_t cp = c & (0x7f >> len);
    for (int k = 1; k < len; k++) {
        if ((s[*i + (size_t)k] & 0xc0) != 0x80) {
            (*i)++;
            return 0xfffd;
        }
        cp = (cp << 6) | (s[*i + (size_t)k] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) {
        (*i)++;
        return 0xfffd;
    }
    *i += (size_t)len;
    return cp;
}

/* The bytes of w that need an escape, as their high bits (some of them: zero when none). */
static uint64_t escaped_bytes(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = w ^ (ones * '"'), bs = w ^ (ones * '\\'), del = w ^ (ones * 0x7f);
    /* (x - ones * k) & ~x & high is nonzero when a byte of x is below k (k <= 0x80); a
     * byte of x ^ ones * c that is zero is a byte c; w & high, a byte of 0x80 or more */
    return (((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((bs - ones) & ~bs) |
            ((del - ones) & ~del) | w) &
           high;
}

size_t fi_json_plain_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, u + i, 8);
        if (escaped_bytes(w))
            break;
    }
    if (i + 8 > n && i < n) { /* the last 1..7 bytes, padded with a plain byte */
        uint64_t w = 0x6161616161616161ull;
        for (size_t k = 0; k < n - i; k++)
            w = (w & ~(0xffull << (8 * k))) | (uint64_t)u[i + k] << (8 * k);
        if (!escaped_bytes(w))
            return n;
    }
    while (i < n && u[i] >= 0x20 && u[i] < 0x7f && u[i] != '"' && u[i] != '\\')
        i++;
    return i;
}

int fi_json_str(fi_buf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = fi_json_plain_prefix(s, n);
    if (i == n && !b->oom && n + 2 < b->cap - b->len) { /* all of it, and the quotes */
        char *d = b->data + b->len;
        d[0] = '"';
        memcpy(d + 1, s, n);
        d[n + 1] = '"';
        d[n + 2] = '\0';
        b->len += n + 2;
        return 0;
    }
    if (fi_buf_putc(b, '"') < 0)
        return -1;
    if (i > 0 && fi_buf_append(b, s, i) < 0)
        return -1;
    while (i < n) {
        size_t run = i;
        while (run < n && u[run] >= 0x20 && u[run] < 0x7f && u[run] != '"' && u[run] != '\\')
            run++;
        if (run > i) {
            if (fi_buf_append(b, s + i, run - i) < 0)
                return -1;
            i = run;
            continue;
        }
        if (put_codepoint(b, utf8_next(u, n, &i)) < 0)
            return -1;
    }
    return fi_buf_putc(b, '"');
}

int fi_json_double(fi_buf *b, double v)
{
    if (isnan(v))
        return fi_buf_append(b, "NaN", 3);
    if (isinf(v))
        return v > 0 ? fi_buf_append(b, "Infinity", 8) : fi_buf_append(b, "-Infinity", 9);
    char s[FI_FLOAT_REPR_MAX];
    return fi_buf_append(b, s, fi_float_repr(v, s));
}

int fi_json_int64(fi_buf *b, int64_t v) { return fi_buf_put_i64(b, (long long)v); }

int fi_json_bool(fi_buf *b, int v)
{
    return v ? fi_buf_append(b, "true", 4) : fi_buf_append(b, "false", 5);
}

int fi_json_null(fi_buf *b) { return fi_buf_append(b, "null", 4); }

static int oom(void)
{
    PyErr_NoMemory();
    return -1;
}

static int put_pystr(fi_buf *b, PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (PyUnicode_IS_ASCII(s)) /* the common case: its bytes are its UTF-8 */
        return fi_json_str(b, data, (size_t)n) < 0 ? oom() : 0;
    if (fi_buf_putc(b, '"') < 0)
        return oom();
    for (Py_ssize_t i = 0; i < n; i++)
        if (put_codepoint(b, PyUnicode_READ(kind, data, i)) < 0)
            return oom();
    return fi_buf_putc(b, '"') < 0 ? oom() : 0;
}

/* Appends the result of a repr slot (int.__repr__ for int subclasses, like json). */
static int put_repr(fi_buf *b, PyObject *obj, reprfunc repr)
{
    PyObject *s = repr(obj);
    if (!s)
        return -1;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    int r = u ? (fi_buf_append(b, u, (size_t)n) < 0 ? oom() : 0) : -1;
    Py_DECREF(s);
    return r;
}

int fi_json_pyint(fi_buf *b, PyObject *obj)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (!overflow)
        return fi_buf_put_i64(b, v) < 0 ? oom() : 0;
    return put_repr(b, obj, PyLong_Type.tp_repr);
}

/* Dict keys become strings the way json.dumps converts them. */
static int put_key(fi_buf *b, PyObject *key)
{
    if (PyUnicode_Check(key))
        return put_pystr(b, key);
    if (fi_buf_putc(b, '"') < 0)
        return oom();
    int r;
    if (PyFloat_Check(key))
        r = fi_json_double(b, PyFloat_AS_DOUBLE(key)) < 0 ? oom() : 0;
    else if (key == Py_True || key == Py_False)
        r = fi_json_bool(b, key == Py_True) < 0 ? oom() : 0;
    else if (key == Py_None)
        r = fi_json_null(b) < 0 ? oom() : 0;
    else if (PyLong_Check(key))
        r = fi_json_pyint(b, key);
    else {
        PyErr_Format(PyExc_TypeError, "keys must be str, int, float, bool or None, not %.200s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    if (r < 0)
        return -1;
    return fi_buf_putc(b, '"') < 0 ? oom() : 0;
}

static int put_value(fi_buf *b, PyObject *obj);

static int put_sequence(fi_buf *b, PyObject *seq)
{
    PyObject *fast = PySequence_Fast(seq, "expected a sequence");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int r = fi_buf_putc(b, '[') < 0 ? oom() : 0;
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        if (i > 0 && fi_buf_append(b, ", ", 2) < 0)
            r = oom();
        else
            r = put_value(b, PySequence_Fast_GET_ITEM(fast, i));
    }
    Py_DECREF(fast);
    if (r == 0 && fi_buf_putc(b, ']') < 0)
        r = oom();
    return r;
}

static int put_item(fi_buf *b, Py_ssize_t i, PyObject *key, PyObject *value)
{
    if (i > 0 && fi_buf_append(b, ", ", 2) < 0)
        return oom();
    if (put_key(b, key) < 0)
        return -1;
    if (fi_buf_append(b, ": ", 2) < 0)
        return oom();
    return put_value(b, value);
}

/* An exact dict is walked in place (no Python code can run while its keys and values
 * are written: they are str, int, float, bool, None, list, tuple or dict); a subclass
 * through its items(), as json.dumps does. */
static int put_dict(fi_buf *b, PyObject *dict)
{
    if (fi_buf_putc(b, '{') < 0)
        return oom();
    if (PyDict_CheckExact(dict)) {
        PyObject *key, *value;
        Py_ssize_t pos = 0, i = 0;
        int r = 0;
        while (r == 0 && PyDict_Next(dict, &pos, &key, &value))
            r = put_item(b, i++, key, value);
        if (r == 0 && fi_buf_putc(b, '}') < 0)
            r = oom();
        return r;
    }
    PyObject *items = PyMapping_Items(dict);
    if (!items)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(items);
    int r = 0;
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        r = put_item(b, i, PyTuple_GET_ITEM(kv, 0), PyTuple_GET_ITEM(kv, 1));
    }
    Py_DECREF(items);
    if (r == 0 && fi_buf_putc(b, '}') < 0)
        r = oom();
    return r;
}

static int put_value(fi_buf *b, PyObject *obj)
{
    if (obj == Py_None)
        return fi_json_null(b) < 0 ? oom() : 0;
    if (obj == Py_True || obj == Py_False)
        return fi_json_bool(b, obj == Py_True) < 0 ? oom() : 0;
    if (PyUnicode_Check(obj))
        return put_pystr(b, obj);
    if (PyLong_Check(obj))
        return fi_json_pyint(b, obj);
    if (PyFloat_Check(obj))
        return fi_json_double(b, PyFloat_AS_DOUBLE(obj)) < 0 ? oom() : 0;
    int is_list = PyList_Check(obj) || PyTuple_Check(obj), is_dict = PyDict_Check(obj);
    if (!is_list && !is_dict) {
        PyErr_Format(PyExc_TypeError, "Object of type %.200s is not JSON serializable",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (Py_EnterRecursiveCall(" while encoding a JSON object"))
        return -1;
    int r = is_list ? put_sequence(b, obj) : put_dict(b, obj);
    Py_LeaveRecursiveCall();
    return r;
}

int fi_json_from_py(fi_buf *b, PyObject *obj) { return put_value(b, obj); }

/* ---- parser ---- */

typedef struct {
    const unsigned char *s;
    size_t n, i;
    const char *what;
    int depth;
} parser;

static PyObject *parse_error(parser *p, const char *problem)
{
    PyErr_Format(PyExc_ValueError, "%s: invalid JSON at byte %zu: %s", p->what, p->i, problem);
    return NULL;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int hex4(parser *p, uint32_t *out)
{
    if (p->n - p->i < 4)
        return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = p->s[p->i + (size_t)k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + (uint32_t)d;
    }
    p->i += 4;
    *out = v;
    return 0;
}

static PyObject *parse_string(parser *p)
{
    p->i++; /* opening quote */
    fi_buf ucs;
    fi_buf_init(&ucs);
    for (;;) {
        if (p->i >= p->n) {
            fi_buf_free(&ucs);
            return parse_error(p, "unterminated string");
        }
        unsigned char c = p->s[p->i];
        uint32_t cp;
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            fi_buf_free(&ucs);
            return parse_error(p, "control character in string");
        }
        if (c == '\\') {
            if (++p->i >= p->n) {
                fi_buf_free(&ucs);
                return parse_error(p, "unterminated escape");
            }
            c = p->s[p->i++];
            switch (c) {
            case '"':
                cp = '"';
                break;
            case '\\':
                cp = '\\';
                break;
            case '/':
                cp = '/';
                break;
            case 'b':
                cp = '\b';
                break;
            case 'f':
                cp = '\f';
                break;
            case 'n':
                cp = '\n';
                break;
            case 'r':
                cp = '\r';
                break;
            case 't':
                cp = '\t';
                break;
            case 'u':
                if (hex4(p, &cp) < 0) {
                    fi_buf_free(&ucs);
                    return parse_error(p, "bad \\u escape");
                }
                if (cp >= 0xd800 && cp < 0xdc00 && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
                    p->s[p->i + 1] == 'u') {
                    size_t save = p->i;
                    uint32_t lo;
                    p->i += 2;
                    if (hex4(p, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000)
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    else
                        p->i = save;
                }
                break;
            default:
                fi_buf_free(&ucs);
                return parse_error(p, "bad escape");
            }
        } else {
            cp = utf8_next(p->s, p->n, &p->i);
        }
        if (fi_buf_append(&ucs, (const char *)&cp, sizeof(cp)) < 0) {
            fi_buf_free(&ucs);
            return PyErr_NoMemory();
        }
    }
    PyObject *r = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, ucs.data,
                                            (Py_ssize_t)(ucs.len / sizeof(uint32_t)));
    fi_buf_free(&ucs);
    return r;
}

static PyObject *parse_number(parser *p)
{
    size_t start = p->i;
    int is_float = 0;
    if (p->i < p->n && p->s[p->i] == '-')
        p->i++;
    size_t digits = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    if (p->i == digits || (p->s[digits] == '0' && p->i - digits > 1))
        return parse_error(p, "bad number");
    if (p->i < p->n && p->s[p->i] == '.') {
        is_float = 1;
        size_t f = ++p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == f)
            return parse_error(p, "bad number");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        is_float = 1;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        size_t e = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == e)
            return parse_error(p, "bad number");
    }
    char tmp[64];
    size_t len = p->i - start;
    if (len >= sizeof(tmp))
        return parse_error(p, "number too long");
    memcpy(tmp, p->s + start, len);
    tmp[len] = '\0';
    if (!is_float)
        return PyLong_FromString(tmp, NULL, 10);
    double v = PyOS_string_to_double(tmp, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred())
        return NULL;
    return PyFloat_FromDouble(v);
}

static PyObject *parse_value(parser *p);

static PyObject *parse_container(parser *p, int is_obj)
{
    if (++p->depth > 64)
        return parse_error(p, "nesting deeper than 64");
    p->i++;
    PyObject *c = is_obj ? PyDict_New() : PyList_New(0);
    if (!c)
        return NULL;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == (is_obj ? '}' : ']')) {
        p->i++;
        p->depth--;
        return c;
    }
    for (;;) {
        skip_ws(p);
        PyObject *key = NULL;
        if (is_obj) {
            if (p->i >= p->n || p->s[p->i] != '"') {
                Py_DECREF(c);
                return parse_error(p, "expected a string key");
            }
            if (!(key = parse_string(p))) {
                Py_DECREF(c);
                return NULL;
            }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                Py_DECREF(key);
                Py_DECREF(c);
                return parse_error(p, "expected ':'");
            }
            p->i++;
        }
        PyObject *v = parse_value(p);
        int r = -1;
        if (v)
            r = is_obj ? PyDict_SetItem(c, key, v) : PyList_Append(c, v);
        Py_XDECREF(key);
        Py_XDECREF(v);
        if (r < 0) {
            Py_DECREF(c);
            return NULL;
        }
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == (is_obj ? '}' : ']')) {
            p->i++;
            p->depth--;
            return c;
        }
        Py_DECREF(c);
        return parse_error(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static PyObject *parse_literal(parser *p, const char *word, PyObject *value)
{
    size_t len = strlen(word);
    if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0)
        return parse_error(p, "unexpected character");
    p->i += len;
    return Py_NewRef(value);
}

static PyObject *parse_value(parser *p)
{
    skip_ws(p);
    if (p->i >= p->n)
        return parse_error(p, "unexpected end");
    unsigned char c = p->s[p->i];
    if (c == '{' || c == '[')
        return parse_container(p, c == '{');
    if (c == '"')
        return parse_string(p);
    if (c == '-' || (c >= '0' && c <= '9'))
        return parse_number(p);
    if (c == 't')
        return parse_literal(p, "true", Py_True);
    if (c == 'f')
        return parse_literal(p, "false", Py_False);
    if (c == 'n')
        return parse_literal(p, "null", Py_None);
    return parse_error(p, "unexpected character");
}

PyObject *fi_json_parse(const char *s, size_t n, const char *what)
{
    parser p = {(const unsigned char *)s, n, 0, what, 0};
    PyObject *v = parse_value(&p);
    if (!v)
        return NULL;
    skip_ws(&p);
    if (p.i != p.n) {
        Py_DECREF(v);
        return parse_error(&p, "trailing data");
    }
    return v;
}

/* ---- Python-facing ---- */

PyDoc_STRVAR(json_dumps_doc, "json_dumps(obj) -> str\n\n"
                             "Same text as json.dumps(obj) with default settings.");

static PyObject *json_dumps(PyObject *module, PyObject *obj)
{
    (void)module;
    fi_buf b;
    fi_buf_init(&b);
    if (fi_json_from_py(&b, obj) < 0) {
        fi_buf_free(&b);
        return NULL;
    }
    PyObject *r = PyUnicode_DecodeASCII(b.data, (Py_ssize_t)b.len, "strict");
    fi_buf_free(&b);
    return r;
}

PyDoc_STRVAR(json_loads_doc, "json_loads(text) -> object\n\n"
                             "Strict JSON parser used for tensor file headers.");

static PyObject *json_loads(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!s)
        return NULL;
    return fi_json_parse(s, (size_t)n, "json_loads");
}

static PyMethodDef json_methods[] = {
    {"json_dumps", json_dumps, METH_O, json_dumps_doc},
    {"json_loads", json_loads, METH_O, json_loads_doc},
    {NULL, NULL, 0, NULL},
};

int fi_json_exec(PyObject *module) { return PyModule_AddFunctions(module, json_methods); }
