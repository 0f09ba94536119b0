/* fp4_quantize.c: NVFP4 / MXFP4 quantization on the CPU: E2M1 values with one E4M3 or
 * UE8M0 scale per block of 16 or 32 elements. */
#include "flashinfer_kernels.h"

#include <float.h>
#include <pthread.h>
#include <string.h>

#include "cpu_simd.h"
#include "fi_numeric.h"

/* A block's scale code and the factor its values are multiplied by before rounding to
 * E2M1 (0 when the block is all zeros). */
typedef struct {
    uint8_t code;
    float scale;
} block_scale;

/* Decoded scale codes, built once per call. */
typedef struct {
    float sf[256];
} scale_table;

/* Inlined: a call from the AVX2 row loop would spill the block's vectors around it. */
static inline __attribute__((always_inline)) block_scale
scale_of_block(const fi_fp4_quantize_params *p, const scale_table *t, float gsf, float amax)
{
    float sf_value = gsf * amax;
    sf_value = sf_value / 6.0f;
    block_scale bs;
    float sf;
    if (p->sf_ue8m0) {
        bs.code = fi_f32_to_ue8m0_ceil(sf_value);
        sf = bs.code == 0 && !(sf_value > 0.0f) ? 0.0f : t->sf[bs.code];
    } else {
        bs.code = sf_value >= 0.0f && sf_value < INFINITY ? fi_nonnegative_to_e4m3fn(sf_value)
                                                          : fi_f32_to_e4m3fn(sf_value);
        sf = t->sf[bs.code];
    }
    bs.scale = sf == 0.0f ? 0.0f : gsf / sf;
    return bs;
}

static float load_f32(const fi_tensor *x, const char *row, int64_t col)
{
    const char *at = row + col * x->stride[1] * (int64_t)fi_dtype_size(x->dtype);
    uint16_t h;
    switch (x->dtype) {
    case FI_DTYPE_F16:
        memcpy(&h, at, 2);
        return fi_f16_to_f32(h);
    case FI_DTYPE_BF16:
        memcpy(&h, at, 2);
        return fi_bf16_to_f32(h);
    case FI_DTYPE_E4M3FN:
        return fi_e4m3fn_to_f32(*(const uint8_t *)at);
    default: {
        float f;
        memcpy(&f, at, 4);
        return f;
    }
    }
}

/* Quantizes row r: one scale per sf_vec_size elements, then the element codes. Any
 * strides; the reference the SIMD versions match bit for bit. */
static void quantize_row_portable(const fi_fp4_quantize_params *p, const scale_table *t, float gsf,
                                  int64_t r)
{
    const fi_tensor *x = &p->x;
    int64_t k = x->shape[1], sv = p->sf_vec_size, blocks = k / sv;
    const char *row = (const char *)x->data + r * x->stride[0] * (int64_t)fi_dtype_size(x->dtype);
    uint8_t *q = p->x_q + r * (k / 2);
    float vals[32];
    for (int64_t c = 0; c < blocks; c++) {
        float amax = 0.0f;
        for (int64_t e = 0; e < sv; e++) {
            vals[e] = load_f32(x, row, c * sv + e);
            amax = fmaxf(amax, fabsf(vals[e]));
        }
        block_scale bs = scale_of_block(p, t, gsf, amax);
        p->sf[fi_sf_offset(r, c, blocks, p->sf_layout)] = bs.code;
        for (int64_t e = 0; e < sv; e += 2) {
            uint8_t lo = bs.scale == 0.0f ? 0 : fi_f32_to_e2m1(vals[e] * bs.scale);
            uint8_t hi = bs.scale == 0.0f ? 0 : fi_f32_to_e2m1(vals[e + 1] * bs.scale);
            q[(c * sv + e) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* One 4over6 candidate error term: |d| or d^2. */
static float error_term(const fi_fp4_quantize_params *p, float d)
{
    return p->nvfp4_4over6_mse ? d * d : fabsf(d);
}

/* 4over6 block: both candidates quantized, the one with the smaller error kept (ties go to
 * the amax / 6 one). FlashInfer sums the error over each half block of 8 values, then
 * adds the halves; row_amax > 0 (per-token mode) measures it in the row's units. */
static uint8_t quantize_block_4over6(const fi_fp4_quantize_params *p, const float *vals, float gsf,
                                     float row_amax, uint8_t *q)
{
    float amax = 0.0f;
    for (int e = 0; e < 16; e++)
        amax = fmaxf(amax, fabsf(vals[e]));
    if (amax == 0.0f) {
        memset(q, 0, 8);
        return 0;
    }
    float sf6 = (amax / 6.0f) * gsf, sf4 = sf6 * 1.5f;
    uint8_t code[2] = {fi_f32_to_e4m3fn(sf4), fi_f32_to_e4m3fn(sf6)};
    float decode = 1.0f / gsf, denom = 6.0f * p->nvfp4_4over6_e4m3_max;
    uint8_t codes[2][16];
    float error[2];
    for (int c = 0; c < 2; c++) {
        float sf = fi_e4m3fn_to_f32(code[c]);
        float scale = fminf(1.0f / (sf * decode), FLT_MAX);
        float half[2] = {0.0f, 0.0f};
        for (int e = 0; e < 16; e++) {
            codes[c][e] = fi_f32_to_e2m1(vals[e] * scale);
            float v = fi_e2m1_to_f32(codes[c][e]), d;
            if (p->nvfp4_4over6_err_fast_math)
                d = v * sf - vals[e] * gsf;
            else if (row_amax > 0.0f)
                d = ((v * sf) * row_amax) / denom - vals[e];
            else
                d = (v * sf) * decode - vals[e];
            half[e / 8] += error_term(p, d);
        }
        error[c] = half[0] + half[1];
    }
    int pick = error[0] < error[1] ? 0 : 1;
    for (int e = 0; e < 16; e += 2)
        q[e / 2] = (uint8_t)(codes[pick][e] | (codes[pick][e + 1] << 4));
    return code[pick];
}

/* Row r by 4over6 blocks (portable; any strides). */
static void quantize_row_4over6(const fi_fp4_quantize_params *p, float gsf, float row_amax,
                                int64_t r)
{
    const fi_tensor *x = &p->x;
    int64_t k = x->shape[1], blocks = k / 16;
    const char *row = (const char *)x->data + r * x->stride[0] * (int64_t)fi_dtype_size(x->dtype);
    float vals[16];
    for (int64_t c = 0; c < blocks; c++) {
        for (int e = 0; e < 16; e++)
            vals[e] = load_f32(x, row, c * 16 + e);
        p->sf[fi_sf_offset(r, c, blocks, p->sf_layout)] =
            quantize_block_4over6(p, vals, gsf, row_amax, p->x_q + r * (k / 2) + c * 8);
    }
}

/* Per-token mode: max |x| over row r, NaNs skipped (fmaxf drops them). */
static float row_amax_portable(const fi_fp4_quantize_params *p, int64_t r)
{
    const fi_tensor *x = &p->x;
    const char *row = (const char *)x->data + r * x->stride[0] * (int64_t)fi_dtype_size(x->dtype);
    float amax = 0.0f;
    for (int64_t c = 0; c < x->shape[1]; c++)
        amax = fmaxf(amax, fabsf(load_f32(x, row, c)));
    return amax;
}

#ifdef FI_HAVE_X86_SIMD
/* Loops over arrays of vector registers are unrolled before gcc scalarizes the arrays;
 * otherwise the vectors go through the stack. */
#define UNROLLED _Pragma("GCC unroll 16")

/* The SIMD versions take a row a segment of this many blocks at a time, in three passes:
 * block maxima, scales (vectors of them, so no block waits on the divisions of its own),
 * codes (re-reading the segment from the L1 cache while the next one is prefetched). */
#define SEGMENT 128

/* The factor a block's values are multiplied by in the code pass: NaN where
 * scale_of_block gives 0, as every code of such a block is 0 and a NaN product encodes
 * as 0 (no branch per block). */
static inline float simd_factor(float scale) { return scale == 0.0f ? NAN : scale; }

/* Where row r's scale codes go: block c at base + (c / 4) * step + c % 4 in every layout
 * (fi_sf_offset keeps a row's blocks in groups of four), so codes are stored four at once. */
typedef struct {
    int64_t base, step;
} sf_row;

static sf_row sf_row_of(const fi_fp4_quantize_params *p, int64_t r, int64_t blocks)
{
    int64_t base = fi_sf_offset(r, 0, blocks, p->sf_layout);
    return (sf_row){base, fi_sf_offset(r, 4, blocks, p->sf_layout) - base};
}

/* Scale codes of blocks [c0, c0 + n) of a row, c0 a multiple of 4: one copy in the linear
 * layout, four bytes at a time in the swizzled ones. */
static inline void store_sf_codes(uint8_t *sf, sf_row at, int64_t c0, const uint8_t *code,
                                  int64_t n)
{
    if (at.step == 4) {
        memcpy(sf + at.base + c0, code, (size_t)n);
        return;
    }
    int64_t c = 0;
    for (; c + 4 <= n; c += 4)
        memcpy(sf + at.base + (c0 + c) / 4 * at.step, code + c, 4);
    for (; c < n; c++)
        sf[at.base + (c0 + c) / 4 * at.step + (c0 + c) % 4] = code[c];
}

/* Largest f16 / bf16 magnitude (sign bit cleared) that is not a NaN: infinity. */
static inline int16_t largest_number16(fi_dtype dtype)
{
    return dtype == FI_DTYPE_BF16 ? 0x7f80 : 0x7c00;
}

/* Scale codes and simd_factors of blocks [c, nb) through scale_of_block: the tail of a
 * segment, or all of it when a vector met a negative, infinite or NaN sf_value. */
static inline void block_scales_scalar(const fi_fp4_quantize_params *p, const scale_table *t,
                                       float gsf, const float *amax, int64_t c, int64_t nb,
                                       uint8_t *code, float *factor)
{
    for (; c < nb; c++) {
        block_scale bs = scale_of_block(p, t, gsf, amax[c]);
        code[c] = bs.code;
        factor[c] = simd_factor(bs.scale);
    }
}

/* ---- AVX2 + F16C ------------------------------------------------------------------ */

/* Eight contiguous elements as float32. */
FI_AVX2_INLINE __m256 load8_f32(const void *src, fi_dtype dtype)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
    case FI_DTYPE_BF16: {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    default:
        return _mm256_loadu_ps(src);
    }
}

/* Lane-wise max of |x| over the octets at src, NaN as 0: max_ps returns its second
 * operand when the first is NaN, and the running max never is. */
FI_AVX2_INLINE __m256 max_abs8(const char *src, fi_dtype dtype, int64_t octets)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    __m256 m = _mm256_setzero_ps();
    for (int64_t o = 0; o < octets; o++)
        m = _mm256_max_ps(_mm256_and_ps(load8_f32(src + 8 * o * esize, dtype), abs_mask), m);
    return m;
}

/* The largest lane of v. */
FI_AVX2_INLINE float hmax8(__m256 v)
{
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* The largest lane of each of v[0..8) in lane b: three rounds, each halving the vectors and
 * the lanes that hold one block's maxima (7 maxima and 14 shuffles for eight blocks). */
FI_AVX2_INLINE __m256 fold_max8(const __m256 *v)
{
    __m256 w[4], u[2];
    UNROLLED
    for (int i = 0; i < 4; i++) /* w[i]: lanes 0-3 of block 2i, 4-7 of block 2i + 1 */
        w[i] = _mm256_max_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    UNROLLED
    for (int j = 0; j < 2; j++) /* u[j], half h: lanes 0-1 of block 4j + h, 2-3 of 4j + 2 + h */
        u[j] = _mm256_max_ps(_mm256_shuffle_ps(w[2 * j], w[2 * j + 1], 0x44),
                             _mm256_shuffle_ps(w[2 * j], w[2 * j + 1], 0xee));
    /* half h, lane e: block 2e + h */
    __m256 r =
        _mm256_max_ps(_mm256_shuffle_ps(u[0], u[1], 0x88), _mm256_shuffle_ps(u[0], u[1], 0xdd));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Word-wise max of the magnitudes of one block of f16 or bf16 elements (sv of them) as
 * integers: the bits without the sign order as the values do, NaN (above infinity)
 * taken as 0. */
FI_AVX2_INLINE __m256i max_magnitude16(const char *src, fi_dtype dtype, int sv)
{
    const __m256i number = _mm256_set1_epi16(largest_number16(dtype));
    __m256i m = _mm256_setzero_si256();
    for (int o = 0; o < sv; o += 16) {
        __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + 2 * o)),
                                     _mm256_set1_epi16(0x7fff));
        m = _mm256_max_epu16(m, _mm256_andnot_si256(_mm256_cmpgt_epi16(a, number), a));
    }
    return m;
}

/* fold_max8 for eight vectors of 16 magnitude words, as float32 (exact). */
FI_AVX2_INLINE __m256 fold_max8_u16(const __m256i *v, fi_dtype dtype)
{
    __m256i w[4], u[2];
    UNROLLED
    for (int i = 0; i < 4; i++) /* w[i]: half 0 of block 2i, half 1 of block 2i + 1 */
        w[i] = _mm256_max_epu16(_mm256_permute2x128_si256(v[2 * i], v[2 * i + 1], 0x20),
                                _mm256_permute2x128_si256(v[2 * i], v[2 * i + 1], 0x31));
    UNROLLED
    for (int j = 0; j < 2; j++) /* u[j], half h: words 0-3 of block 4j + h, 4-7 of 4j + 2 + h */
        u[j] = _mm256_max_epu16(_mm256_unpacklo_epi64(w[2 * j], w[2 * j + 1]),
                                _mm256_unpackhi_epi64(w[2 * j], w[2 * j + 1]));
    /* half h, dword e: two words of block 2e + h; then their max in the low word */
    __m256 lo = _mm256_shuffle_ps(_mm256_castsi256_ps(u[0]), _mm256_castsi256_ps(u[1]), 0x88);
    __m256 hi = _mm256_shuffle_ps(_mm256_castsi256_ps(u[0]), _mm256_castsi256_ps(u[1]), 0xdd);
    __m256i r = _mm256_max_epu16(_mm256_castps_si256(lo), _mm256_castps_si256(hi));
    r = _mm256_max_epu16(r, _mm256_srli_epi32(r, 16));
    if (dtype == FI_DTYPE_BF16)
        return _mm256_permutevar8x32_ps(_mm256_castsi256_ps(_mm256_slli_epi32(r, 16)),
                                        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    /* f16: the low words, blocks 0 2 4 6 in half 0 and 1 3 5 7 in half 1, interleaved */
    const __m256i low_words =
        _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9,
                         12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i h = _mm256_shuffle_epi8(r, low_words);
    return _mm256_cvtph_ps(
        _mm_unpacklo_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* amax[c] for the nb blocks of a segment: eight at a time, the rest one by one. */
FI_AVX2_INLINE void block_maxima8(fi_dtype dtype, int sv, const char *seg, int64_t nb, float *amax)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype), c = 0;
    for (; c + 8 <= nb; c += 8) {
        const char *at = seg + c * sv * esize;
        if (dtype == FI_DTYPE_F32) {
            __m256 m[8];
            UNROLLED
            for (int b = 0; b < 8; b++)
                m[b] = max_abs8(at + b * sv * esize, dtype, sv / 8);
            _mm256_storeu_ps(amax + c, fold_max8(m));
        } else {
            __m256i m[8];
            UNROLLED
            for (int b = 0; b < 8; b++)
                m[b] = max_magnitude16(at + b * sv * esize, dtype, sv);
            _mm256_storeu_ps(amax + c, fold_max8_u16(m, dtype));
        }
    }
    for (; c < nb; c++)
        amax[c] = hmax8(max_abs8(seg + c * sv * esize, dtype, sv / 8));
}

/* sf_value = gsf * amax / 6 of eight blocks, as scale_of_block rounds it; all lanes finite
 * and not negative, else 0 (the caller then takes the scalar path). */
FI_AVX2_INLINE int sf_values8(float gsf, const float *amax, __m256 *v)
{
    *v = _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(gsf), _mm256_loadu_ps(amax)),
                       _mm256_set1_ps(6.0f));
    __m256 finite = _mm256_and_ps(_mm256_cmp_ps(*v, _mm256_setzero_ps(), _CMP_GE_OQ),
                                  _mm256_cmp_ps(*v, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
    return _mm256_movemask_ps(finite) == 0xff;
}

/* The codes as bytes, and simd_factor(gsf / sf): scale_of_block's 0, where sf or the
 * quotient is 0, becomes all-ones bits (a NaN). */
FI_AVX2_INLINE void store_scales8(float gsf, __m256i c, __m256 sf, uint8_t *code, float *factor)
{
    __m256 s = _mm256_div_ps(_mm256_set1_ps(gsf), sf), zero = _mm256_setzero_ps();
    __m256 dead =
        _mm256_or_ps(_mm256_cmp_ps(sf, zero, _CMP_EQ_OQ), _mm256_cmp_ps(s, zero, _CMP_EQ_OQ));
    _mm256_storeu_ps(factor, _mm256_or_ps(s, dead));
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64((__m128i *)code, _mm_packus_epi16(w, w));
}

/* E4M3 scales of eight blocks: fi_nonnegative_to_e4m3fn and the code's value on eight
 * lanes (exact). */
FI_AVX2_INLINE int e4m3_scales8(float gsf, const float *amax, uint8_t *code, float *factor)
{
    __m256 v;
    if (!sf_values8(gsf, amax, &v))
        return 0;
    __m256i bits = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 20), _mm256_set1_epi32(1));
    bits = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7ffff)));
    __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(bits, 20), _mm256_set1_epi32(120 << 3));
    __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(512.0f))); /* nearest even */
    __m256 tiny = _mm256_cmp_ps(v, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ);
    __m256 big = _mm256_cmp_ps(v, _mm256_set1_ps(448.0f), _CMP_GE_OQ);
    __m256i c = _mm256_blendv_epi8(normal, sub, _mm256_castps_si256(tiny));
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(0x7e), _mm256_castps_si256(big));
    /* the code's value: (code << 20) + (120 << 23) as float32 bits, or mantissa * 2^-9 */
    __m256i exp_field = _mm256_srli_epi32(c, 3);
    __m256 sf_normal = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(c, 20), _mm256_set1_epi32(120 << 23)));
    __m256 sf_sub = _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(0x1p-9f));
    __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpeq_epi32(exp_field, _mm256_setzero_si256()));
    store_scales8(gsf, c, _mm256_blendv_ps(sf_normal, sf_sub, is_sub), code, factor);
    return 1;
}

/* UE8M0 scales of eight blocks: fi_f32_to_ue8m0_ceil (the exponent, plus one unless a
 * power of two, 0 up to 2^-127, at most 254) and the code's value 2^(code - 127), which
 * is 2^-127 for code 0 when sf_value > 0. */
FI_AVX2_INLINE int ue8m0_scales8(float gsf, const float *amax, uint8_t *code, float *factor)
{
    __m256 v;
    if (!sf_values8(gsf, amax, &v))
        return 0;
    __m256i bits = _mm256_castps_si256(v), zero = _mm256_setzero_si256();
    __m256i power_of_two =
        _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)), zero);
    __m256i c = _mm256_add_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(1));
    c = _mm256_min_epi32(_mm256_add_epi32(c, power_of_two), _mm256_set1_epi32(254));
    __m256 above = _mm256_cmp_ps(v, _mm256_set1_ps(0x1p-127f), _CMP_GT_OQ);
    c = _mm256_and_si256(c, _mm256_castps_si256(above));
    __m256 positive = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ);
    __m256 sf_least = _mm256_and_ps(positive, _mm256_set1_ps(0x1p-127f));
    __m256 sf = _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_slli_epi32(c, 23)), sf_least,
                                 _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, zero)));
    store_scales8(gsf, c, sf, code, factor);
    return 1;
}

/* Scale codes and simd_factors of nb blocks from their maxima, eight at a time while every
 * sf_value is finite and not negative. */
FI_AVX2_INLINE void block_scales8(const fi_fp4_quantize_params *p, const scale_table *t, float gsf,
                                  const float *amax, int64_t nb, uint8_t *code, float *factor)
{
    int64_t c = 0;
    if (p->sf_ue8m0)
        for (; c + 8 <= nb && ue8m0_scales8(gsf, amax + c, code + c, factor + c); c += 8)
            ;
    else
        for (; c + 8 <= nb && e4m3_scales8(gsf, amax + c, code + c, factor + c); c += 8)
            ;
    block_scales_scalar(p, t, gsf, amax, c, nb, code, factor);
}

/* fi_f32_to_e2m1 on eight lanes (y = x * factor), by the float adder: |y|, clamped to 6,
 * is added to c = 2^(22 + e) + 2e, e = 0, 1, 2 for |y| < 2, < 4, <= 6. c's ulp, 2^(e - 1),
 * is the spacing of the E2M1 values in that range, so the sum rounds |y| to the nearest
 * one with ties to the even code (2e is even), and its low three bits are the code. The
 * sign goes to bit 3; NaN gives 0. */
FI_AVX2_INLINE __m256i e2m1_codes(__m256 y)
{
    /* c by the exponent of |y| (at least 127), the low three bits of which index it */
    const __m256i binade = _mm256_setr_epi32(0x4b000002, 0x4b800004, 0, 0, 0, 0, 0, 0x4a800000);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a = _mm256_min_ps(_mm256_and_ps(y, abs_mask), _mm256_set1_ps(6.0f));
    __m256i e =
        _mm256_max_epu32(_mm256_srli_epi32(_mm256_castps_si256(a), 23), _mm256_set1_epi32(127));
    __m256 c = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(binade, e));
    __m256i t = _mm256_castps_si256(_mm256_add_ps(a, c));
    __m256i sign = _mm256_srli_epi32(_mm256_castps_si256(y), 28); /* bit 3, exponent below */
    __m256i code =
        _mm256_xor_si256(_mm256_and_si256(_mm256_xor_si256(t, sign), _mm256_set1_epi32(7)), sign);
    return _mm256_and_si256(code, _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_ORD_Q)));
}

/* Thirty-two codes, c[j] holding elements 8j to 8j + 7, two per byte (element 2i in the
 * low nibble). */
FI_AVX2_INLINE __m128i pack_nibbles32(const __m256i *c)
{
    /* bytes, half h: c[0..3][4h..4h+3]; then words of even + 16 x odd code */
    __m256i b =
        _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
    __m256i pairs = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x1001));
    /* half h, word j: bytes 2h and 2h + 1 of c[j]'s four; interleaving the halves orders them */
    __m256i w = _mm256_packus_epi16(pairs, pairs);
    return _mm_unpacklo_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

/* The codes of the first `octets` (at most 4) octets at src, whose first element starts a
 * block; factor is that block's, sv a constant (the octet's block a shift away). */
FI_AVX2_INLINE __m128i encode32(fi_dtype dtype, int sv, const char *src, const float *factor,
                                int octets)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    __m256i codes[4];
    UNROLLED
    for (int j = 0; j < 4; j++) {
        __m256 s = _mm256_set1_ps(factor[8 * j / sv]);
        codes[j] = j < octets ? e2m1_codes(_mm256_mul_ps(load8_f32(src + 8 * j * esize, dtype), s))
                              : _mm256_setzero_si256();
    }
    return pack_nibbles32(codes);
}

/* quantize_row_portable for a row whose elements are contiguous, a segment at a time; sv
 * (16 or 32) a constant. */
FI_AVX2_INLINE void quantize_row_typed(fi_dtype dtype, int sv, const fi_fp4_quantize_params *p,
                                       const scale_table *t, float gsf, int64_t r)
{
    const fi_tensor *x = &p->x;
    int64_t k = x->shape[1], blocks = k / sv, esize = (int64_t)fi_dtype_size(dtype);
    const char *row = (const char *)x->data + r * x->stride[0] * esize;
    sf_row at = sf_row_of(p, r, blocks);
    float amax[SEGMENT], factor[SEGMENT];
    uint8_t code[SEGMENT];
    for (int64_t c0 = 0; c0 < blocks; c0 += SEGMENT) {
        int64_t nb = blocks - c0 < SEGMENT ? blocks - c0 : SEGMENT, n = nb * sv;
        const char *seg = row + c0 * sv * esize, *next = seg + n * esize;
        block_maxima8(dtype, sv, seg, nb, amax);
        block_scales8(p, t, gsf, amax, nb, code, factor);
        store_sf_codes(p->sf, at, c0, code, nb);
        uint8_t *out = p->x_q + r * (k / 2) + c0 * sv / 2;
        int64_t e = 0;
        for (; e + 32 <= n; e += 32) {
            for (int64_t b = 0; b < 32 * esize; b += 64)
                _mm_prefetch(next + e * esize + b, _MM_HINT_T0);
            _mm_storeu_si128((__m128i *)(out + e / 2),
                             encode32(dtype, sv, seg + e * esize, factor + e / sv, 4));
        }
        if (e < n) /* 16 elements */
            _mm_storel_epi64((__m128i *)(out + e / 2),
                             encode32(dtype, sv, seg + e * esize, factor + e / sv, 2));
    }
}

/* Per-token mode: row_amax_portable for a contiguous row. */
FI_AVX2_INLINE float row_amax_typed(fi_dtype dtype, const fi_fp4_quantize_params *p, int64_t r)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    const char *row = (const char *)p->x.data + r * p->x.stride[0] * esize;
    return hmax8(max_abs8(row, dtype, p->x.shape[1] / 8));
}

/* A SIMD level's row quantizer and per-token row maximum: one copy of its row loop TYPED
 * (and of AMAX) per input dtype and block size, so that the loads are not a switch per
 * element and block indices are shifts. */
#define ROW_DISPATCH(ATTR, LEVEL, TYPED, AMAX)                                                     \
    ATTR static void quantize_row_##LEVEL(const fi_fp4_quantize_params *p, const scale_table *t,   \
                                          float gsf, int64_t r)                                    \
    {                                                                                              \
        int sv32 = p->sf_vec_size == 32;                                                           \
        switch (p->x.dtype) {                                                                      \
        case FI_DTYPE_F16:                                                                         \
            sv32 ? TYPED(FI_DTYPE_F16, 32, p, t, gsf, r) : TYPED(FI_DTYPE_F16, 16, p, t, gsf, r);  \
            break;                                                                                 \
        case FI_DTYPE_BF16:                                                                        \
            sv32 ? TYPED(FI_DTYPE_BF16, 32, p, t, gsf, r)                                          \
                 : TYPED(FI_DTYPE_BF16, 16, p, t, gsf, r);                                         \
            break;                                                                                 \
        default:                                                                                   \
            sv32 ? TYPED(FI_DTYPE_F32, 32, p, t, gsf, r) : TYPED(FI_DTYPE_F32, 16, p, t, gsf, r);  \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    ATTR static float row_amax_##LEVEL(const fi_fp4_quantize_params *p, int64_t r)                 \
    {                                                                                              \
        switch (p->x.dtype) {                                                                      \
        case FI_DTYPE_F16:                                                                         \
            return AMAX(FI_DTYPE_F16, p, r);                                                       \
        case FI_DTYPE_BF16:                                                                        \
            return AMAX(FI_DTYPE_BF16, p, r);                                                      \
        default:                                                                                   \
            return AMAX(FI_DTYPE_F32, p, r);                                                       \
        }                                                                                          \
    }

ROW_DISPATCH(FI_AVX2, avx2, quantize_row_typed, row_amax_typed)

/* ---- AVX-512 (F, BW, VL, DQ) ---------------------------------------------------------- */

/* Sixteen contiguous elements as float32. */
FI_AVX512_INLINE __m512 load16_f32(const void *src, fi_dtype dtype)
{
    switch (dtype) {
    case FI_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
    case FI_DTYPE_BF16: {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    default:
        return _mm512_loadu_ps(src);
    }
}

/* max_abs8 on sixteen lanes. */
FI_AVX512_INLINE __m512 max_abs16(const char *src, fi_dtype dtype, int64_t chunks)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    __m512 m = _mm512_setzero_ps();
    for (int64_t o = 0; o < chunks; o++)
        m = _mm512_max_ps(_mm512_abs_ps(load16_f32(src + 16 * o * esize, dtype)), m);
    return m;
}

/* fold_max8 for sixteen vectors: four rounds (15 maxima, 30 shuffles, one permutation). */
FI_AVX512_INLINE __m512 fold_max16(const __m512 *v)
{
    __m512 w[8], u[4], s[2];
    UNROLLED
    for (int i = 0; i < 8; i++) /* w[i]: lanes 0-7 of block 2i, 8-15 of block 2i + 1 */
        w[i] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
    UNROLLED
    for (int j = 0; j < 4; j++) /* u[j], quarter q: block 4j + q */
        u[j] = _mm512_max_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0xdd));
    UNROLLED
    for (int i = 0; i < 2; i++) /* s[i], quarter q: lanes 0-1 of block 8i + q, 2-3 of 8i + 4 + q */
        s[i] = _mm512_max_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xee));
    /* quarter q, lane e: block 4e + q */
    __m512 r =
        _mm512_max_ps(_mm512_shuffle_ps(s[0], s[1], 0x88), _mm512_shuffle_ps(s[0], s[1], 0xdd));
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* max_magnitude16 for 32 elements: one block of 32, or two of 16 (one per half). */
FI_AVX512_INLINE __m512i magnitudes32(const char *src, fi_dtype dtype)
{
    __m512i a = _mm512_and_si512(_mm512_loadu_si512(src), _mm512_set1_epi16(0x7fff));
    return _mm512_maskz_mov_epi16(
        _mm512_cmple_epu16_mask(a, _mm512_set1_epi16(largest_number16(dtype))), a);
}

/* fold_max16 for eight vectors of 32 magnitude words, block 2i in half 0 of v[i] and
 * 2i + 1 in half 1, as float32 (exact). */
FI_AVX512_INLINE __m512 fold_max16_u16(const __m512i *v, fi_dtype dtype)
{
    __m512i u[4], w[2];
    UNROLLED
    for (int j = 0; j < 4; j++) /* u[j], quarter q: block 4j + q */
        u[j] = _mm512_max_epu16(_mm512_shuffle_i64x2(v[2 * j], v[2 * j + 1], 0x88),
                                _mm512_shuffle_i64x2(v[2 * j], v[2 * j + 1], 0xdd));
    UNROLLED
    for (int i = 0; i < 2; i++) /* w[i], quarter q: words 0-3 of block 8i + q, 4-7 of 8i + 4 + q */
        w[i] = _mm512_max_epu16(_mm512_unpacklo_epi64(u[2 * i], u[2 * i + 1]),
                                _mm512_unpackhi_epi64(u[2 * i], u[2 * i + 1]));
    /* quarter q, dword e: two words of block 4e + q; then their max in the low word */
    __m512 lo = _mm512_shuffle_ps(_mm512_castsi512_ps(w[0]), _mm512_castsi512_ps(w[1]), 0x88);
    __m512 hi = _mm512_shuffle_ps(_mm512_castsi512_ps(w[0]), _mm512_castsi512_ps(w[1]), 0xdd);
    __m512i r = _mm512_max_epu16(_mm512_castps_si512(lo), _mm512_castps_si512(hi));
    r = _mm512_max_epu16(r, _mm512_srli_epi32(r, 16));
    __m512 f = dtype == FI_DTYPE_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(r, 16))
                                      : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(r));
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f);
}

/* block_maxima8 sixteen blocks at a time. */
FI_AVX512_INLINE void block_maxima16(fi_dtype dtype, int sv, const char *seg, int64_t nb,
                                     float *amax)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype), c = 0;
    for (; c + 16 <= nb; c += 16) {
        const char *at = seg + c * sv * esize;
        if (dtype == FI_DTYPE_F32) {
            __m512 m[16];
            UNROLLED
            for (int b = 0; b < 16; b++)
                m[b] = max_abs16(at + b * sv * esize, dtype, sv / 16);
            _mm512_storeu_ps(amax + c, fold_max16(m));
            continue;
        }
        __m512i m[8];
        UNROLLED
        for (int i = 0; i < 8; i++) {
            if (sv == 16) {
                m[i] = magnitudes32(at + 64 * i, dtype);
                continue;
            }
            /* blocks of 32: the two blocks' halves folded into one vector */
            __m512i x = magnitudes32(at + 128 * i, dtype),
                    y = magnitudes32(at + 128 * i + 64, dtype);
            m[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(x, y, 0x44),
                                    _mm512_shuffle_i64x2(x, y, 0xee));
        }
        _mm512_storeu_ps(amax + c, fold_max16_u16(m, dtype));
    }
    for (; c < nb; c++)
        amax[c] = _mm512_reduce_max_ps(max_abs16(seg + c * sv * esize, dtype, sv / 16));
}

/* sf_values8 on sixteen lanes. */
FI_AVX512_INLINE int sf_values16(float gsf, const float *amax, __m512 *v)
{
    *v = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(gsf), _mm512_loadu_ps(amax)),
                       _mm512_set1_ps(6.0f));
    return (_mm512_cmp_ps_mask(*v, _mm512_setzero_ps(), _CMP_GE_OQ) &
            _mm512_cmp_ps_mask(*v, _mm512_set1_ps(INFINITY), _CMP_LT_OQ)) == 0xffff;
}

/* store_scales8 on sixteen lanes. */
FI_AVX512_INLINE void store_scales16(float gsf, __m512i c, __m512 sf, uint8_t *code, float *factor)
{
    __m512 s = _mm512_div_ps(_mm512_set1_ps(gsf), sf), zero = _mm512_setzero_ps();
    __mmask16 dead =
        _mm512_cmp_ps_mask(sf, zero, _CMP_EQ_OQ) | _mm512_cmp_ps_mask(s, zero, _CMP_EQ_OQ);
    _mm512_storeu_ps(factor, _mm512_mask_mov_ps(s, dead, _mm512_set1_ps(NAN)));
    _mm_storeu_si128((__m128i *)code, _mm512_cvtepi32_epi8(c));
}

/* e4m3_scales8 on sixteen lanes. */
FI_AVX512_INLINE int e4m3_scales16(float gsf, const float *amax, uint8_t *code, float *factor)
{
    __m512 v;
    if (!sf_values16(gsf, amax, &v))
        return 0;
    __m512i bits = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(1));
    bits = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7ffff)));
    __m512i c = _mm512_sub_epi32(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(120 << 3));
    __m512i sub = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(512.0f))); /* nearest even */
    c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(v, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ), sub);
    c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(v, _mm512_set1_ps(448.0f), _CMP_GE_OQ),
                              _mm512_set1_epi32(0x7e));
    __m512 sf = _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_slli_epi32(c, 20), _mm512_set1_epi32(120 << 23)));
    __mmask16 is_sub = _mm512_cmplt_epi32_mask(c, _mm512_set1_epi32(8));
    sf = _mm512_mask_mul_ps(sf, is_sub, _mm512_cvtepi32_ps(c), _mm512_set1_ps(0x1p-9f));
    store_scales16(gsf, c, sf, code, factor);
    return 1;
}

/* ue8m0_scales8 on sixteen lanes. */
FI_AVX512_INLINE int ue8m0_scales16(float gsf, const float *amax, uint8_t *code, float *factor)
{
    __m512 v;
    if (!sf_values16(gsf, amax, &v))
        return 0;
    __m512i bits = _mm512_castps_si512(v);
    __mmask16 inexact = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7fffff));
    __m512i c = _mm512_srli_epi32(bits, 23);
    c = _mm512_mask_add_epi32(c, inexact, c, _mm512_set1_epi32(1));
    c = _mm512_maskz_min_epi32(_mm512_cmp_ps_mask(v, _mm512_set1_ps(0x1p-127f), _CMP_GT_OQ), c,
                               _mm512_set1_epi32(254));
    __m512 sf_least = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ),
                                          _mm512_set1_ps(0x1p-127f));
    __m512 sf = _mm512_mask_mov_ps(_mm512_castsi512_ps(_mm512_slli_epi32(c, 23)),
                                   _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()), sf_least);
    store_scales16(gsf, c, sf, code, factor);
    return 1;
}

/* block_scales8 sixteen at a time. */
FI_AVX512_INLINE void block_scales16(const fi_fp4_quantize_params *p, const scale_table *t,
                                     float gsf, const float *amax, int64_t nb, uint8_t *code,
                                     float *factor)
{
    int64_t c = 0;
    if (p->sf_ue8m0)
        for (; c + 16 <= nb && ue8m0_scales16(gsf, amax + c, code + c, factor + c); c += 16)
            ;
    else
        for (; c + 16 <= nb && e4m3_scales16(gsf, amax + c, code + c, factor + c); c += 16)
            ;
    block_scales_scalar(p, t, gsf, amax, c, nb, code, factor);
}

/* e2m1_codes on sixteen lanes: min(|y|, 6) in one range instruction, the sign merged by
 * a bit select and NaN lanes zeroed by the mask. */
FI_AVX512_INLINE __m512i e2m1_codes16(__m512 y)
{
    const __m512i binade = _mm512_setr_epi32(0x4b000002, 0x4b800004, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                             0, 0, 0, 0x4a800000);
    __m512 a = _mm512_range_ps(y, _mm512_set1_ps(6.0f), 0x0a); /* smaller magnitude, sign 0 */
    __m512i e =
        _mm512_max_epu32(_mm512_srli_epi32(_mm512_castps_si512(a), 23), _mm512_set1_epi32(127));
    __m512 c = _mm512_castsi512_ps(_mm512_permutexvar_epi32(e, binade));
    __m512i t = _mm512_castps_si512(_mm512_add_ps(a, c));
    __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(y), 28);
    __mmask16 number = _mm512_cmp_ps_mask(y, y, _CMP_ORD_Q);
    /* 0xe4: bits of t where the third operand (7) is set, of sign elsewhere */
    return _mm512_maskz_ternarylogic_epi32(number, t, sign, _mm512_set1_epi32(7), 0xe4);
}

/* pack_nibbles32 for sixty-four codes, c[j] holding elements 16j to 16j + 15. */
FI_AVX512_INLINE __m256i pack_nibbles64(const __m512i *c)
{
    static const uint16_t order[32] = {0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27};
    __m512i b =
        _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
    __m512i pairs = _mm512_maddubs_epi16(b, _mm512_set1_epi16(0x1001));
    /* quarter h, word j: bytes 2h and 2h + 1 of c[j]'s eight, which go to word 4j + h */
    __m512i w = _mm512_packus_epi16(pairs, pairs);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_loadu_si512(order), w));
}

/* encode32 for four vectors of sixteen. */
FI_AVX512_INLINE __m256i encode64(fi_dtype dtype, int sv, const char *src, const float *factor,
                                  int chunks)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    __m512i codes[4];
    UNROLLED
    for (int j = 0; j < 4; j++) {
        __m512 s = _mm512_set1_ps(factor[16 * j / sv]);
        codes[j] = j < chunks
                       ? e2m1_codes16(_mm512_mul_ps(load16_f32(src + 16 * j * esize, dtype), s))
                       : _mm512_setzero_si512();
    }
    return pack_nibbles64(codes);
}

/* quantize_row_typed sixteen lanes wide. */
FI_AVX512_INLINE void quantize_row_typed16(fi_dtype dtype, int sv, const fi_fp4_quantize_params *p,
                                           const scale_table *t, float gsf, int64_t r)
{
    const fi_tensor *x = &p->x;
    int64_t k = x->shape[1], blocks = k / sv, esize = (int64_t)fi_dtype_size(dtype);
    const char *row = (const char *)x->data + r * x->stride[0] * esize;
    sf_row at = sf_row_of(p, r, blocks);
    float amax[SEGMENT], factor[SEGMENT];
    uint8_t code[SEGMENT];
    for (int64_t c0 = 0; c0 < blocks; c0 += SEGMENT) {
        int64_t nb = blocks - c0 < SEGMENT ? blocks - c0 : SEGMENT, n = nb * sv;
        const char *seg = row + c0 * sv * esize, *next = seg + n * esize;
        block_maxima16(dtype, sv, seg, nb, amax);
        block_scales16(p, t, gsf, amax, nb, code, factor);
        store_sf_codes(p->sf, at, c0, code, nb);
        uint8_t *out = p->x_q + r * (k / 2) + c0 * sv / 2;
        int64_t e = 0;
        for (; e + 64 <= n; e += 64) {
            for (int64_t b = 0; b < 64 * esize; b += 64)
                _mm_prefetch(next + e * esize + b, _MM_HINT_T0);
            _mm256_storeu_si256((__m256i *)(out + e / 2),
                                encode64(dtype, sv, seg + e * esize, factor + e / sv, 4));
        }
        if (e < n) /* 16, 32 or 48 elements */
            _mm256_mask_storeu_epi8(
                out + e / 2, (1u << (n - e) / 2) - 1,
                encode64(dtype, sv, seg + e * esize, factor + e / sv, (int)(n - e) / 16));
    }
}

FI_AVX512_INLINE float row_amax_typed16(fi_dtype dtype, const fi_fp4_quantize_params *p, int64_t r)
{
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    const char *row = (const char *)p->x.data + r * p->x.stride[0] * esize;
    return _mm512_reduce_max_ps(max_abs16(row, dtype, p->x.shape[1] / 16));
}

ROW_DISPATCH(FI_AVX512, avx512, quantize_row_typed16, row_amax_typed16)
#undef ROW_DISPATCH
#endif

/* A row quantizer and its per-token row maximum, for one SIMD level. */
typedef struct {
    void (*row)(const fi_fp4_quantize_params *, const scale_table *, float gsf, int64_t r);
    float (*row_amax)(const fi_fp4_quantize_params *, int64_t r);
} quantizer;

/* The widest version fi_cpu_isa allows; the SIMD ones read contiguous rows only. */
static quantizer pick_quantizer(const fi_fp4_quantize_params *p)
{
#ifdef FI_HAVE_X86_SIMD
    int wide = p->x.stride[1] == 1 && p->x.dtype != FI_DTYPE_E4M3FN; /* f32, f16, bf16 */
    fi_isa isa = wide ? fi_cpu_isa() : FI_ISA_PORTABLE;
    if (isa == FI_ISA_AVX512)
        return (quantizer){quantize_row_avx512, row_amax_avx512};
    if (isa == FI_ISA_AVX2)
        return (quantizer){quantize_row_avx2, row_amax_avx2};
#else
    (void)p;
#endif
    return (quantizer){quantize_row_portable, row_amax_portable};
}

typedef struct {
    const fi_fp4_quantize_params *p;
    const scale_table *table;
    quantizer quantize;
    float gsf;
    int64_t r0, r1; /* entries of the row map (rows themselves without one) */
} quantize_range;

/* Per-token mode: the global scale of row r from its amax (in *amax); writes
 * per_token_scale[r]. */
static float per_token_global_scale(const quantize_range *qr, int64_t r, float *amax)
{
    const fi_fp4_quantize_params *p = qr->p;
    *amax = qr->quantize.row_amax(p, r);
    float decode, encode = fi_per_token_encode_scale(*amax, qr->gsf, &decode);
    p->per_token_scale[r] = p->out_scale ? decode * *p->out_scale : decode;
    return encode;
}

static void *quantize_rows(void *arg)
{
    const quantize_range *qr = arg;
    const fi_fp4_quantize_params *p = qr->p;
    for (int64_t i = qr->r0; i < qr->r1; i++) {
        int64_t r = p->row_map ? p->row_map[i] : i;
        if (r < 0)
            continue;
        float amax = 0.0f;
        float gsf = p->per_token_scale ? per_token_global_scale(qr, r, &amax) : qr->gsf;
        if (p->nvfp4_4over6)
            quantize_row_4over6(p, gsf, amax, r);
        else
            qr->quantize.row(p, qr->table, gsf, r);
    }
    return NULL;
}

int fi_fp4_quantize_cpu(const fi_fp4_quantize_params *p)
{
    int64_t m = p->x.shape[0], k = p->x.shape[1];
    memset(p->sf, 0, (size_t)fi_sf_bytes(m, k / p->sf_vec_size, p->sf_layout));
    float gsf = p->global_scale ? *p->global_scale : p->global_scale_value;
    if (p->global_scale_inversed)
        gsf = 1.0f / gsf;
    enum { MAX_THREADS = 64, MIN_ROWS = 64 };
    int nt = p->num_threads < 1 ? 1 : (p->num_threads > MAX_THREADS ? MAX_THREADS : p->num_threads);
    if (nt > m / MIN_ROWS)
        nt = m / MIN_ROWS > 0 ? (int)(m / MIN_ROWS) : 1;
    scale_table table;
    for (int v = 0; v < 256; v++)
        table.sf[v] = p->sf_ue8m0 ? fi_e8m0fnu_to_f32((uint8_t)v) : fi_e4m3fn_to_f32((uint8_t)v);
    quantizer quantize = pick_quantizer(p);
    quantize_range ranges[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++)
        ranges[t] = (quantize_range){p, &table, quantize, gsf, m * t / nt, m * (t + 1) / nt};
    for (int t = 1; t < nt; t++)
        started[t] = pthread_create(&threads[t], NULL, quantize_rows, &ranges[t]) == 0;
    quantize_rows(&ranges[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(threads[t], NULL);
        else
            quantize_rows(&ranges[t]); /* could not start a thread: do its rows here */
    }
    return 0;
}
