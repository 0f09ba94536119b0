/* activation.c: the gated activations of FlashInfer's activation module, out = act(x1) * x2
 * for x = [x1, x2] split along the last dimension, in float32 and rounded once to the
 * output's dtype. */
#include "flashinfer_kernels.h"

#include <math.h>

#include "fi_numeric.h"

static float load(const void *base, fi_dtype dtype, int64_t i)
{
    if (dtype == FI_DTYPE_F16)
        return fi_f16_to_f32(((const uint16_t *)base)[i]);
    if (dtype == FI_DTYPE_BF16)
        return fi_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

static void store(void *base, fi_dtype dtype, int64_t i, float x)
{
    if (dtype == FI_DTYPE_F16)
        ((uint16_t *)base)[i] = fi_f32_to_f16(x);
    else if (dtype == FI_DTYPE_BF16)
        ((uint16_t *)base)[i] = fi_f32_to_bf16(x);
    else
        ((float *)base)[i] = x;
}

static float activate(fi_activation act, float x)
{
    switch (act) {
    case FI_ACT_GELU:
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case FI_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f; /* sqrt(2 / pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case FI_ACT_SILU:
    default:
        return x / (1.0f + expf(-x));
    }
}

int fi_act_and_mul_cpu(const fi_act_and_mul_params *p)
{
    int64_t d = p->d, esize = (int64_t)fi_dtype_size(p->dtype);
    for (int64_t r = 0; r < p->rows; r++) {
        const char *x = (const char *)p->x + r * p->x_row_stride * esize;
        char *out = (char *)p->out + r * p->out_row_stride * esize;
        for (int64_t i = 0; i < d; i++)
            store(out, p->dtype, i,
                  activate(p->act, load(x, p->dtype, i)) * load(x, p->dtype, d + i));
    }
    return 0;
}
