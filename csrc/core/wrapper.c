/* wrapper.c: the object every @flashinfer_api function becomes above level 0.
 * A vectorcall type that logs, dumps and calls through; __get__ binds methods. */
#include "wrapper.h"

#include <structmember.h>

#include "call.h"
#include "config.h"
#include "format.h"
#include "format_json.h"
#include "pages.h"
#include "json.h"
#include "logger.h"
#include "module.h"
#include "recorder.h"
#include "scratch.h"
#include "strbuf.h"
#include "tensor.h"

#define SEP_LINE                                                                                   \
    "================================================================================\n"
#define DASH_LINE                                                                                  \
    "--------------------------------------------------------------------------------\n"

enum {
    KIND_POSITIONAL_ONLY,
    KIND_POSITIONAL_OR_KEYWORD,
    KIND_VAR_POSITIONAL,
    KIND_KEYWORD_ONLY,
    KIND_VAR_KEYWORD
};

typedef struct {
    PyObject *name;
    int kind;
    PyObject *default_value; /* NULL when the parameter has no default */
    /* the default's formatted text (bytes) in the text and the JSON log, made at its
     * first use when the default is an immutable scalar; NULL otherwise */
    PyObject *default_text[2];
} param_info;

typedef struct {
    PyObject_HEAD
    PyObject *func;
    fi_logger *logger;
    PyObject *dict;
    PyObject *weakrefs;
    PyObject *name;           /* func.__name__ */
    PyObject *signature_text; /* str(inspect.signature(func)) or None */
    Py_ssize_t nparams;
    param_info *params;
    const fi_pages_api *pages;     /* what it reads of a paged KV cache (pages.h), or NULL */
    const fi_scratch_api *scratch; /* its scratch parameters (scratch.h), or NULL */
    PyObject **pos_names;          /* the positional parameters' names (borrowed from params) */
    Py_ssize_t npos;
    PyObject *cached_type;     /* class of the last call's first argument ... */
    PyObject *cached_api_name; /* ... and its "Cls.method", or None for the bare name */
    vectorcallfunc vectorcall;
} fi_wrapper;

typedef struct {
    PyObject_HEAD
    fi_wrapper *wrapper;
    PyObject *self;
    vectorcallfunc vectorcall;
} fi_bound;

/* ---------------------------------------------------------------- API names */

/* "Cls.method" when the class name contains "Wrapper" or is "MoELayer", else None:
 * FlashInfer's test for a stateful object. New reference, NULL with exception. */
static PyObject *stateful_method_name(PyObject *cls, PyObject *method)
{
    PyObject *cls_name = PyObject_GetAttr(cls, fi_names.name);
    if (!cls_name)
        return NULL;
    const char *text = PyUnicode_Check(cls_name) ? PyUnicode_AsUTF8(cls_name) : "";
    PyObject *full;
    if (!text)
        full = NULL;
    else if (strstr(text, "Wrapper") || strcmp(text, "MoELayer") == 0)
        full = PyUnicode_FromFormat("%S.%S", cls_name, method);
    else
        full = Py_NewRef(Py_None);
    Py_DECREF(cls_name);
    return full;
}

/* The API name as FlashInfer's decorator makes it: __name__, prefixed with the class
 * of the first positional argument (which is then self, for self_id) when that class
 * is a stateful one by FlashInfer's test; so a method of any other class logs its bare
 * name, and a classmethod or staticmethod is named by its first argument. The answer
 * is cached for the last class seen. Borrowed reference; NULL with exception. */
static PyObject *api_name(fi_wrapper *w, PyObject **self, PyObject *const *args, Py_ssize_t nargs)
{
    *self = NULL;
    if (nargs == 0)
        return w->name;
    PyObject *cls = (PyObject *)Py_TYPE(args[0]);
    if (cls != w->cached_type || !w->cached_api_name) {
        PyObject *full = stateful_method_name(cls, w->name);
        if (!full)
            return NULL;
        Py_INCREF(cls);
        Py_XSETREF(w->cached_type, cls);
        Py_XSETREF(w->cached_api_name, full);
    }
    if (w->cached_api_name == Py_None)
        return w->name;
    *self = args[0];
    return w->cached_api_name;
}

/* ------------------------------------------------------------- log records */

static void emit_buf(fi_logger *lg, fi_buf *b) { fi_logger_emit(lg, b->data, b->len); }

/* Writes "[LOGGING ERROR in NAME (where)]: message" for the pending exception and
 * clears it. */
static void emit_logging_error(fi_logger *lg, const char *name, const char *where)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    PyObject *msg = ev ? PyObject_Str(ev) : NULL;
    if (!msg)
        PyErr_Clear();
    const char *m = msg ? PyUnicode_AsUTF8(msg) : NULL;
    if (!m) {
        PyErr_Clear();
        m = "unknown error";
    }
    fi_buf b;
    fi_buf_init(&b);
    if (lg->cfg.log_format == FI_LOG_JSON) {
        fi_format_json_head(&b, "logging_error", name, -1);
        fi_buf_printf(&b, ", \"where\": \"%s\", \"message\": ", where);
        fi_json_str(&b, m, strlen(m));
        if (fi_format_json_close(&b) < 0)
            PyErr_Clear();
    } else {
        fi_buf_printf(&b, "[LOGGING ERROR in %s (%s)]: %s\n", name, where, m);
    }
    emit_buf(lg, &b);
    fi_buf_free(&b);
    Py_XDECREF(msg);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
}

static int provided_by_keyword(PyObject *name, PyObject *kwnames)
{
    if (!kwnames)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == name)
            return 1;
        int eq = PyUnicode_Compare(k, name) == 0;
        if (eq)
            return 1;
    }
    return 0;
}

/* Appends one defaulted parameter; first is set for the first one of the call. */
typedef int (*default_put_fn)(fi_buf *b, const char *name, param_info *p, fi_call *call, int first);

/* A default whose text can never change: None, a bool, an int, a float or a str (a
 * float's repr alone costs more than the rest of its log lines). */
static int constant_default(PyObject *v)
{
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
           PyUnicode_CheckExact(v);
}

static int put_cached(fi_buf *b, PyObject **cache)
{
    return fi_buf_append(b, PyBytes_AS_STRING(*cache), (size_t)PyBytes_GET_SIZE(*cache));
}

/* Keeps what b gained since start in *cache when value is a constant default. */
static void remember(fi_buf *b, size_t start, PyObject *value, PyObject **cache)
{
    if (b->oom || !constant_default(value))
        return;
    *cache = PyBytes_FromStringAndSize(b->data + start, (Py_ssize_t)(b->len - start));
    if (!*cache)
        PyErr_Clear(); /* not cached: formatted again next time */
}

/* Calls put for every parameter that has a default and was given neither positionally
 * nor by keyword (docs/logging.md#what-the-text-log-looks-like), in signature order. Returns how
 * many, or -1. */
static int put_defaults(fi_buf *b, fi_wrapper *w, fi_call *call, Py_ssize_t nargs,
                        PyObject *kwnames, default_put_fn put)
{
    int count = 0;
    Py_ssize_t positional_seen = 0;
    for (Py_ssize_t i = 0; i < w->nparams; i++) {
        param_info *p = &w->params[i];
        int positional = p->kind == KIND_POSITIONAL_ONLY || p->kind == KIND_POSITIONAL_OR_KEYWORD;
        int given = positional && positional_seen < nargs;
        if (positional)
            positional_seen++;
        if (!p->default_value || given || provided_by_keyword(p->name, kwnames))
            continue;
        const char *pname = PyUnicode_AsUTF8(p->name);
        if (!pname || put(b, pname, p, call, count == 0) < 0)
            return -1;
        count++;
    }
    return count;
}

/* "[timestamp] FlashInfer API Call: NAME" */
static void put_call_line(fi_buf *b, const char *timestamp, const char *name)
{
    fi_buf_puts(b, timestamp);
    fi_buf_puts(b, " FlashInfer API Call: ");
    fi_buf_puts(b, name);
    fi_buf_putc(b, '\n');
}

static int text_default(fi_buf *b, const char *name, param_info *p, fi_call *call, int first)
{
    if (first)
        fi_buf_puts(b, "Default parameters (not explicitly provided):\n");
    fi_buf_puts(b, "  ");
    fi_buf_puts(b, name);
    fi_buf_puts(b, "= [DEFAULT]\n");
    if (p->default_text[0])
        return put_cached(b, &p->default_text[0]);
    size_t start = b->len;
    if (fi_format_value(b, p->default_value, 2, call) < 0)
        return -1;
    remember(b, start, p->default_value, &p->default_text[0]);
    return 0;
}

static int json_default(fi_buf *b, const char *name, param_info *p, fi_call *call, int first)
{
    if (!first)
        fi_buf_puts(b, ", ");
    fi_json_str(b, name, strlen(name));
    fi_buf_puts(b, ": ");
    if (p->default_text[1])
        return put_cached(b, &p->default_text[1]);
    size_t start = b->len;
    if (fi_format_json_value(b, p->default_value, call) < 0)
        return -1;
    remember(b, start, p->default_value, &p->default_text[1]);
    return 0;
}

/* The level-3/5 block written before the call (docs/logging.md#what-the-text-log-looks-like). */
static int format_inputs(fi_buf *b, fi_wrapper *w, fi_call *call, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    fi_buf_puts(b, SEP_LINE);
    put_call_line(b, fi_logger_timestamp(w->logger), call->api_name);
    fi_buf_puts(b, DASH_LINE);
    if (nargs == 0 && nkw == 0)
        fi_buf_puts(b, "(No explicit arguments)\n");
    if (nargs > 0)
        fi_buf_puts(b, "Positional input arguments:\n");
    for (Py_ssize_t i = 0; i < nargs; i++) {
        fi_buf_puts(b, "  arg[");
        fi_buf_put_i64(b, (long long)i);
        fi_buf_puts(b, "]:\n");
        if (fi_format_value(b, args[i], 2, call) < 0)
            return -1;
    }
    if (nkw > 0)
        fi_buf_puts(b, "Keyword input arguments:\n");
    for (Py_ssize_t i = 0; i < nkw; i++) {
        const char *key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
        if (!key)
            return -1;
        fi_buf_puts(b, "  ");
        fi_buf_puts(b, key);
        fi_buf_puts(b, "=\n");
        if (fi_format_value(b, args[nargs + i], 2, call) < 0)
            return -1;
    }
    if (put_defaults(b, w, call, nargs, kwnames, text_default) < 0)
        return -1;
    if (b->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The JSON "call" record of levels 3/5: args, kwargs and defaults, one line. */
static int json_inputs(fi_buf *b, fi_wrapper *w, fi_call *call, long long call_id,
                       PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    fi_format_json_head(b, "call", call->api_name, call_id);
    fi_buf_printf(b, ", \"level\": %d, \"args\": [", call->level);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (i)
            fi_buf_puts(b, ", ");
        if (fi_format_json_value(b, args[i], call) < 0)
            return -1;
    }
    fi_buf_puts(b, "], \"kwargs\": {");
    for (Py_ssize_t i = 0; i < nkw; i++) {
        Py_ssize_t n;
        const char *key = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(kwnames, i), &n);
        if (!key)
            return -1;
        if (i)
            fi_buf_puts(b, ", ");
        fi_json_str(b, key, (size_t)n);
        fi_buf_puts(b, ": ");
        if (fi_format_json_value(b, args[nargs + i], call) < 0)
            return -1;
    }
    fi_buf_puts(b, "}, \"defaults\": {");
    if (put_defaults(b, w, call, nargs, kwnames, json_default) < 0)
        return -1;
    fi_buf_putc(b, '}');
    return fi_format_json_close(b);
}

/* The one-line record of level 1 (levels 3 and above write nothing for a call the filters
 * keep out). */
static void format_call_line(fi_buf *b, fi_logger *lg, const char *name, long long call_id)
{
    if (lg->cfg.log_format == FI_LOG_JSON) {
        fi_format_json_head(b, "call", name, call_id);
        fi_buf_puts(b, ", \"level\": 1}\n");
    } else {
        put_call_line(b, fi_logger_timestamp(lg), name);
    }
}

static int json_output(fi_buf *b, fi_call *call, long long call_id, PyObject *result)
{
    fi_format_json_head(b, "return", call->api_name, call_id);
    fi_format_json_key(b, "result");
    if (fi_format_json_value(b, result, call) < 0)
        return -1;
    return fi_format_json_close(b);
}

/* The JSON "exception" record after a call that raised; the exception stays pending. */
static void emit_json_exception(fi_logger *lg, const char *name, long long call_id)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    fi_buf b;
    fi_buf_init(&b);
    fi_format_json_head(&b, "exception", name, call_id);
    fi_format_json_key(&b, "type");
    const char *type_name = et ? _PyType_Name((PyTypeObject *)et) : "?";
    fi_json_str(&b, type_name, strlen(type_name));
    fi_format_json_key(&b, "message");
    PyObject *msg = ev ? PyObject_Str(ev) : NULL;
    Py_ssize_t n = 0;
    const char *m = msg ? PyUnicode_AsUTF8AndSize(msg, &n) : NULL;
    if (!m)
        PyErr_Clear();
    fi_json_str(&b, m ? m : "", m ? (size_t)n : 0);
    if (fi_format_json_close(&b) == 0)
        emit_buf(lg, &b);
    PyErr_Clear();
    fi_buf_free(&b);
    Py_XDECREF(msg);
    if (tb && ev)
        PyException_SetTraceback(ev, tb);
    PyErr_Restore(et, ev, tb);
}

static int format_output(fi_buf *b, fi_call *call, PyObject *result)
{
    fi_buf_puts(b, "Output value:\n");
    if (fi_format_value(b, result, 1, call) < 0)
        return -1;
    fi_buf_puts(b, SEP_LINE);
    fi_buf_putc(b, '\n');
    if (b->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- the call path */

/* args holds every argument (self first for bound calls). Logging failures are
 * reported in the log and never reach the caller. The call's context (call.h) goes down
 * through the log text and the recorder, and is released when the call returns. */
static PyObject *wrapper_invoke(fi_wrapper *w, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames)
{
    fi_logger *lg = w->logger;
    int level = lg->cfg.level;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *self; /* the object whose id a dump records as self_id, or NULL */
    PyObject *name_obj = api_name(w, &self, args, nargs);
    if (!name_obj) {
        PyErr_Clear();
        name_obj = w->name;
    }
    Py_INCREF(name_obj); /* the cache may be replaced by a nested call */
    const char *name = PyUnicode_AsUTF8(name_obj);
    if (!name) {
        PyErr_Clear();
        name = "<unnamed>";
    }
    fi_call call;
    fi_call_begin(&call, name, level);
    int json = lg->cfg.log_format == FI_LOG_JSON;
    long long call_id = json ? ++lg->json_call_id : -1;
    int detailed = level >= 3 && fi_config_name_passes(&lg->cfg, name);
    /* a call that reads a paged KV cache: its statistics and its dump are of the pages it
     * reads (docs/flight-recorder.md#page-aware-capture) */
    fi_call_args cargs = {args, nargs, kwnames, w->pos_names, w->npos};
    PyObject *obj = nargs > 0 ? args[0] : NULL; /* a method's object, for its plan */
    if (w->pages && detailed && level >= 5 && !fi_pages_is_plan(w->pages) &&
        fi_pages_of_call(lg->page_memo, w->pages, obj, &cargs, &call.paged) < 0)
        PyErr_Clear(); /* unknown pages: the tensors are taken whole */
    fi_dump_call *dump = NULL;
    fi_buf b;
    fi_buf_init(&b);
    if (detailed && level >= 10 && !fi_logger_dumps_suspended(lg)) {
        fi_dump_api api = {
            name,  w->func, w->signature_text, self, lg->cfg.dump_scratch ? NULL : w->scratch,
            &cargs};
        dump = fi_dump_begin(&lg->rec, &call, &api, args, nargs, kwnames);
    }
    /* levels 3+ log nothing at all for a call the include/exclude filters leave out
     * (FlashInfer's rule); level 1 names every call */
    if (level < 3) {
        format_call_line(&b, lg, name, call_id);
        emit_buf(lg, &b);
    } else if (detailed) {
        if ((json ? json_inputs(&b, w, &call, call_id, args, nargs, kwnames)
                  : format_inputs(&b, w, &call, args, nargs, kwnames)) == 0)
            emit_buf(lg, &b);
        else
            emit_logging_error(lg, name, "pre-execution");
    }

    double started = dump ? fi_call_clock() : 0;
    PyObject *result = PyObject_Vectorcall(w->func, args, nargsf, kwnames);
    fi_call_returned(&call);
    if (dump)
        call.took_us = (fi_call_clock() - started) * 1e6;

    if (result && w->pages && level >= 5 && fi_pages_is_plan(w->pages)) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (fi_pages_note_plan(lg->page_memo, w->pages, obj, &cargs) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }

    if (result && detailed) {
        fi_buf_reset(&b);
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        /* the recorder's nan/inf check of the outputs reuses the statistics of their text */
        call.stats.keep_taken = dump && fi_dump_checks_outputs(dump);
        if ((json ? json_output(&b, &call, call_id, result) : format_output(&b, &call, result)) ==
            0)
            emit_buf(lg, &b);
        else
            emit_logging_error(lg, name, "outputs");
        call.stats.keep_taken = 0;
        PyErr_Restore(et, ev, tb);
    } else if (!result && detailed && json) {
        emit_json_exception(lg, name, call_id);
    }
    if (dump)
        fi_dump_end(dump, result);
    fi_call_end(&call);
    fi_buf_free(&b);
    Py_DECREF(name_obj);
    return result;
}

static PyObject *wrapper_vectorcall(fi_wrapper *w, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames)
{
    return wrapper_invoke(w, args, nargsf, kwnames);
}

#define SMALL_ARGS 16

static PyObject *bound_vectorcall(fi_bound *bm, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *result;
    if (nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET) {
        /* the caller lent us args[-1]: put self there, as bound methods do */
        PyObject **shifted = (PyObject **)args - 1;
        PyObject *saved = shifted[0];
        shifted[0] = bm->self;
        result = wrapper_invoke(bm->wrapper, shifted, (size_t)(nargs + 1), kwnames);
        shifted[0] = saved;
        return result;
    }
    PyObject *small[SMALL_ARGS + 1];
    PyObject **stack = small;
    if (total + 1 > SMALL_ARGS) {
        stack = PyMem_Malloc((size_t)(total + 2) * sizeof(PyObject *));
        if (!stack)
            return PyErr_NoMemory();
    }
    /* slot 0 stays free so the callee may use PY_VECTORCALL_ARGUMENTS_OFFSET */
    stack[1] = bm->self;
    if (total > 0)
        memcpy(stack + 2, args, (size_t)total * sizeof(PyObject *));
    result = wrapper_invoke(bm->wrapper, stack + 1,
                            (size_t)(nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return result;
}

/* ------------------------------------------------------------ construction */

static int parse_params(fi_wrapper *w, PyObject *params)
{
    if (params == Py_None)
        return 0;
    PyObject *seq =
        PySequence_Fast(params, "params must be a sequence of (name, kind, has_default, default)");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    w->params = PyMem_Calloc((size_t)(n ? n : 1), sizeof(param_info));
    if (!w->params) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *name, *def;
        int kind, has_default;
        if (!PyArg_ParseTuple(item, "UipO:param", &name, &kind, &has_default, &def)) {
            Py_DECREF(seq);
            return -1;
        }
        Py_INCREF(name);
        w->params[i].name = name;
        w->params[i].kind = kind;
        if (has_default) {
            Py_INCREF(def);
            w->params[i].default_value = def;
        }
        w->nparams = i + 1;
    }
    Py_DECREF(seq);
    return 0;
}

/* The page-table and scratch knowledge of the wrapped function, and its positional
 * parameter names to find those parameters among a call's arguments. */
static int find_pages(fi_wrapper *w)
{
    w->pages = fi_pages_api_of(w->func);
    w->scratch = fi_scratch_api_of(w->func);
    if (!w->pages && !w->scratch)
        return 0;
    w->pos_names = PyMem_Calloc((size_t)(w->nparams ? w->nparams : 1), sizeof(PyObject *));
    if (!w->pos_names) {
        PyErr_NoMemory();
        return -1;
    }
    while (w->npos < w->nparams && (w->params[w->npos].kind == KIND_POSITIONAL_ONLY ||
                                    w->params[w->npos].kind == KIND_POSITIONAL_OR_KEYWORD)) {
        w->pos_names[w->npos] = w->params[w->npos].name;
        w->npos++;
    }
    return 0;
}

static PyObject *wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"func", "logger", "params", "signature_text", NULL};
    PyObject *func, *logger, *params = Py_None, *sig = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:APIWrapper", kwlist, &func, &logger,
                                     &params, &sig))
        return NULL;
    if (!PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError, "flashinfer_api expects a callable, got %.200s",
                     Py_TYPE(func)->tp_name);
        return NULL;
    }
    if (!fi_logger_check(logger)) {
        PyErr_Format(PyExc_TypeError, "logger must be a flashinfer_native._C.Logger, got %.200s",
                     Py_TYPE(logger)->tp_name);
        return NULL;
    }
    fi_wrapper *w = (fi_wrapper *)type->tp_alloc(type, 0);
    if (!w)
        return NULL;
    Py_INCREF(func);
    w->func = func;
    Py_INCREF(logger);
    w->logger = (fi_logger *)logger;
    Py_INCREF(sig);
    w->signature_text = sig;
    w->vectorcall = (vectorcallfunc)wrapper_vectorcall;
    w->name = PyObject_GetAttr(func, fi_names.name);
    if (!w->name || !PyUnicode_Check(w->name)) {
        PyErr_Clear();
        Py_XSETREF(w->name, PyUnicode_FromString(Py_TYPE(func)->tp_name));
        if (!w->name) {
            Py_DECREF(w);
            return NULL;
        }
    }
    if (parse_params(w, params) < 0 || find_pages(w) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static int wrapper_traverse(fi_wrapper *w, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(w));
    Py_VISIT(w->func);
    Py_VISIT(w->logger);
    Py_VISIT(w->dict);
    Py_VISIT(w->signature_text);
    Py_VISIT(w->cached_type);
    for (Py_ssize_t i = 0; i < w->nparams; i++)
        Py_VISIT(w->params[i].default_value);
    return 0;
}

static int wrapper_clear(fi_wrapper *w)
{
    Py_CLEAR(w->func);
    Py_CLEAR(w->logger);
    Py_CLEAR(w->dict);
    Py_CLEAR(w->name);
    Py_CLEAR(w->signature_text);
    Py_CLEAR(w->cached_type);
    Py_CLEAR(w->cached_api_name);
    for (Py_ssize_t i = 0; i < w->nparams; i++) {
        Py_CLEAR(w->params[i].name);
        Py_CLEAR(w->params[i].default_value);
        Py_CLEAR(w->params[i].default_text[0]);
        Py_CLEAR(w->params[i].default_text[1]);
    }
    return 0;
}

static void wrapper_dealloc(fi_wrapper *w)
{
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_GC_UnTrack(w);
    if (w->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)w);
    wrapper_clear(w);
    PyMem_Free(w->params);
    PyMem_Free(w->pos_names);
    tp->tp_free(w);
    Py_DECREF(tp);
}

static PyObject *wrapper_descr_get(fi_wrapper *w, PyObject *obj, PyObject *type)
{
    (void)type;
    if (!obj || obj == Py_None) {
        Py_INCREF(w);
        return (PyObject *)w;
    }
    PyObject *module = PyType_GetModule(Py_TYPE(w));
    if (!module)
        return NULL;
    PyTypeObject *bound_type = fi_state_of(module)->bound_type;
    fi_bound *bm = (fi_bound *)bound_type->tp_alloc(bound_type, 0);
    if (!bm)
        return NULL;
    Py_INCREF(w);
    bm->wrapper = w;
    Py_INCREF(obj);
    bm->self = obj;
    bm->vectorcall = (vectorcallfunc)bound_vectorcall;
    return (PyObject *)bm;
}

static PyObject *wrapper_repr(fi_wrapper *w)
{
    return PyUnicode_FromFormat("<flashinfer_api wrapper of %R>", w->func);
}

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyMemberDef wrapper_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(fi_wrapper, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(fi_wrapper, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(fi_wrapper, weakrefs), READONLY, NULL},
    {"_func", T_OBJECT, offsetof(fi_wrapper, func), READONLY, "The wrapped callable."},
    {"_logger", T_OBJECT, offsetof(fi_wrapper, logger), READONLY, "The Logger in use."},
    {NULL},
};

PyDoc_STRVAR(wrapper_doc,
             "APIWrapper(func, logger, params=None, signature_text=None)\n--\n\n"
             "A function decorated with @flashinfer_api: logs (and at level 10 dumps) each "
             "call, then calls func.");

static PyType_Slot wrapper_slots[] = {
    {Py_tp_new, wrapper_new},
    {Py_tp_dealloc, wrapper_dealloc},
    {Py_tp_traverse, wrapper_traverse},
    {Py_tp_clear, wrapper_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, wrapper_descr_get},
    {Py_tp_repr, wrapper_repr},
    {Py_tp_getset, wrapper_getset},
    {Py_tp_members, wrapper_members},
    {Py_tp_doc, (void *)wrapper_doc},
    {0, NULL},
};

static PyType_Spec wrapper_spec = {
    .name = "flashinfer_native._C.APIWrapper",
    .basicsize = sizeof(fi_wrapper),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = wrapper_slots,
};

/* ---------------------------------------------------------- the bound type */

static int bound_traverse(fi_bound *bm, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(bm));
    Py_VISIT(bm->wrapper);
    Py_VISIT(bm->self);
    return 0;
}

static int bound_clear(fi_bound *bm)
{
    Py_CLEAR(bm->wrapper);
    Py_CLEAR(bm->self);
    return 0;
}

static void bound_dealloc(fi_bound *bm)
{
    PyTypeObject *tp = Py_TYPE(bm);
    PyObject_GC_UnTrack(bm);
    bound_clear(bm);
    tp->tp_free(bm);
    Py_DECREF(tp);
}

/* Unknown attributes (__name__, __doc__, __wrapped__, ...) come from the wrapper. */
static PyObject *bound_getattro(fi_bound *bm, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr((PyObject *)bm, name);
    if (r || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return r;
    PyErr_Clear();
    return PyObject_GetAttr((PyObject *)bm->wrapper, name);
}

/* inspect.signature of a bound method: the wrapped signature without self. */
static PyObject *bound_get_signature(fi_bound *bm, void *c)
{
    (void)c;
    PyObject *inspect = PyImport_ImportModule("inspect");
    if (!inspect)
        return NULL;
    PyObject *sig = PyObject_CallMethod(inspect, "signature", "O", bm->wrapper->func);
    Py_DECREF(inspect);
    if (!sig)
        return NULL;
    PyObject *params = PyObject_GetAttrString(sig, "parameters");
    PyObject *values = params ? PyObject_CallMethod(params, "values", NULL) : NULL;
    PyObject *list = values ? PySequence_List(values) : NULL;
    Py_XDECREF(params);
    Py_XDECREF(values);
    PyObject *result = NULL;
    if (list) {
        PyObject *rest = PyList_GetSlice(list, 1, PyList_GET_SIZE(list));
        if (rest) {
            PyObject *kw = Py_BuildValue("{s:O}", "parameters", rest);
            PyObject *replace = kw ? PyObject_GetAttrString(sig, "replace") : NULL;
            PyObject *empty = PyTuple_New(0);
            if (replace && empty)
                result = PyObject_Call(replace, empty, kw);
            Py_XDECREF(empty);
            Py_XDECREF(replace);
            Py_XDECREF(kw);
            Py_DECREF(rest);
        }
        Py_DECREF(list);
    }
    Py_DECREF(sig);
    return result;
}

static PyObject *bound_get_func(fi_bound *bm, void *c)
{
    (void)c;
    Py_INCREF(bm->wrapper);
    return (PyObject *)bm->wrapper;
}

static PyObject *bound_get_self(fi_bound *bm, void *c)
{
    (void)c;
    Py_INCREF(bm->self);
    return bm->self;
}

static PyObject *bound_repr(fi_bound *bm)
{
    return PyUnicode_FromFormat("<bound flashinfer_api method %S of %R>", bm->wrapper->name,
                                bm->self);
}

static PyGetSetDef bound_getset[] = {
    {"__signature__", (getter)bound_get_signature, NULL, NULL, NULL},
    {"__func__", (getter)bound_get_func, NULL, NULL, NULL},
    {"__self__", (getter)bound_get_self, NULL, NULL, NULL},
    {NULL},
};

static PyMemberDef bound_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(fi_bound, vectorcall), READONLY, NULL},
    {NULL},
};

static PyType_Slot bound_slots[] = {
    {Py_tp_dealloc, bound_dealloc},  {Py_tp_traverse, bound_traverse}, {Py_tp_clear, bound_clear},
    {Py_tp_call, PyVectorcall_Call}, {Py_tp_getattro, bound_getattro}, {Py_tp_repr, bound_repr},
    {Py_tp_getset, bound_getset},    {Py_tp_members, bound_members},   {0, NULL},
};

static PyType_Spec bound_spec = {
    .name = "flashinfer_native._C.APIBoundMethod",
    .basicsize = sizeof(fi_bound),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = bound_slots,
};

int fi_wrapper_exec(PyObject *module)
{
    fi_module_state *st = fi_state_of(module);
    st->wrapper_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &wrapper_spec, NULL);
    if (!st->wrapper_type)
        return -1;
    st->bound_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &bound_spec, NULL);
    if (!st->bound_type)
        return -1;
    if (PyModule_AddType(module, st->wrapper_type) < 0)
        return -1;
    return PyModule_AddType(module, st->bound_type);
}
