/* flashinfer_kernels.h: the plain C interface between the extension glue and the
 * compute kernels. CPU kernels (kernels/cpu) and CUDA kernels (kernels/cuda) implement it. */
#ifndef FLASHINFER_KERNELS_H
#define FLASHINFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FI_MAX_DIMS 16

/* Every dtype torch has that we can name. Values are ours, not torch's. */
typedef enum {
    FI_DTYPE_UNKNOWN = 0,
    FI_DTYPE_F64,
    FI_DTYPE_F32,
    FI_DTYPE_F16,
    FI_DTYPE_BF16,
    FI_DTYPE_E4M3FN,
    FI_DTYPE_E4M3FNUZ,
    FI_DTYPE_E5M2,
    FI_DTYPE_E5M2FNUZ,
    FI_DTYPE_E8M0FNU,
    FI_DTYPE_FP4X2, /* float4_e2m1fn_x2: two packed E2M1 codes per byte */
    FI_DTYPE_I8,
    FI_DTYPE_I16,
    FI_DTYPE_I32,
    FI_DTYPE_I64,
    FI_DTYPE_U8,
    FI_DTYPE_U16,
    FI_DTYPE_U32,
    FI_DTYPE_U64,
    FI_DTYPE_BOOL,
    FI_DTYPE_C32, /* complex32 (chalf) */
    FI_DTYPE_C64,
    FI_DTYPE_C128,
    FI_DTYPE_COUNT
} fi_dtype;

typedef enum { FI_DEVICE_CPU = 0, FI_DEVICE_CUDA = 1, FI_DEVICE_OTHER = 2 } fi_device_type;

/* A strided view of tensor memory. Strides are in elements, as torch reports them. */
typedef struct {
    void *data; /* address of element [0, 0, ...] (storage offset applied) */
    int ndim;
    int64_t shape[FI_MAX_DIMS];
    int64_t stride[FI_MAX_DIMS];
    fi_dtype dtype;
    fi_device_type device_type;
    int device_index;
} fi_tensor;

/* Bytes per element; 0 for FI_DTYPE_UNKNOWN. */
static inline size_t fi_dtype_size(fi_dtype d)
{
    switch (d) {
    case FI_DTYPE_F64:
    case FI_DTYPE_I64:
    case FI_DTYPE_U64:
    case FI_DTYPE_C64:
        return 8;
    case FI_DTYPE_F32:
    case FI_DTYPE_I32:
    case FI_DTYPE_U32:
    case FI_DTYPE_C32:
        return 4;
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16:
    case FI_DTYPE_I16:
    case FI_DTYPE_U16:
        return 2;
    case FI_DTYPE_C128:
        return 16;
    case FI_DTYPE_UNKNOWN:
    case FI_DTYPE_COUNT:
        return 0;
    default:
        return 1;
    }
}

static inline int64_t fi_tensor_numel(const fi_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

#ifdef __cplusplus
}
#endif

#endif
