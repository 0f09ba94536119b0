/* fi_numeric.h: scalar conversions between float32 and the narrow float formats (fp16,
 * bf16, float8, E2M1, UE8M0) bit-exact to torch's, and where fp4 block scales are stored. */
#ifndef FI_NUMERIC_H
#define FI_NUMERIC_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "flashinfer_kernels.h"

/* nvcc compiles these for the CUDA kernels too (the same rounding on host and device). */
#ifdef __CUDACC__
#define FI_NUMERIC_FN static inline __host__ __device__
#else
#define FI_NUMERIC_FN static inline
#endif

FI_NUMERIC_FN uint32_t fi_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

FI_NUMERIC_FN float fi_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16 -> float32 (exact). */
FI_NUMERIC_FN float fi_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f)
        return fi_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return fi_bits_f32(sign);
        /* subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return fi_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* float32 -> IEEE binary16, round to nearest even, overflow to inf. */
FI_NUMERIC_FN uint16_t fi_f32_to_f16(float f)
{
    uint32_t x = fi_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00 | ((absx >> 13) & 0x3ff));
    if (absx >= 0x477ff000u) /* rounds to >= 65520 -> inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below 2^-14: subnormal or zero */
        float a = fi_bits_f32(absx);
        /* 2^-24 units, rint uses round-to-nearest-even in the default mode */
        uint32_t m = (uint32_t)rintf(a * 16777216.0f);
        return (uint16_t)(sign | m);
    }
    uint32_t mant_odd = (absx >> 13) & 1;
    absx += 0xfff + mant_odd;
    return (uint16_t)(sign | ((absx - 0x38000000u) >> 13));
}

FI_NUMERIC_FN float fi_bf16_to_f32(uint16_t b) { return fi_bits_f32((uint32_t)b << 16); }

/* float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
FI_NUMERIC_FN uint16_t fi_f32_to_bf16(float f)
{
    uint32_t x = fi_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* Generic decoder for 8-bit minifloats with the given exponent/mantissa widths.
 * fnuz formats have no negative zero (0x80 is NaN) and their bias is one larger. */
FI_NUMERIC_FN float fi_fp8_decode(uint8_t v, int exp_bits, int man_bits, int bias)
{
    int sign = v >> 7;
    int exp = (v >> man_bits) & ((1 << exp_bits) - 1);
    int man = v & ((1 << man_bits) - 1);
    float r;
    if (exp == 0)
        r = ldexpf((float)man, 1 - bias - man_bits);
    else
        r = ldexpf((float)(man | (1 << man_bits)), exp - bias - man_bits);
    return sign ? -r : r;
}

/* float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN, max 448. */
FI_NUMERIC_FN float fi_e4m3fn_to_f32(uint8_t v)
{
    if ((v & 0x7f) == 0x7f)
        return NAN;
    return fi_fp8_decode(v, 4, 3, 7);
}

/* float8_e5m2: IEEE-like, bias 15, exponent 31 is inf/NaN. */
FI_NUMERIC_FN float fi_e5m2_to_f32(uint8_t v)
{
    if (((v >> 2) & 0x1f) == 0x1f)
        return (v & 3) ? NAN : ((v & 0x80) ? -INFINITY : INFINITY);
    return fi_fp8_decode(v, 5, 2, 15);
}

/* float8_e4m3fnuz: bias 8, 0x80 is the only NaN, no infinities, no -0. */
FI_NUMERIC_FN float fi_e4m3fnuz_to_f32(uint8_t v)
{
    if (v == 0x80)
        return NAN;
    return fi_fp8_decode(v, 4, 3, 8);
}

/* float8_e5m2fnuz: bias 16, 0x80 is the only NaN, no infinities, no -0. */
FI_NUMERIC_FN float fi_e5m2fnuz_to_f32(uint8_t v)
{
    if (v == 0x80)
        return NAN;
    return fi_fp8_decode(v, 5, 2, 16);
}

/* float8_e8m0fnu: unsigned exponent only, 2^(v-127); 0xff is NaN. */
FI_NUMERIC_FN float fi_e8m0fnu_to_f32(uint8_t v)
{
    if (v == 0xff)
        return NAN;
    return ldexpf(1.0f, (int)v - 127);
}

/* Rounds |f| (finite, >= 0) to a minifloat with man_bits mantissa bits and the given
 * bias, nearest even; returns the unsigned code, which may land one past the largest
 * finite encoding (the caller decides between saturation and infinity). */
FI_NUMERIC_FN uint32_t fi_minifloat_round(float a, int man_bits, int bias)
{
    if (a < ldexpf(1.0f, 1 - bias)) /* subnormal: units of 2^(1-bias-man_bits) */
        return (uint32_t)rintf(ldexpf(a, bias - 1 + man_bits));
    int e;
    float fr = frexpf(a, &e);                               /* a = fr * 2^e, fr in [0.5, 1) */
    uint32_t q = (uint32_t)rintf(ldexpf(fr, man_bits + 1)); /* in [2^m, 2^(m+1)] */
    int ex = e - 1 + bias;
    if (q == (1u << (man_bits + 1))) {
        q >>= 1;
        ex += 1;
    }
    return ((uint32_t)ex << man_bits) | (q - (1u << man_bits));
}

/* float32 -> float8_e4m3fn as torch's .to(float8_e4m3fn): round to nearest even,
 * out-of-range values and infinities saturate to +-448, NaN -> 0x7f (sign kept). */
FI_NUMERIC_FN uint8_t fi_f32_to_e4m3fn(float f)
{
    uint8_t sign = (uint8_t)((fi_f32_bits(f) >> 24) & 0x80);
    if (isnan(f))
        return (uint8_t)(sign | 0x7f);
    float a = fabsf(f);
    if (a >= 448.0f)
        return (uint8_t)(sign | 0x7e);
    uint32_t c = fi_minifloat_round(a, 3, 7);
    return (uint8_t)(sign | (c > 0x7e ? 0x7e : c));
}

/* float32 -> float8_e5m2, round to nearest even; overflow -> inf, NaN -> NaN. */
FI_NUMERIC_FN uint8_t fi_f32_to_e5m2(float f)
{
    uint8_t sign = (uint8_t)((fi_f32_bits(f) >> 24) & 0x80);
    if (isnan(f))
        return (uint8_t)(sign | 0x7f);
    float a = fabsf(f);
    if (a >= 61440.0f)
        return (uint8_t)(sign | 0x7c);
    uint32_t c = fi_minifloat_round(a, 2, 15);
    return (uint8_t)(sign | (c > 0x7c ? 0x7c : c));
}

/* E2M1 magnitudes by code 0..7. */
static const float fi_e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

FI_NUMERIC_FN float fi_e2m1_to_f32(uint8_t code)
{
#ifdef __CUDA_ARCH__
    const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}; /* no host table */
    float v = values[code & 7];
#else
    float v = fi_e2m1_values[code & 7];
#endif
    return (code & 8) ? -v : v;
}

/* float32 -> E2M1 code (sign in bit 3), round to nearest with ties to the even code,
 * saturating at 6. NaN encodes as +0 with its sign dropped. */
FI_NUMERIC_FN uint8_t fi_f32_to_e2m1(float f)
{
    uint8_t sign = (f < 0.0f || (f == 0.0f && signbit(f))) ? 8 : 0;
    float a = fabsf(f);
    uint8_t code;
    if (!(a == a))
        return 0;
    if (a <= 0.25f)
        code = 0;
    else if (a < 0.75f)
        code = 1;
    else if (a <= 1.25f)
        code = 2;
    else if (a < 1.75f)
        code = 3;
    else if (a <= 2.5f)
        code = 4;
    else if (a < 3.5f)
        code = 5;
    else if (a <= 5.0f)
        code = 6;
    else
        code = 7;
    return (uint8_t)(sign | code);
}

/* fi_f32_to_e4m3fn for a finite v >= 0 (a block's scale), without libm: normal results
 * round the float32 bits to three mantissa bits (nearest even), subnormal ones are
 * rint(v * 2^9) by the 2^23 trick; 448 and above saturate. */
FI_NUMERIC_FN uint8_t fi_nonnegative_to_e4m3fn(float v)
{
    if (v >= 448.0f)
        return 0x7e;
    if (v < 0x1p-6f)
        return (uint8_t)((v * 512.0f + 0x1p23f) - 0x1p23f);
    uint32_t bits = fi_f32_bits(v);
    bits += 0x7ffffu + ((bits >> 20) & 1);
    return (uint8_t)((bits >> 20) - ((127u - 7u) << 3));
}

/* UE8M0 code of the smallest power of two >= v (round toward +inf, as the MX
 * quantizers do), saturating at 2^127; 0 for v <= 2^-127, 0xff for NaN. */
FI_NUMERIC_FN uint8_t fi_f32_to_ue8m0_ceil(float v)
{
    if (isnan(v))
        return 0xff;
    if (!(v > ldexpf(1.0f, -127)))
        return 0;
    uint32_t bits = fi_f32_bits(v);
    uint32_t e = bits >> 23, m = bits & 0x7fffffu;
    if (e == 0xff)
        return 0xfe;
    if (e == 0) /* subnormal above 2^-127 */
        return 1;
    if (m != 0)
        e += 1;
    return (uint8_t)(e > 0xfe ? 0xfe : e);
}

/* Byte offset of the scale of (row r, block c) in a matrix with cols blocks per row
 * (fi_sf_bytes in flashinfer_kernels.h gives the whole matrix's size). */
FI_NUMERIC_FN int64_t fi_sf_offset(int64_t r, int64_t c, int64_t cols, fi_sf_layout layout)
{
    int64_t ktiles = (cols + 3) / 4;
    if (layout == FI_SF_LAYOUT_128X4)
        return ((r / 128) * ktiles + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
    if (layout == FI_SF_LAYOUT_8X4)
        return ((r / 8) * ktiles + c / 4) * 32 + (r % 8) * 4 + c % 4;
    return r * cols + c;
}

/* FlashInfer's ALiBi slope of query head `head` of num_heads (its get_alibi_slopes): with n
 * the largest power of two <= num_heads, m0^(head + 1) for the first n heads, m0 =
 * 2^(-8 / n), then m1^(2 (head - n) + 1), m1 = 2^(-4 / n); float32 powers of float32 bases. */
FI_NUMERIC_FN float fi_alibi_slope(int64_t head, int64_t num_heads)
{
    int64_t n = 1;
    while (n * 2 <= num_heads)
        n *= 2;
    if (head < n)
        return powf((float)exp2(-8.0 / (double)n), (float)(head + 1));
    return powf((float)exp2(-4.0 / (double)n), (float)(2 * (head - n) + 1));
}

/* NVFP4 per-token scales of a row whose largest |x| is amax, in FlashInfer's order of
 * operations (its exact-math kernel): the encode scale min((1 / global_scale_inv) / amax,
 * FLT_MAX) quantizes the row, and *decode = 1 / encode is the scale returned per token (0,
 * and an encode scale of 0, for an all-zero row). */
FI_NUMERIC_FN float fi_per_token_encode_scale(float amax, float global_scale_inv, float *decode)
{
    if (amax == 0.0f) {
        *decode = 0.0f;
        return 0.0f;
    }
    float encode = fminf((1.0f / global_scale_inv) / amax, FLT_MAX);
    if (encode == 0.0f)
        encode = 1.0f;
    *decode = 1.0f / encode;
    return encode;
}

#endif
