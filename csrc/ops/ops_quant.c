/* ops_quant.c: flashinfer._kernels entry points of the fp4 layout helpers (dequantize,
 * scale interleaving, TRT-LLM's row shuffle) and the gated activations: argument tables,
 * checks, then the CPU kernels with the GIL released. */
#include "ops_quant.h"

#include <stddef.h>
#include <string.h>

#include "args.h"
#include "tensor.h"

static const fi_dtype u8_kind[] = {FI_DTYPE_U8};
static const fi_dtype float_kinds[] = {FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_F32};

/* These helpers have CPU kernels only: a CUDA tensor gets a message saying so. */
static int check_cpu(const char *op, fi_arg *const *args, int n)
{
    for (int i = 0; i < n; i++) {
        if (args[i]->t.device_type != FI_DEVICE_CPU) {
            PyErr_Format(PyExc_ValueError, "%s: %s is not a CPU tensor; %s runs on CPU tensors", op,
                         args[i]->name, op);
            return -1;
        }
    }
    return 0;
}

/* Reads the n tensors (those present), then checks they are CPU tensors. */
static int read_cpu(const char *op, fi_arg *const *args, int n)
{
    fi_arg *present[8];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!args[i]->obj)
            continue;
        if (fi_arg_read(args[i]) < 0)
            return -1;
        present[k++] = args[i];
    }
    return check_cpu(op, present, k);
}

typedef struct {
    fi_arg x_q, sf, global_scale, out;
    int sf_vec_size, sf_ue8m0, sf_layout;
} dequantize_call;

#define DQ(f) offsetof(dequantize_call, f)
static const fi_argspec dequantize_table[] = {
    {"x_q", DQ(x_q), FI_ARG_TENSOR, 1},
    {"sf", DQ(sf), FI_ARG_TENSOR, 1},
    {"global_scale", DQ(global_scale), FI_ARG_TENSOR, 1},
    {"out", DQ(out), FI_ARG_TENSOR, 1},
    {"sf_vec_size", DQ(sf_vec_size), FI_ARG_INT, 1},
    {"sf_ue8m0", DQ(sf_ue8m0), FI_ARG_BOOL, 1},
    {"sf_layout", DQ(sf_layout), FI_ARG_INT, 1},
};
#undef DQ

PyDoc_STRVAR(fp4_dequantize_doc,
             "fp4_dequantize(x_q, sf, global_scale, out, sf_vec_size, sf_ue8m0, sf_layout)\n--\n\n"
             "out (float32 [m, k]) = e2m1(x_q) * scale * global_scale for packed x_q uint8\n"
             "[m, k/2] and its uint8 block scales sf in layout sf_layout (0 128x4, 1 8x4, 2\n"
             "linear); global_scale: one float32, or None (1). CPU tensors.");

static PyObject *fp4_dequantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    (void)self;
    dequantize_call c = {0};
    if (fi_args_parse("fp4_dequantize", dequantize_table, FI_ARGS_COUNT(dequantize_table), &c, args,
                      nargs, kwnames) < 0)
        return NULL;
    fi_arg *all[] = {&c.x_q, &c.sf, &c.global_scale, &c.out};
    if (read_cpu("fp4_dequantize", all, 4) < 0)
        return NULL;
    static const fi_dtype f32[] = {FI_DTYPE_F32};
    static const fi_dtype sf_kinds[] = {FI_DTYPE_U8, FI_DTYPE_E4M3FN, FI_DTYPE_E8M0FNU};
    if (fi_arg_check_ndim(&c.x_q, 2, "[m, k/2]") < 0 ||
        fi_arg_check_dtype(&c.x_q, u8_kind, 1) < 0 || fi_arg_check_contiguous(&c.x_q) < 0 ||
        fi_arg_check_dtype(&c.sf, sf_kinds, 3) < 0 || fi_arg_check_contiguous(&c.sf) < 0)
        return NULL;
    if (c.sf_vec_size != 16 && c.sf_vec_size != 32)
        return PyErr_Format(PyExc_ValueError, "sf_vec_size: %d is not supported; accepted: 16, 32",
                            c.sf_vec_size);
    if (c.sf_layout < FI_SF_LAYOUT_128X4 || c.sf_layout > FI_SF_LAYOUT_LINEAR)
        return PyErr_Format(PyExc_ValueError,
                            "sf_layout: %d is not a layout; accepted: 0 (128x4), 1 (8x4), 2 "
                            "(linear)",
                            c.sf_layout);
    int64_t m = c.x_q.t.shape[0], k = c.x_q.t.shape[1] * 2;
    if (k % c.sf_vec_size != 0)
        return PyErr_Format(PyExc_ValueError,
                            "x_q: k = %lld (2 * x_q.shape[1]) is not a multiple of sf_vec_size %d",
                            (long long)k, c.sf_vec_size);
    int64_t need = fi_sf_bytes(m, k / c.sf_vec_size, (fi_sf_layout)c.sf_layout);
    if (fi_tensor_numel(&c.sf.t) < need)
        return PyErr_Format(PyExc_ValueError,
                            "sf: %lld scale bytes; the layout needs %lld for [%lld, %lld] blocks",
                            (long long)fi_tensor_numel(&c.sf.t), (long long)need, (long long)m,
                            (long long)(k / c.sf_vec_size));
    if (c.global_scale.obj && (fi_arg_check_dtype(&c.global_scale, f32, 1) < 0 ||
                               fi_arg_check_contiguous(&c.global_scale) < 0))
        return NULL;
    if (c.global_scale.obj && fi_tensor_numel(&c.global_scale.t) != 1)
        return PyErr_Format(PyExc_ValueError, "global_scale: %lld elements; accepted: one float32",
                            (long long)fi_tensor_numel(&c.global_scale.t));
    int64_t want[2] = {m, k};
    if (fi_arg_check_dtype(&c.out, f32, 1) < 0 || fi_arg_check_shape(&c.out, want, 2) < 0 ||
        fi_arg_check_contiguous(&c.out) < 0)
        return NULL;
    fi_fp4_dequantize_params p = {.x_q = c.x_q.t.data,
                                  .sf = c.sf.t.data,
                                  .m = m,
                                  .k = k,
                                  .sf_vec_size = c.sf_vec_size,
                                  .sf_ue8m0 = c.sf_ue8m0,
                                  .sf_layout = (fi_sf_layout)c.sf_layout,
                                  .global_scale = c.global_scale.obj ? c.global_scale.t.data : NULL,
                                  .out = c.out.t.data};
    Py_BEGIN_ALLOW_THREADS
    fi_fp4_dequantize_cpu(&p);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    fi_arg src, out;
} two_tensors;

static const fi_argspec interleave_table[] = {
    {"unswizzled_sf", offsetof(two_tensors, src), FI_ARG_TENSOR, 1},
    {"out", offsetof(two_tensors, out), FI_ARG_TENSOR, 1},
};

PyDoc_STRVAR(sf_interleave_doc,
             "sf_interleave(unswizzled_sf, out)\n--\n\n"
             "Writes the row-major scales unswizzled_sf ([rows, cols] or [batches, rows, cols],\n"
             "uint8 or bfloat16) into out (1-D, same dtype, batches x the padded 128x4 size)\n"
             "in the 128x4 layout, padding zeroed. CPU tensors.");

static PyObject *sf_interleave(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    (void)self;
    two_tensors c;
    if (fi_args_parse("sf_interleave", interleave_table, FI_ARGS_COUNT(interleave_table), &c, args,
                      nargs, kwnames) < 0)
        return NULL;
    fi_arg *all[] = {&c.src, &c.out};
    if (read_cpu("sf_interleave", all, 2) < 0)
        return NULL;
    static const fi_dtype kinds[] = {FI_DTYPE_U8, FI_DTYPE_BF16};
    if (fi_arg_check_dtype(&c.src, kinds, 2) < 0 || fi_arg_check_contiguous(&c.src) < 0)
        return NULL;
    int nd = c.src.t.ndim;
    if (nd != 2 && nd != 3)
        return PyErr_Format(PyExc_ValueError,
                            "unswizzled_sf: expected [rows, cols] or [batches, rows, cols], got "
                            "%d dimensions",
                            nd);
    int64_t batches = nd == 3 ? c.src.t.shape[0] : 1;
    int64_t rows = c.src.t.shape[nd - 2], cols = c.src.t.shape[nd - 1];
    int64_t want[1] = {batches * fi_sf_bytes(rows, cols, FI_SF_LAYOUT_128X4)};
    fi_dtype same[1] = {c.src.t.dtype};
    if (fi_arg_check_dtype(&c.out, same, 1) < 0 || fi_arg_check_shape(&c.out, want, 1) < 0 ||
        fi_arg_check_contiguous(&c.out) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    fi_sf_interleave_cpu(c.src.t.data, batches, rows, cols, fi_dtype_size(c.src.t.dtype),
                         c.out.t.data);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    fi_arg src, out;
    int epilogue_tile_m;
} shuffle_call;

static const fi_argspec shuffle_table[] = {
    {"input", offsetof(shuffle_call, src), FI_ARG_TENSOR, 1},
    {"out", offsetof(shuffle_call, out), FI_ARG_TENSOR, 1},
    {"epilogue_tile_m", offsetof(shuffle_call, epilogue_tile_m), FI_ARG_INT, 1},
};

PyDoc_STRVAR(shuffle_rows_doc,
             "shuffle_rows(input, out, epilogue_tile_m)\n--\n\n"
             "TRT-LLM's shuffleMatrixA: out (shaped as input, contiguous 2-D) gets input's rows\n"
             "permuted in blocks of 32 (epilogue_tile_m a multiple of 128) or 16. CPU tensors.");

static PyObject *shuffle_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    (void)self;
    shuffle_call c;
    if (fi_args_parse("shuffle_rows", shuffle_table, FI_ARGS_COUNT(shuffle_table), &c, args, nargs,
                      kwnames) < 0)
        return NULL;
    fi_arg *all[] = {&c.src, &c.out};
    if (read_cpu("shuffle_rows", all, 2) < 0 || fi_arg_check_ndim(&c.src, 2, "[m, k]") < 0 ||
        fi_arg_check_contiguous(&c.src) < 0)
        return NULL;
    int block = c.epilogue_tile_m % 128 == 0 ? 32 : 16;
    int64_t rows = c.src.t.shape[0];
    if (rows % block != 0)
        return PyErr_Format(PyExc_ValueError,
                            "input: %lld rows; accepted: a multiple of %d (epilogue_tile_m %d)",
                            (long long)rows, block, c.epilogue_tile_m);
    fi_dtype same[1] = {c.src.t.dtype};
    if (fi_arg_check_dtype(&c.out, same, 1) < 0 ||
        fi_arg_check_shape(&c.out, c.src.t.shape, 2) < 0 || fi_arg_check_contiguous(&c.out) < 0)
        return NULL;
    int64_t row_bytes = c.src.t.shape[1] * (int64_t)fi_dtype_size(c.src.t.dtype);
    Py_BEGIN_ALLOW_THREADS
    fi_shuffle_rows_cpu(c.src.t.data, rows, row_bytes, block, c.out.t.data);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    fi_arg x, out;
    const char *act;
} act_call;

static const fi_argspec act_table[] = {
    {"input", offsetof(act_call, x), FI_ARG_TENSOR, 1},
    {"out", offsetof(act_call, out), FI_ARG_TENSOR, 1},
    {"act", offsetof(act_call, act), FI_ARG_STR, 1},
};

PyDoc_STRVAR(act_and_mul_doc,
             "act_and_mul(input, out, act)\n--\n\n"
             "out = act(input[..., :d]) * input[..., d:] for input [..., 2d] and out [..., d]\n"
             "of one float dtype; act 'silu', 'gelu' or 'gelu_tanh'. CPU tensors.");

static PyObject *act_and_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    (void)self;
    act_call c;
    if (fi_args_parse("act_and_mul", act_table, FI_ARGS_COUNT(act_table), &c, args, nargs,
                      kwnames) < 0)
        return NULL;
    static const char *const names[] = {"silu", "gelu", "gelu_tanh"};
    int act = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(c.act, names[i]) == 0)
            act = i;
    if (act < 0)
        return PyErr_Format(PyExc_ValueError,
                            "act: '%.50s' is not supported; accepted: 'silu', 'gelu', "
                            "'gelu_tanh'",
                            c.act);
    fi_arg *all[] = {&c.x, &c.out};
    if (read_cpu("act_and_mul", all, 2) < 0 || fi_arg_check_dtype(&c.x, float_kinds, 3) < 0 ||
        fi_arg_check_contiguous(&c.x) < 0)
        return NULL;
    int nd = c.x.t.ndim;
    if (nd < 1 || c.x.t.shape[nd - 1] % 2 != 0)
        return PyErr_Format(PyExc_ValueError,
                            "input: the last dimension must be even (2 * d), got %lld",
                            nd < 1 ? 0LL : (long long)c.x.t.shape[nd - 1]);
    int64_t want[FI_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        want[i] = c.x.t.shape[i];
    want[nd - 1] /= 2;
    fi_dtype same[1] = {c.x.t.dtype};
    if (fi_arg_check_dtype(&c.out, same, 1) < 0 || fi_arg_check_shape(&c.out, want, nd) < 0 ||
        fi_arg_check_contiguous(&c.out) < 0)
        return NULL;
    int64_t d = want[nd - 1];
    fi_act_and_mul_params p = {.act = (fi_activation)act,
                               .x = c.x.t.data,
                               .out = c.out.t.data,
                               .dtype = c.x.t.dtype,
                               .rows = d ? fi_tensor_numel(&c.out.t) / d : 0,
                               .d = d,
                               .x_row_stride = 2 * d,
                               .out_row_stride = d};
    Py_BEGIN_ALLOW_THREADS
    fi_act_and_mul_cpu(&p);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#define FASTCALL(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef quant_methods[] = {
    {"fp4_dequantize", FASTCALL(fp4_dequantize), fp4_dequantize_doc},
    {"sf_interleave", FASTCALL(sf_interleave), sf_interleave_doc},
    {"shuffle_rows", FASTCALL(shuffle_rows), shuffle_rows_doc},
    {"act_and_mul", FASTCALL(act_and_mul), act_and_mul_doc},
    {NULL, NULL, 0, NULL},
};
#undef FASTCALL

int fi_quant_exec(PyObject *module) { return PyModule_AddFunctions(module, quant_methods); }
