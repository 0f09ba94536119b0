/* cublaslt_loader.cu: bmm_fp8 through cuBLASLt's fp8 matmul, the library dlopen'ed at first
 * use (nothing links against it), with the few types and enum values we need declared here. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <library_types.h>
#include <pthread.h>
#include <stdio.h>

#include "flashinfer_kernels.h"
#include "gemm_wmma.cuh"

namespace
{

/* ---- The part of the public cuBLASLt API we use (values from cublasLt.h / cublas_api.h,
 * stable since CUDA 11.8). Handles and descriptors are opaque pointers; enum arguments
 * are C enums, passed as int. */
typedef void *LtHandle;
typedef void *LtMatmulDesc;
typedef void *LtLayout;
typedef void *LtPreference;
typedef struct {
    uint64_t data[8];
} LtAlgo;
typedef struct {
    LtAlgo algo;
    size_t workspaceSize;
    int state; /* cublasStatus_t */
    float wavesCount;
    int reserved[4];
} LtHeuristic;

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    /* cublasLtMatmulDescAttributes_t */
    LT_DESC_TRANSA = 3,
    LT_DESC_TRANSB = 4,
    LT_DESC_A_SCALE_POINTER = 17,
    LT_DESC_B_SCALE_POINTER = 18,
    /* cublasLtMatrixLayoutAttribute_t */
    LT_LAYOUT_BATCH_COUNT = 5,          /* int32_t */
    LT_LAYOUT_STRIDED_BATCH_OFFSET = 6, /* int64_t */
    /* cublasLtMatmulPreferenceAttributes_t */
    LT_PREF_MAX_WORKSPACE_BYTES = 1, /* uint64_t */
};

typedef int create_fn(LtHandle *);
typedef int desc_create_fn(LtMatmulDesc *, int compute_type, int scale_type);
typedef int desc_destroy_fn(LtMatmulDesc);
typedef int desc_set_fn(LtMatmulDesc, int attr, const void *buf, size_t size);
typedef int layout_create_fn(LtLayout *, int type, uint64_t rows, uint64_t cols, int64_t ld);
typedef int layout_destroy_fn(LtLayout);
typedef int layout_set_fn(LtLayout, int attr, const void *buf, size_t size);
typedef int pref_create_fn(LtPreference *);
typedef int pref_destroy_fn(LtPreference);
typedef int pref_set_fn(LtPreference, int attr, const void *buf, size_t size);
typedef int heuristic_fn(LtHandle, LtMatmulDesc, LtLayout, LtLayout, LtLayout, LtLayout,
                         LtPreference, int requested, LtHeuristic *results, int *returned);
typedef int matmul_fn(LtHandle, LtMatmulDesc, const void *alpha, const void *A, LtLayout,
                      const void *B, LtLayout, const void *beta, const void *C, LtLayout, void *D,
                      LtLayout, const LtAlgo *algo, void *workspace, size_t workspace_bytes,
                      cudaStream_t stream);

struct LtApi {
    create_fn *create;
    desc_create_fn *desc_create;
    desc_destroy_fn *desc_destroy;
    desc_set_fn *desc_set;
    layout_create_fn *layout_create;
    layout_destroy_fn *layout_destroy;
    layout_set_fn *layout_set;
    pref_create_fn *pref_create;
    pref_destroy_fn *pref_destroy;
    pref_set_fn *pref_set;
    heuristic_fn *heuristic;
    matmul_fn *matmul;
};

/* Cache of the library (loaded once, never unloaded) and of one handle per device, both
 * created on first use under the lock and immutable afterwards. */
enum { MAX_DEVICES = 64 };
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
int g_tried;
LtApi g_api;
char g_name[1024];
LtHandle g_handles[MAX_DEVICES];

const char *const k_sonames[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};

int bind_symbols(void *lib, LtApi *api)
{
#define FI_BIND(field, sym)                                                                        \
    if (!(*(void **)&api->field = dlsym(lib, sym)))                                                \
        return -1;
    FI_BIND(create, "cublasLtCreate");
    FI_BIND(desc_create, "cublasLtMatmulDescCreate");
    FI_BIND(desc_destroy, "cublasLtMatmulDescDestroy");
    FI_BIND(desc_set, "cublasLtMatmulDescSetAttribute");
    FI_BIND(layout_create, "cublasLtMatrixLayoutCreate");
    FI_BIND(layout_destroy, "cublasLtMatrixLayoutDestroy");
    FI_BIND(layout_set, "cublasLtMatrixLayoutSetAttribute");
    FI_BIND(pref_create, "cublasLtMatmulPreferenceCreate");
    FI_BIND(pref_destroy, "cublasLtMatmulPreferenceDestroy");
    FI_BIND(pref_set, "cublasLtMatmulPreferenceSetAttribute");
    FI_BIND(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    FI_BIND(matmul, "cublasLtMatmul");
#undef FI_BIND
    return 0;
}

/* dlopen with `name`; keeps the library when every symbol binds. */
int try_open(const char *name, int flags)
{
    void *lib = dlopen(name, flags);
    if (!lib)
        return -1;
    LtApi api;
    if (bind_symbols(lib, &api) < 0) {
        dlclose(lib);
        return -1;
    }
    g_api = api;
    snprintf(g_name, sizeof(g_name), "%s", name);
    return 0;
}

/* Search order: a cuBLASLt the process already has (torch's), then lib_dir, then the
 * dynamic loader's path; newest soname first in each. Called with g_lock held. */
void load_locked(const char *lib_dir)
{
    if (g_tried)
        return;
    g_tried = 1;
    for (const char *so : k_sonames)
        if (try_open(so, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) == 0)
            return;
    if (lib_dir && lib_dir[0]) {
        char path[1024];
        for (const char *so : k_sonames) {
            int len = snprintf(path, sizeof(path), "%s/%s", lib_dir, so);
            if (len > 0 && (size_t)len < sizeof(path) && try_open(path, RTLD_NOW | RTLD_LOCAL) == 0)
                return;
        }
    }
    for (const char *so : k_sonames)
        if (try_open(so, RTLD_NOW | RTLD_LOCAL) == 0)
            return;
    g_name[0] = '\0';
}

/* The library's functions and the handle of `device` (current), or NULL. */
const LtApi *api_for(const char *lib_dir, int device, LtHandle *handle, const char **why)
{
    const LtApi *api = NULL;
    pthread_mutex_lock(&g_lock);
    load_locked(lib_dir);
    if (!g_name[0]) {
        *why = "libcublasLt could not be loaded";
    } else if (device < 0 || device >= MAX_DEVICES) {
        *why = "device index out of the handle cache's range";
    } else {
        if (!g_handles[device] && g_api.create(&g_handles[device]) != CUBLAS_STATUS_SUCCESS)
            g_handles[device] = NULL;
        if (g_handles[device]) {
            *handle = g_handles[device];
            api = &g_api;
        } else {
            *why = "cublasLtCreate failed";
        }
    }
    pthread_mutex_unlock(&g_lock);
    return api;
}

int lt_type(fi_dtype d)
{
    switch (d) {
    case FI_DTYPE_E4M3FN:
        return CUDA_R_8F_E4M3;
    case FI_DTYPE_E5M2:
        return CUDA_R_8F_E5M2;
    case FI_DTYPE_BF16:
        return CUDA_R_16BF;
    case FI_DTYPE_F16:
        return CUDA_R_16F;
    default:
        return -1;
    }
}

int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether cuBLASLt's fp8 matmul takes these operands: A row-major and B column-major
 * (so the column-major product out^T = B^T A^T is "TN"), 16-byte aligned pointers,
 * leading dimensions and batch strides, sizes within int32, and not e5m2 x e5m2. */
const char *unsupported(const fi_gemm_fp8_params *p)
{
    const fi_tensor *A = &p->a, *B = &p->b;
    int64_t batch = A->shape[0], m = A->shape[1], k = A->shape[2], n = B->shape[2];
    if (p->b_layout != FI_GEMM_B_STRIDED)
        return "B is not a [batch, k, n] tensor";
    if (lt_type(p->out.dtype) < 0)
        return "the output dtype is not bfloat16 or float16";
    if (A->dtype == FI_DTYPE_E5M2 && B->dtype == FI_DTYPE_E5M2)
        return "cuBLASLt has no e5m2 x e5m2 matmul";
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0 || k % 16 || n % 8)
        return "sizes: k must be a positive multiple of 16 and n of 8";
    if (batch > 0x7fffffff || m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff)
        return "sizes beyond int32";
    if (A->stride[2] != 1 || B->stride[1] != 1)
        return "A must be row-major and B column-major";
    int64_t lda = A->stride[1], ldb = B->stride[2];
    if ((m > 1 && lda < k) || (n > 1 && ldb < k) || lda % 16 || ldb % 16)
        return "leading dimensions must be >= k and multiples of 16";
    if (batch > 1 && (A->stride[0] % 16 || B->stride[0] % 16))
        return "batch strides must be multiples of 16";
    if (!aligned16(A->data) || !aligned16(B->data) || !aligned16(p->out.data))
        return "data pointers must be 16-byte aligned";
    return NULL;
}

/* A column-major rows x cols layout with leading dimension ld, batched when batch > 1. */
int make_layout(const LtApi *api, LtLayout *out, int type, int64_t rows, int64_t cols, int64_t ld,
                int64_t batch, int64_t batch_stride)
{
    if (api->layout_create(out, type, (uint64_t)rows, (uint64_t)cols, ld < rows ? rows : ld) !=
        CUBLAS_STATUS_SUCCESS) {
        *out = NULL;
        return -1;
    }
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        if (api->layout_set(*out, LT_LAYOUT_BATCH_COUNT, &count, sizeof(count)) !=
                CUBLAS_STATUS_SUCCESS ||
            api->layout_set(*out, LT_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                            sizeof(batch_stride)) != CUBLAS_STATUS_SUCCESS)
            return -1;
    }
    return 0;
}

} // namespace

extern "C" const char *fi_cublaslt_library(const char *lib_dir)
{
    pthread_mutex_lock(&g_lock);
    load_locked(lib_dir);
    const char *name = g_name[0] ? g_name : NULL;
    pthread_mutex_unlock(&g_lock);
    return name;
}

/* out (row-major [m, n], i.e. column-major n x m, ld n) = B^T A^T with cuBLASLt's "A" = B
 * (column-major k x n, ld B.stride[2], transposed) and "B" = A (column-major k x m, ld
 * A.stride[1]): the TN form fp8 matmul requires. Scales go through the scale pointers. */
extern "C" int fi_gemm_fp8_cublaslt(const fi_gemm_fp8_params *p, const char *lib_dir,
                                    void *workspace, size_t workspace_bytes, const char **why)
{
    const char *reason = unsupported(p);
    if (reason) {
        *why = reason;
        return -1;
    }
    const fi_tensor *A = &p->a, *B = &p->b;
    int64_t batch = A->shape[0], m = A->shape[1], k = A->shape[2], n = B->shape[2];

    fi_device_guard guard(A->device_index);
    if (guard.err != cudaSuccess) {
        *why = "cudaSetDevice failed";
        return -1;
    }
    LtHandle handle = NULL;
    const LtApi *api = api_for(lib_dir, A->device_index, &handle, why);
    if (!api)
        return -1;

    LtMatmulDesc desc = NULL;
    LtLayout la = NULL, lb = NULL, lc = NULL;
    LtPreference pref = NULL;
    int rc = -1;
    *why = "cuBLASLt rejected the matmul description";
    int32_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    uint64_t ws = workspace ? (uint64_t)workspace_bytes : 0;
    const void *lt_a_scale = p->b_scale, *lt_b_scale = p->a_scale;
    if (api->desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
        desc = NULL;
        goto done;
    }
    if (api->desc_set(desc, LT_DESC_TRANSA, &op_t, sizeof(op_t)) != CUBLAS_STATUS_SUCCESS ||
        api->desc_set(desc, LT_DESC_TRANSB, &op_n, sizeof(op_n)) != CUBLAS_STATUS_SUCCESS)
        goto done;
    if (lt_a_scale && api->desc_set(desc, LT_DESC_A_SCALE_POINTER, &lt_a_scale,
                                    sizeof(lt_a_scale)) != CUBLAS_STATUS_SUCCESS)
        goto done;
    if (lt_b_scale && api->desc_set(desc, LT_DESC_B_SCALE_POINTER, &lt_b_scale,
                                    sizeof(lt_b_scale)) != CUBLAS_STATUS_SUCCESS)
        goto done;
    if (make_layout(api, &la, lt_type(B->dtype), k, n, B->stride[2], batch, B->stride[0]) < 0 ||
        make_layout(api, &lb, lt_type(A->dtype), k, m, A->stride[1], batch, A->stride[0]) < 0 ||
        make_layout(api, &lc, lt_type(p->out.dtype), n, m, n, batch, m * n) < 0)
        goto done;
    if (api->pref_create(&pref) != CUBLAS_STATUS_SUCCESS) {
        pref = NULL;
        goto done;
    }
    if (api->pref_set(pref, LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) != CUBLAS_STATUS_SUCCESS)
        goto done;
    {
        /* room past one result in case a newer library's struct is larger */
        union {
            LtHeuristic h;
            unsigned char pad[1024];
        } result;
        int returned = 0;
        if (api->heuristic(handle, desc, la, lb, lc, lc, pref, 1, &result.h, &returned) !=
                CUBLAS_STATUS_SUCCESS ||
            returned < 1 || result.h.state != CUBLAS_STATUS_SUCCESS) {
            *why = "cuBLASLt has no algorithm for this matmul";
            goto done;
        }
        float alpha = 1.0f, beta = 0.0f;
        if (api->matmul(handle, desc, &alpha, B->data, la, A->data, lb, &beta, p->out.data, lc,
                        p->out.data, lc, &result.h.algo, workspace, (size_t)ws,
                        (cudaStream_t)p->stream) != CUBLAS_STATUS_SUCCESS) {
            *why = "cublasLtMatmul failed";
            goto done;
        }
        rc = 0;
    }
done:
    if (pref)
        api->pref_destroy(pref);
    if (lc)
        api->layout_destroy(lc);
    if (lb)
        api->layout_destroy(lb);
    if (la)
        api->layout_destroy(la);
    if (desc)
        api->desc_destroy(desc);
    return rc;
}
