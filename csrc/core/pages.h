/* pages.h: which pages of a paged KV cache a call reads (docs/flight-recorder.md, "Page-aware
 * capture"): one table of what each API's page tables are, and the referenced page set
 * computed from them. A tensor whose pages are not known is recorded whole. */
#ifndef FI_PAGES_H
#define FI_PAGES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "flashinfer_kernels.h"
#include "tensorbytes.h"

/* The pages a call reads of one paged tensor (dim 0 = page): sorted, unique, within
 * [0, total). out_of_range counts the page-table entries outside it, which the call's
 * recorded page tables keep as they came (the bug a replay reproduces). */
typedef struct {
    int64_t *page;
    int64_t n, total, out_of_range;
} fi_page_set;

void fi_page_set_free(fi_page_set *s);

/* A paged tensor of a call and its pages. */
typedef struct {
    PyObject *tensor; /* borrowed from the call's arguments */
    fi_page_set pages;
    /* made by fi_paged_keep when first asked: the pages as byte ranges of the tensor's span
     * (a device tensor's bytes gathered to the host in packed) */
    int keep_state; /* 0 not yet, 1 made, -1 the tensor is written whole */
    fi_byte_range *range;
    fi_span_keep keep;
    PyObject *packed;
} fi_paged_tensor;

/* The paged tensors of a call (free with fi_paged_free). */
typedef struct {
    fi_paged_tensor *item;
    int n;
    int device_ranges; /* fi_paged_keep leaves a CUDA tensor's pages on the device: the
                        * compact capture's device path reads them there */
} fi_paged;

void fi_paged_free(fi_paged *p);

/* The pages of tensor in p, or NULL when it is not a paged tensor with known pages. */
const fi_page_set *fi_paged_find(const fi_paged *p, PyObject *tensor);

/* An fi_keep_fn (tensorio.h) over a call's fi_paged (ctx): the pages of tensor as byte
 * ranges of its span, for the writers to store only those (docs/dump-format.md, "Sparse
 * tensor files"); NULL, the tensor written whole, when it is not paged or its pages are not
 * each one run of memory. A CUDA tensor's pages are gathered on the device and copied to
 * the host once (packed), unless p->device_ranges. Errors are cleared: the tensor is then
 * written whole. */
const fi_span_keep *fi_paged_keep(void *ctx, PyObject *tensor);

/* Whether every page of t (a slice along dim 0) is one run of elements in memory, its
 * dims after the first contiguous; *page_elems gets a page's element count. Pages of such
 * a tensor are written, hashed and summed page by page. */
int fi_pages_contiguous(const fi_tensor *t, int64_t *page_elems);

/* tensor[pages] on tensor's own device (index_select along dim 0): a new reference, NULL
 * with an exception set. */
PyObject *fi_pages_gather(PyObject *tensor, const fi_page_set *ps);

/* A call's arguments as the decorator got them: positional (self first for methods) and
 * keyword, with the wrapped function's positional parameter names to resolve them. */
typedef struct {
    PyObject *const *args;
    Py_ssize_t nargs;
    PyObject *kwnames;
    PyObject *const *param_names; /* str, in signature order; may be shorter than nargs */
    Py_ssize_t nparams;
} fi_call_args;

/* The argument bound to parameter name, borrowed; NULL (no exception) when not passed. */
PyObject *fi_call_arg(const fi_call_args *a, const char *name);

typedef struct fi_pages_api fi_pages_api;

/* The entry of an API table (n entries of size bytes, each starting with its qualname, a
 * const char *) for func's __qualname__, or NULL; errors are cleared. The page table here
 * and the scratch table (scratch.c) are looked up through it. */
const void *fi_api_table_find(PyObject *func, const void *table, size_t n, size_t size);

/* The table entry for a function (by its __qualname__), or NULL: most APIs read no pages. */
const fi_pages_api *fi_pages_api_of(PyObject *func);

/* Whether the entry is a plan (it remembers page tables for later calls on its object). */
int fi_pages_is_plan(const fi_pages_api *api);

/* A plan: remembers the page tables of the call in memo (a dict the caller owns, keyed by
 * id(self)) for the calls on self that follow. Index tensors on a GPU are copied to the
 * host. -1 with an exception set; a plan whose tables are unreadable forgets self's. */
int fi_pages_note_plan(PyObject *memo, const fi_pages_api *api, PyObject *self,
                       const fi_call_args *a);

/* The paged tensors of a call that reads pages and their page sets: from the call's own
 * page tables, or from the last plan on self in memo. A tensor whose pages cannot be
 * told (no plan, unreadable tables) is left out: it is recorded whole. -1 with an
 * exception set. */
int fi_pages_of_call(PyObject *memo, const fi_pages_api *api, PyObject *self, const fi_call_args *a,
                     fi_paged *out);

/* Adds _page_sets (test hook) to the module. */
int fi_pages_exec(PyObject *module);

#endif
