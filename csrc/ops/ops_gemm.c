/* ops_gemm.c: checks the arguments of the GEMM and fp4 entry points (types, devices,
 * dtypes, shapes, output buffers) and runs the CPU or CUDA kernels with the GIL released. */
#include "ops_gemm.h"

#include <stddef.h>
#include <string.h>

#include "args.h"
#include "fi_numeric.h"
#include "tensor.h"

/* Contiguous, or the transpose of a contiguous 2-D tensor (b_descale is passed as sf.T). */
static int is_dense(const fi_tensor *t)
{
    if (fi_tensor_is_contiguous(t))
        return 1;
    return t->ndim == 2 && (t->shape[0] == 1 || t->stride[0] == 1) &&
           (t->shape[1] == 1 || t->stride[1] == t->shape[0]);
}

/* A one-element float32 tensor (a scale or alpha). */
static int check_scalar_f32(const fi_arg *a)
{
    static const fi_dtype f32[] = {FI_DTYPE_F32};
    if (fi_arg_check_dtype(a, f32, 1) < 0)
        return -1;
    if (fi_tensor_numel(&a->t) != 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected one float32 value, got %lld elements", a->name,
                     (long long)fi_tensor_numel(&a->t));
        return -1;
    }
    return 0;
}

static int check_threads(int num_threads)
{
    if (num_threads >= 1 && num_threads <= 4096)
        return 0;
    PyErr_Format(PyExc_ValueError, "num_threads: %d is out of range; expected 1..4096",
                 num_threads);
    return -1;
}

/* rc of a kernel: 0, -1 (scratch memory ran out) or, from the CUDA kernels, > 0 with the
 * reason in fi_cuda_last_error(). */
static PyObject *kernel_result(int rc, const char *op)
{
    if (rc < 0)
        return PyErr_Format(PyExc_MemoryError, "%s: could not allocate kernel scratch memory", op);
#ifdef FI_WITH_CUDA
    if (rc > 0)
        return PyErr_Format(PyExc_RuntimeError, "%s: %s", op, fi_cuda_last_error());
#endif
    Py_RETURN_NONE;
}

static int on_cuda(const fi_tensor *t) { return t->device_type == FI_DEVICE_CUDA; }

/* The kernel for the tensors' device (the glue has refused CUDA in a build without it). */
static int run_gemm_fp8(const fi_gemm_fp8_params *p)
{
#ifdef FI_WITH_CUDA
    if (on_cuda(&p->a))
        return fi_gemm_fp8_cuda(p);
#endif
    return fi_gemm_fp8_cpu(p);
}

static int run_fp4_quantize(const fi_fp4_quantize_params *p)
{
#ifdef FI_WITH_CUDA
    if (on_cuda(&p->x))
        return fi_fp4_quantize_cuda(p);
#endif
    return fi_fp4_quantize_cpu(p);
}

static int run_gemm_fp4(const fi_gemm_fp4_params *p)
{
#ifdef FI_WITH_CUDA
    if (on_cuda(&p->a))
        return fi_gemm_fp4_cuda(p);
#endif
    return fi_gemm_fp4_cpu(p);
}

/* bmm_fp8's backend argument. */
enum { BMM_NATIVE = 0, BMM_CUBLASLT = 1, BMM_CUBLASLT_ONLY = 2 };

static const fi_dtype fp8_kinds[] = {FI_DTYPE_E4M3FN, FI_DTYPE_E5M2};

/* bmm_fp8 on CUDA tensors (already checked): cuBLASLt and/or the native kernel. */
static PyObject *bmm_fp8_cuda(fi_gemm_fp8_params *p, int backend, fi_arg *ws, const char *lib_dir,
                              fi_arg *out)
{
#ifdef FI_WITH_CUDA
    void *ws_data = NULL;
    size_t ws_bytes = 0;
    if (ws->obj) {
        static const fi_dtype u8[] = {FI_DTYPE_U8};
        fi_arg *pair[2] = {out, ws};
        if (fi_arg_read(ws) < 0 || fi_args_check_devices("bmm_fp8", pair, 2) < 0 ||
            fi_arg_check_dtype(ws, u8, 1) < 0 || fi_arg_check_contiguous(ws) < 0)
            return NULL;
        ws_data = ws->t.data;
        ws_bytes = (size_t)fi_tensor_numel(&ws->t);
    }
    int rc = 0, lt_done = 0;
    const char *why = "not tried";
    Py_BEGIN_ALLOW_THREADS
    if (backend != BMM_NATIVE)
        lt_done = fi_gemm_fp8_cublaslt(p, lib_dir, ws_data, ws_bytes, &why) == 0;
    if (!lt_done && backend != BMM_CUBLASLT_ONLY)
        rc = fi_gemm_fp8_cuda(p);
    Py_END_ALLOW_THREADS
    if (!lt_done && backend == BMM_CUBLASLT_ONLY)
        return PyErr_Format(PyExc_RuntimeError, "bmm_fp8: cuBLASLt did not run: %s", why);
    return kernel_result(rc, "bmm_fp8");
#else
    (void)p, (void)backend, (void)ws, (void)lib_dir, (void)out;
    return PyErr_Format(PyExc_ValueError, "bmm_fp8: this build has no CUDA support");
#endif
}

static const fi_dtype half_kinds[] = {FI_DTYPE_BF16, FI_DTYPE_F16};

PyDoc_STRVAR(bmm_fp8_doc,
             "bmm_fp8(A, B, A_scale, B_scale, out, num_threads, stream=0, backend=0,\n"
             "        workspace=None, lib_dir=None)\n--\n\n"
             "out = (A @ B) * A_scale * B_scale for fp8 A [b, m, k], B [b, k, n].\n"
             "CUDA tensors: launched on stream (a cudaStream_t as an int); backend 0 runs\n"
             "the native kernel, 1 cuBLASLt falling back to it, 2 cuBLASLt only\n"
             "(RuntimeError when it cannot); workspace is a uint8 CUDA tensor for cuBLASLt,\n"
             "lib_dir a directory searched for libcublasLt on first use.");

typedef struct {
    fi_arg A, B, as, bs, out, ws;
    int num_threads, backend;
    long long stream;
    const char *lib_dir;
} bmm_fp8_call;

#define BC(f) offsetof(bmm_fp8_call, f)
static const fi_argspec bmm_fp8_table[] = {
    {"A", BC(A), FI_ARG_TENSOR, 1},          {"B", BC(B), FI_ARG_TENSOR, 1},
    {"A_scale", BC(as), FI_ARG_TENSOR, 1},   {"B_scale", BC(bs), FI_ARG_TENSOR, 1},
    {"out", BC(out), FI_ARG_TENSOR, 1},      {"num_threads", BC(num_threads), FI_ARG_INT, 1},
    {"stream", BC(stream), FI_ARG_INT64, 0}, {"backend", BC(backend), FI_ARG_INT, 0},
    {"workspace", BC(ws), FI_ARG_TENSOR, 0}, {"lib_dir", BC(lib_dir), FI_ARG_PATH, 0},
};
#undef BC

static PyObject *py_bmm_fp8(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    (void)self;
    bmm_fp8_call c = {.backend = BMM_NATIVE};
    if (fi_args_parse("bmm_fp8", bmm_fp8_table, FI_ARGS_COUNT(bmm_fp8_table), &c, args, nargs,
                      kwnames) < 0)
        return NULL;
    if (c.backend < BMM_NATIVE || c.backend > BMM_CUBLASLT_ONLY)
        return PyErr_Format(PyExc_ValueError,
                            "backend: %d is not a backend; expected 0 (native), 1 (cuBLASLt, "
                            "else native) or 2 (cuBLASLt only)",
                            c.backend);
    fi_arg *all[] = {&c.A, &c.B, &c.as, &c.bs, &c.out};
    for (int i = 0; i < 4; i++)
        if (fi_arg_read(all[i]) < 0)
            return NULL;
    if (fi_args_check_devices("bmm_fp8", all, 4) < 0 ||
        fi_arg_check_dtype(&c.A, fp8_kinds, 2) < 0 || fi_arg_check_dtype(&c.B, fp8_kinds, 2) < 0 ||
        fi_arg_check_ndim(&c.A, 3, "[b, m, k]") < 0 || fi_arg_check_ndim(&c.B, 3, "[b, k, n]") < 0)
        return NULL;
    if (c.B.t.shape[0] != c.A.t.shape[0])
        return PyErr_Format(PyExc_ValueError,
                            "B: batch size %lld does not match A's batch size %lld",
                            (long long)c.B.t.shape[0], (long long)c.A.t.shape[0]);
    if (c.B.t.shape[1] != c.A.t.shape[2])
        return PyErr_Format(PyExc_ValueError,
                            "B: k = %lld (B.shape[1]) does not match A's k = %lld (A.shape[2])",
                            (long long)c.B.t.shape[1], (long long)c.A.t.shape[2]);
    int64_t want[3] = {c.A.t.shape[0], c.A.t.shape[1], c.B.t.shape[2]};
    if (check_scalar_f32(&c.as) < 0 || check_scalar_f32(&c.bs) < 0 || fi_arg_read(&c.out) < 0 ||
        fi_args_check_devices("bmm_fp8", all, 5) < 0 ||
        fi_arg_check_dtype(&c.out, half_kinds, 2) < 0 || fi_arg_check_shape(&c.out, want, 3) < 0 ||
        fi_arg_check_contiguous(&c.out) < 0 || check_threads(c.num_threads) < 0)
        return NULL;
    fi_gemm_fp8_params p = {.a = c.A.t,
                            .b = c.B.t,
                            .out = c.out.t,
                            .b_layout = FI_GEMM_B_STRIDED,
                            .a_scale = c.as.t.data,
                            .b_scale = c.bs.t.data,
                            .num_threads = c.num_threads,
                            .stream = (void *)(uintptr_t)c.stream};
    if (on_cuda(&c.A.t))
        return bmm_fp8_cuda(&p, c.backend, &c.ws, c.lib_dir, &c.out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fi_gemm_fp8_cpu(&p);
    Py_END_ALLOW_THREADS
    return kernel_result(rc, "bmm_fp8");
}

PyDoc_STRVAR(mm_fp8_doc, "mm_fp8(a, b, alpha, out, num_threads, stream=0)\n--\n\n"
                         "out = alpha * (a @ w.T) for e4m3 a [m, k] and the prepared weight\n"
                         "b [k // 128, n, 128]; alpha may be None.");

typedef struct {
    fi_arg a, b, alpha, out;
    int num_threads;
    long long stream;
} mm_fp8_call;

#define MC(f) offsetof(mm_fp8_call, f)
static const fi_argspec mm_fp8_table[] = {
    {"a", MC(a), FI_ARG_TENSOR, 1},
    {"b", MC(b), FI_ARG_TENSOR, 1},
    {"alpha", MC(alpha), FI_ARG_TENSOR, 1},
    {"out", MC(out), FI_ARG_TENSOR, 1},
    {"num_threads", MC(num_threads), FI_ARG_INT, 1},
    {"stream", MC(stream), FI_ARG_INT64, 0},
};
#undef MC

static PyObject *py_mm_fp8(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    (void)self;
    mm_fp8_call c = {.stream = 0};
    if (fi_args_parse("mm_fp8", mm_fp8_table, FI_ARGS_COUNT(mm_fp8_table), &c, args, nargs,
                      kwnames) < 0)
        return NULL;
    fi_arg *all[4] = {&c.a, &c.b, &c.alpha, &c.out};
    int n = c.alpha.obj ? 3 : 2;
    all[n] = &c.out;
    for (int i = 0; i < n; i++)
        if (fi_arg_read(all[i]) < 0)
            return NULL;
    static const fi_dtype e4m3[] = {FI_DTYPE_E4M3FN};
    if (fi_args_check_devices("mm_fp8", all, n) < 0 || fi_arg_check_dtype(&c.a, e4m3, 1) < 0 ||
        fi_arg_check_dtype(&c.b, e4m3, 1) < 0 || fi_arg_check_ndim(&c.a, 2, "[m, k]") < 0 ||
        fi_arg_check_ndim(&c.b, 3, "[k // 128, n, 128] (from prepare_low_latency_gemm_weights)") <
            0)
        return NULL;
    if (c.b.t.shape[2] != 128 || c.b.t.shape[0] * 128 != c.a.t.shape[1])
        return PyErr_Format(PyExc_ValueError,
                            "b: shape [%lld, %lld, %lld] does not fit a's k = %lld; expected "
                            "[k // 128, n, 128] with k a multiple of 128",
                            (long long)c.b.t.shape[0], (long long)c.b.t.shape[1],
                            (long long)c.b.t.shape[2], (long long)c.a.t.shape[1]);
    int64_t want[2] = {c.a.t.shape[0], c.b.t.shape[1]};
    if ((n == 3 && check_scalar_f32(&c.alpha) < 0) || fi_arg_read(&c.out) < 0 ||
        fi_args_check_devices("mm_fp8", all, n + 1) < 0 ||
        fi_arg_check_dtype(&c.out, half_kinds, 2) < 0 || fi_arg_check_shape(&c.out, want, 2) < 0 ||
        fi_arg_check_contiguous(&c.out) < 0 || check_threads(c.num_threads) < 0)
        return NULL;
    fi_gemm_fp8_params p = {.out = c.out.t,
                            .b = c.b.t,
                            .b_layout = FI_GEMM_B_BLOCK_K128,
                            .a_scale = n == 3 ? c.alpha.t.data : NULL,
                            .num_threads = c.num_threads};
    /* a as a batch of one: [1, m, k] */
    p.a = c.a.t;
    p.a.ndim = 3;
    p.a.shape[0] = 1, p.a.shape[1] = c.a.t.shape[0], p.a.shape[2] = c.a.t.shape[1];
    p.a.stride[0] = 0, p.a.stride[1] = c.a.t.stride[0], p.a.stride[2] = c.a.t.stride[1];
    p.out.ndim = 3;
    p.out.shape[0] = 1, p.out.shape[1] = c.out.t.shape[0], p.out.shape[2] = c.out.t.shape[1];
    p.stream = (void *)(uintptr_t)c.stream;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_gemm_fp8(&p);
    Py_END_ALLOW_THREADS
    return kernel_result(rc, "mm_fp8");
}

static int check_layout(int layout)
{
    if (layout == FI_SF_LAYOUT_128X4 || layout == FI_SF_LAYOUT_8X4 || layout == FI_SF_LAYOUT_LINEAR)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "sf_layout: %d is not a layout; expected 0 (128x4), 1 (8x4) or 2 (linear)",
                 layout);
    return -1;
}

static int check_sf_numel(const fi_arg *a, int64_t want)
{
    if (fi_tensor_numel(&a->t) == want)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: holds %lld scale bytes but the layout needs %lld", a->name,
                 (long long)fi_tensor_numel(&a->t), (long long)want);
    return -1;
}

/* The per-token outputs of fp4_quantize: per_token_scale float32 [m], out_scale one
 * float32; the quantization must be NVFP4 with a global scale that is not inversed. */
static int check_per_token(fi_fp4_quantize_params *p, fi_arg *pts, fi_arg *os, int64_t m)
{
    static const fi_dtype f32[] = {FI_DTYPE_F32};
    if (p->sf_vec_size != 16 || p->sf_ue8m0 || p->global_scale_inversed) {
        PyErr_SetString(PyExc_ValueError,
                        "per_token_scale: per-token quantization is NVFP4 (sf_vec_size 16, E4M3 "
                        "scales) with a global_scale that is not inversed");
        return -1;
    }
    int64_t want[1] = {m};
    if (fi_arg_check_dtype(pts, f32, 1) < 0 || fi_arg_check_shape(pts, want, 1) < 0 ||
        fi_arg_check_contiguous(pts) < 0)
        return -1;
    p->per_token_scale = pts->t.data;
    if (!os->obj)
        return 0;
    if (check_scalar_f32(os) < 0)
        return -1;
    p->out_scale = os->t.data;
    return 0;
}

/* row_map: int32 [>= m], each entry a row in [0, m) or negative, no row twice. */
static int check_row_map(const fi_arg *map, int64_t m, void *stream)
{
    static const fi_dtype i32[] = {FI_DTYPE_I32};
    if (fi_arg_check_ndim(map, 1, NULL) < 0 || fi_arg_check_dtype(map, i32, 1) < 0 ||
        fi_arg_check_contiguous(map) < 0)
        return -1;
    if (map->t.shape[0] < m) {
        PyErr_Format(PyExc_ValueError, "%s: %lld entries; accepted: at least m = %lld", map->name,
                     (long long)map->t.shape[0], (long long)m);
        return -1;
    }
    int32_t *copy;
    const int32_t *rows = fi_arg_int32_on_host(map, stream, &copy);
    uint8_t *seen = rows ? PyMem_Calloc((size_t)(m ? m : 1), 1) : NULL;
    int rc = rows && seen ? 0 : -1;
    if (rows && !seen)
        PyErr_NoMemory();
    for (int64_t i = 0; rc == 0 && i < m; i++) {
        if (rows[i] < 0)
            continue;
        if (rows[i] >= m || seen[rows[i]]) {
            PyErr_Format(PyExc_ValueError,
                         "%s[%lld] is %d; accepted: a row in [0, %lld) named once, "
                         "or a negative value (skip)",
                         map->name, (long long)i, (int)rows[i], (long long)m);
            rc = -1;
        } else {
            seen[rows[i]] = 1;
        }
    }
    PyMem_Free(seen);
    PyMem_Free(copy);
    return rc;
}

/* The global scale as the kernel takes it: a number (p->global_scale_value), a CPU
 * one-element float32/float16/bfloat16 tensor (its value read here), or a float32 tensor
 * on the input's CUDA device (p->global_scale). None: 1. */
static int read_global_scale(fi_arg *gs, const fi_arg *x, fi_fp4_quantize_params *p)
{
    p->global_scale_value = 1.0f;
    if (!gs->obj)
        return 0;
    if (!fi_is_tensor(gs->obj)) {
        if (PyBool_Check(gs->obj) || !(PyFloat_Check(gs->obj) || PyLong_Check(gs->obj))) {
            PyErr_Format(PyExc_TypeError,
                         "global_scale: expected a number or a one-element tensor, got %.200s",
                         Py_TYPE(gs->obj)->tp_name);
            return -1;
        }
        double v = PyFloat_AsDouble(gs->obj);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
        p->global_scale_value = (float)v;
        return 0;
    }
    static const fi_dtype scalar_kinds[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
    if (fi_arg_read(gs) < 0 || fi_arg_check_dtype(gs, scalar_kinds, 3) < 0)
        return -1;
    if (fi_tensor_numel(&gs->t) != 1) {
        PyErr_Format(PyExc_ValueError, "global_scale: expected one value, got %lld elements",
                     (long long)fi_tensor_numel(&gs->t));
        return -1;
    }
    if (gs->t.device_type == FI_DEVICE_CPU) {
        uint16_t h;
        switch (gs->t.dtype) {
        case FI_DTYPE_F16:
            memcpy(&h, gs->t.data, 2);
            p->global_scale_value = fi_f16_to_f32(h);
            break;
        case FI_DTYPE_BF16:
            memcpy(&h, gs->t.data, 2);
            p->global_scale_value = fi_bf16_to_f32(h);
            break;
        default:
            memcpy(&p->global_scale_value, gs->t.data, 4);
        }
        return 0;
    }
    static const fi_dtype f32[] = {FI_DTYPE_F32};
    fi_arg *pair[2] = {(fi_arg *)x, gs};
    if (fi_args_check_devices("fp4_quantize", pair, 2) < 0 || fi_arg_check_dtype(gs, f32, 1) < 0)
        return -1;
    p->global_scale = gs->t.data;
    return 0;
}

PyDoc_STRVAR(fp4_quantize_doc,
             "fp4_quantize(input, global_scale, x_q, sf, sf_vec_size, sf_use_ue8m0, sf_layout,\n"
             "             is_global_scale_inversed, num_threads, stream=0,\n"
             "             per_token_scale=None, out_scale=None, row_map=None,\n"
             "             nvfp4_4over6=None)\n--\n\n"
             "Quantizes input [m, k] (float32, float16, bfloat16 or float8_e4m3fn) into x_q\n"
             "[m, k/2] (uint8) and block scales sf. global_scale: None (1), a number, or a\n"
             "one-element tensor (float32/float16/bfloat16 on the CPU, float32 on CUDA).\n"
             "per_token_scale (float32 [m]): one decode scale per row (FlashInfer's order of\n"
             "operations), times out_scale; row_map (int32): only rows row_map[i] >= 0, i < m.\n"
             "nvfp4_4over6: None, or (e4m3_max, mse, err_use_fast_math) for FlashInfer's 4over6\n"
             "recipe (CPU tensors).");

typedef struct {
    fi_arg x, gs, xq, sf, pts, os, map;
    int sv, ue8m0, layout, inversed, num_threads;
    long long stream;
    PyObject *four_over_six;
} fp4_quantize_call;

#define FQ(f) offsetof(fp4_quantize_call, f)
static const fi_argspec fp4_quantize_table[] = {
    {"input", FQ(x), FI_ARG_TENSOR, 1},
    {"global_scale", FQ(gs), FI_ARG_TENSOR, 1},
    {"x_q", FQ(xq), FI_ARG_TENSOR, 1},
    {"sf", FQ(sf), FI_ARG_TENSOR, 1},
    {"sf_vec_size", FQ(sv), FI_ARG_INT, 1},
    {"sf_use_ue8m0", FQ(ue8m0), FI_ARG_BOOL, 1},
    {"sf_layout", FQ(layout), FI_ARG_INT, 1},
    {"is_global_scale_inversed", FQ(inversed), FI_ARG_BOOL, 1},
    {"num_threads", FQ(num_threads), FI_ARG_INT, 1},
    {"stream", FQ(stream), FI_ARG_INT64, 0},
    {"per_token_scale", FQ(pts), FI_ARG_TENSOR, 0},
    {"out_scale", FQ(os), FI_ARG_TENSOR, 0},
    {"row_map", FQ(map), FI_ARG_TENSOR, 0},
    {"nvfp4_4over6", FQ(four_over_six), FI_ARG_OBJECT, 0},
};
#undef FQ

/* nvfp4_4over6: None (off) or (e4m3_max, mse, err_fast_math), NVFP4 on CPU tensors. */
static int read_4over6(PyObject *recipe, fi_fp4_quantize_params *p)
{
    if (!recipe || recipe == Py_None)
        return 0;
    int e4m3_max, mse, fast;
    if (!PyTuple_Check(recipe) || !PyArg_ParseTuple(recipe, "ipp", &e4m3_max, &mse, &fast)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "nvfp4_4over6: expected None or (e4m3_max, mse, err_use_fast_math)");
        return -1;
    }
    if (e4m3_max != 256 && e4m3_max != 448) {
        PyErr_Format(PyExc_ValueError, "nvfp4_4over6: e4m3_max %d; accepted: 256, 448", e4m3_max);
        return -1;
    }
    if (p->sf_vec_size != 16 || p->sf_ue8m0) {
        PyErr_SetString(PyExc_ValueError,
                        "nvfp4_4over6 applies to NVFP4 only (sf_vec_size=16, E4M3 scales)");
        return -1;
    }
    if (p->x.device_type != FI_DEVICE_CPU) {
        PyErr_SetString(PyExc_ValueError,
                        "nvfp4_4over6: the 4over6 recipe runs on CPU tensors (no CUDA kernel)");
        return -1;
    }
    p->nvfp4_4over6 = 1;
    p->nvfp4_4over6_mse = mse;
    p->nvfp4_4over6_err_fast_math = fast;
    p->nvfp4_4over6_e4m3_max = (float)e4m3_max;
    return 0;
}

static PyObject *py_fp4_quantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    (void)self;
    fp4_quantize_call c = {.stream = 0};
    if (fi_args_parse("fp4_quantize", fp4_quantize_table, FI_ARGS_COUNT(fp4_quantize_table), &c,
                      args, nargs, kwnames) < 0)
        return NULL;
    c.map.name = "expanded_idx_to_permuted_idx";
    if (c.os.obj && !c.pts.obj)
        return PyErr_Format(PyExc_ValueError, "out_scale: only with per_token_scale");
    fi_arg *all[6] = {&c.x, &c.xq, &c.sf};
    int n = 3;
    fi_arg *optional[3] = {&c.pts, &c.os, &c.map};
    for (int i = 0; i < 3; i++)
        if (optional[i]->obj)
            all[n++] = optional[i];
    for (int i = 0; i < n; i++)
        if (fi_arg_read(all[i]) < 0)
            return NULL;
    static const fi_dtype inputs[] = {FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_F32, FI_DTYPE_E4M3FN};
    static const fi_dtype u8[] = {FI_DTYPE_U8};
    if (fi_args_check_devices("fp4_quantize", all, n) < 0 ||
        fi_arg_check_dtype(&c.x, inputs, 4) < 0 || fi_arg_check_ndim(&c.x, 2, "[m, k]") < 0 ||
        check_layout(c.layout) < 0 || check_threads(c.num_threads) < 0)
        return NULL;
    if (c.sv != 16 && c.sv != 32)
        return PyErr_Format(PyExc_ValueError, "sf_vec_size: %d is not supported; expected 16 or 32",
                            c.sv);
    int64_t m = c.x.t.shape[0], k = c.x.t.shape[1];
    if (k % c.sv != 0)
        return PyErr_Format(PyExc_ValueError,
                            "input: k = %lld (the last dimension) must be a multiple of "
                            "sf_vec_size = %d",
                            (long long)k, c.sv);
    int64_t want_q[2] = {m, k / 2};
    fi_fp4_quantize_params p = {.x = c.x.t,
                                .global_scale_inversed = c.inversed,
                                .sf_vec_size = c.sv,
                                .sf_ue8m0 = c.ue8m0,
                                .sf_layout = (fi_sf_layout)c.layout,
                                .num_threads = c.num_threads,
                                .stream = (void *)(uintptr_t)c.stream};
    if (read_global_scale(&c.gs, &c.x, &p) < 0 || fi_arg_check_dtype(&c.xq, u8, 1) < 0 ||
        fi_arg_check_shape(&c.xq, want_q, 2) < 0 || fi_arg_check_contiguous(&c.xq) < 0 ||
        fi_arg_check_dtype(&c.sf, u8, 1) < 0 || fi_arg_check_contiguous(&c.sf) < 0 ||
        check_sf_numel(&c.sf, fi_sf_bytes(m, k / c.sv, (fi_sf_layout)c.layout)) < 0)
        return NULL;
    p.x_q = c.xq.t.data;
    p.sf = c.sf.t.data;
    if (read_4over6(c.four_over_six, &p) < 0)
        return NULL;
    if ((c.pts.obj && check_per_token(&p, &c.pts, &c.os, m) < 0) ||
        (c.map.obj && check_row_map(&c.map, m, p.stream) < 0))
        return NULL;
    p.row_map = c.map.obj ? c.map.t.data : NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_fp4_quantize(&p);
    Py_END_ALLOW_THREADS
    return kernel_result(rc, "fp4_quantize");
}

PyDoc_STRVAR(mm_fp4_doc,
             "mm_fp4(a, b, a_descale, b_descale, alpha, out, block_size, sf_layout, sf_ue8m0,\n"
             "       num_threads, stream=0)\n--\n\n"
             "out = alpha * dequant(a) @ dequant(b) for packed fp4 a [m, k/2], b [k/2, n].");

typedef struct {
    fi_arg a, b, asf, bsf, alpha, out;
    int bs, layout, ue8m0, num_threads;
    long long stream;
} mm_fp4_call;

#define M4(f) offsetof(mm_fp4_call, f)
static const fi_argspec mm_fp4_table[] = {
    {"a", M4(a), FI_ARG_TENSOR, 1},           {"b", M4(b), FI_ARG_TENSOR, 1},
    {"a_descale", M4(asf), FI_ARG_TENSOR, 1}, {"b_descale", M4(bsf), FI_ARG_TENSOR, 1},
    {"alpha", M4(alpha), FI_ARG_TENSOR, 1},   {"out", M4(out), FI_ARG_TENSOR, 1},
    {"block_size", M4(bs), FI_ARG_INT, 1},    {"sf_layout", M4(layout), FI_ARG_INT, 1},
    {"sf_ue8m0", M4(ue8m0), FI_ARG_BOOL, 1},  {"num_threads", M4(num_threads), FI_ARG_INT, 1},
    {"stream", M4(stream), FI_ARG_INT64, 0},
};
#undef M4

static PyObject *py_mm_fp4(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    (void)self;
    mm_fp4_call c = {.stream = 0};
    if (fi_args_parse("mm_fp4", mm_fp4_table, FI_ARGS_COUNT(mm_fp4_table), &c, args, nargs,
                      kwnames) < 0)
        return NULL;
    fi_arg *all[6] = {&c.a, &c.b, &c.asf, &c.bsf, &c.alpha, &c.out};
    int n = c.alpha.obj ? 5 : 4;
    all[n] = &c.out;
    for (int i = 0; i < n; i++)
        if (fi_arg_read(all[i]) < 0)
            return NULL;
    static const fi_dtype packed[] = {FI_DTYPE_U8, FI_DTYPE_FP4X2};
    static const fi_dtype scales[] = {FI_DTYPE_U8, FI_DTYPE_E4M3FN, FI_DTYPE_E8M0FNU};
    if (fi_args_check_devices("mm_fp4", all, n) < 0 || fi_arg_check_dtype(&c.a, packed, 2) < 0 ||
        fi_arg_check_dtype(&c.b, packed, 2) < 0 || fi_arg_check_ndim(&c.a, 2, "[m, k/2]") < 0 ||
        fi_arg_check_ndim(&c.b, 2, "[k/2, n]") < 0 || check_layout(c.layout) < 0 ||
        check_threads(c.num_threads) < 0)
        return NULL;
    if (c.bs != 16 && c.bs != 32)
        return PyErr_Format(PyExc_ValueError, "block_size: %d is not supported; expected 16 or 32",
                            c.bs);
    if (c.b.t.shape[0] != c.a.t.shape[1])
        return PyErr_Format(PyExc_ValueError,
                            "b: k/2 = %lld (b.shape[0]) does not match a's k/2 = %lld "
                            "(a.shape[1])",
                            (long long)c.b.t.shape[0], (long long)c.a.t.shape[1]);
    int64_t m = c.a.t.shape[0], n_out = c.b.t.shape[1], k = c.a.t.shape[1] * 2;
    if (k % c.bs != 0)
        return PyErr_Format(PyExc_ValueError,
                            "a: k = %lld (2 * a.shape[1]) must be a multiple of block_size = %d",
                            (long long)k, c.bs);
    int64_t want[2] = {m, n_out};
    /* a's scales may be 8x4 (small-m friendly); b's then stay 128x4, as in FlashInfer */
    fi_sf_layout b_layout =
        c.layout == FI_SF_LAYOUT_8X4 ? FI_SF_LAYOUT_128X4 : (fi_sf_layout)c.layout;
    if (fi_arg_check_dtype(&c.asf, scales, 3) < 0 || fi_arg_check_dtype(&c.bsf, scales, 3) < 0 ||
        check_sf_numel(&c.asf, fi_sf_bytes(m, k / c.bs, (fi_sf_layout)c.layout)) < 0 ||
        check_sf_numel(&c.bsf, fi_sf_bytes(n_out, k / c.bs, b_layout)) < 0)
        return NULL;
    fi_arg *sfs[2] = {&c.asf, &c.bsf};
    for (int i = 0; i < 2; i++)
        if (!is_dense(&sfs[i]->t))
            return PyErr_Format(PyExc_ValueError,
                                "%s: must be contiguous (or the .T of a contiguous tensor), "
                                "as nvfp4_quantize returns it",
                                sfs[i]->name);
    if ((n == 5 && check_scalar_f32(&c.alpha) < 0) || fi_arg_read(&c.out) < 0 ||
        fi_args_check_devices("mm_fp4", all, n + 1) < 0 ||
        fi_arg_check_dtype(&c.out, half_kinds, 2) < 0 || fi_arg_check_shape(&c.out, want, 2) < 0 ||
        fi_arg_check_contiguous(&c.out) < 0)
        return NULL;
    fi_gemm_fp4_params p = {.a = c.a.t,
                            .b = c.b.t,
                            .a_sf = c.asf.t.data,
                            .b_sf = c.bsf.t.data,
                            .sf_layout = (fi_sf_layout)c.layout,
                            .b_sf_layout = b_layout,
                            .block_size = c.bs,
                            .sf_ue8m0 = c.ue8m0,
                            .alpha = n == 5 ? c.alpha.t.data : NULL,
                            .out = c.out.t,
                            .num_threads = c.num_threads,
                            .stream = (void *)(uintptr_t)c.stream};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_gemm_fp4(&p);
    Py_END_ALLOW_THREADS
    return kernel_result(rc, "mm_fp4");
}

PyDoc_STRVAR(cublaslt_library_doc,
             "cublaslt_library(lib_dir=None)\n--\n\n"
             "Loads cuBLASLt for bmm_fp8 if not yet tried (lib_dir is searched after the\n"
             "libraries the process has loaded); returns the name it was loaded by, or None\n"
             "(also in a build without CUDA).");

static const fi_argspec cublaslt_library_table[] = {
    {"lib_dir", 0, FI_ARG_PATH, 0},
};

static PyObject *py_cublaslt_library(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    (void)self;
    const char *lib_dir = NULL;
    if (fi_args_parse("cublaslt_library", cublaslt_library_table,
                      FI_ARGS_COUNT(cublaslt_library_table), &lib_dir, args, nargs, kwnames) < 0)
        return NULL;
#ifdef FI_WITH_CUDA
    const char *name;
    Py_BEGIN_ALLOW_THREADS
    name = fi_cublaslt_library(lib_dir);
    Py_END_ALLOW_THREADS
    if (name)
        return PyUnicode_DecodeFSDefault(name);
#endif
    Py_RETURN_NONE;
}

/* Every entry point parses its table (args.c): METH_FASTCALL | METH_KEYWORDS. */
#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef gemm_methods[] = {
    {"cublaslt_library", FASTCALL(py_cublaslt_library), cublaslt_library_doc},
    {"bmm_fp8", FASTCALL(py_bmm_fp8), bmm_fp8_doc},
    {"mm_fp8", FASTCALL(py_mm_fp8), mm_fp8_doc},
    {"fp4_quantize", FASTCALL(py_fp4_quantize), fp4_quantize_doc},
    {"mm_fp4", FASTCALL(py_mm_fp4), mm_fp4_doc},
    {NULL, NULL, 0, NULL},
};
#undef FASTCALL

int fi_gemm_exec(PyObject *module) { return PyModule_AddFunctions(module, gemm_methods); }
