/* fp4_quantize.c: NVFP4 / MXFP4 quantization on the CPU: E2M1 values with one E4M3 or
 * UE8M0 scale per block of 16 or 32 elements. */
#include "flashinfer_kernels.h"

#include <pthread.h>

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
    default: {
        float f;
        memcpy(&f, at, 4);
        return f;
    }
    }
}

/* Quantizes row r: one scale per sf_vec_size elements, then the element codes. */
static void quantize_row(const fi_fp4_quantize_params *p, const scale_table *t, float gsf,
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

/* Per-token mode: the global scale of row r from its amax; writes per_token_scale[r]. */
static float per_token_global_scale(const fi_fp4_quantize_params *p, int64_t r)
{
    const fi_tensor *x = &p->x;
    const char *row = (const char *)x->data + r * x->stride[0] * (int64_t)fi_dtype_size(x->dtype);
    float amax = 0.0f;
    for (int64_t c = 0; c < x->shape[1]; c++)
        amax = fmaxf(amax, fabsf(load_f32(x, row, c)));
    float s = amax * *p->global_scale;
    p->per_token_scale[r] = p->out_scale ? s * *p->out_scale : s;
    return s != 0.0f ? 1.0f / s : 0.0f;
}

#ifdef FI_HAVE_X86_SIMD
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

/* fi_f32_to_e2m1 on eight lanes, as a three-level search: |x| >= 1.75 picks the upper
 * half of the codes, then >= 3.5 or >= 0.75 the quarter, then > one of 0.25, 1.25, 2.5,
 * 5 (ties go to the even code). The sign bit is kept unless x is NaN (then +0). */
FI_AVX2_INLINE __m256i e2m1_codes(__m256 x)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 last = _mm256_setr_ps(0.25f, 1.25f, 2.5f, 5.0f, 0.0f, 0.0f, 0.0f, 0.0f);
    __m256 a = _mm256_and_ps(x, abs_mask);
    __m256 upper = _mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_GE_OQ);
    __m256 quarter_at = _mm256_blendv_ps(_mm256_set1_ps(0.75f), _mm256_set1_ps(3.5f), upper);
    __m256 quarter = _mm256_cmp_ps(a, quarter_at, _CMP_GE_OQ);
    __m256i two_bits =
        _mm256_or_si256(_mm256_and_si256(_mm256_castps_si256(upper), _mm256_set1_epi32(2)),
                        _mm256_and_si256(_mm256_castps_si256(quarter), _mm256_set1_epi32(1)));
    __m256 odd = _mm256_cmp_ps(a, _mm256_permutevar8x32_ps(last, two_bits), _CMP_GT_OQ);
    __m256i code = _mm256_sub_epi32(_mm256_add_epi32(two_bits, two_bits), _mm256_castps_si256(odd));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 28),
                                    _mm256_set1_epi32(8)); /* bit 31 -> bit 3 */
    __m256i number = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_ORD_Q));
    return _mm256_or_si256(code, _mm256_and_si256(sign, number));
}

/* Sixteen codes (element order) packed two per byte, element 2j in the low nibble. */
FI_AVX2_INLINE __m128i pack_nibbles(__m256i c0, __m256i c1)
{
    __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xd8);
    __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    __m128i pairs = _mm_or_si128(b, _mm_srli_epi16(b, 4)); /* low byte: b[2j] | b[2j+1] << 4 */
    return _mm_packus_epi16(_mm_and_si128(pairs, _mm_set1_epi16(0xff)), _mm_setzero_si128());
}

/* Scale codes of 8 blocks, and the factors their values are multiplied by, from their
 * absolute maxima: fi_nonnegative_to_e4m3fn and the code's value on eight lanes (exact),
 * or 0 when some block's sf_value is negative, infinite or NaN (the caller then takes
 * the scalar path). */
FI_AVX2_INLINE int e4m3_scales8(float gsf, const float *amax, int32_t *code, float *scale)
{
    __m256 v = _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(gsf), _mm256_loadu_ps(amax)),
                             _mm256_set1_ps(6.0f));
    __m256 finite = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ),
                                  _mm256_cmp_ps(v, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
    if (_mm256_movemask_ps(finite) != 0xff)
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
    __m256 sf = _mm256_blendv_ps(sf_normal, sf_sub, is_sub);
    __m256 zero = _mm256_cmp_ps(sf, _mm256_setzero_ps(), _CMP_EQ_OQ);
    __m256 s = _mm256_andnot_ps(zero, _mm256_div_ps(_mm256_set1_ps(gsf), sf));
    _mm256_storeu_si256((__m256i *)code, c);
    _mm256_storeu_ps(scale, s);
    return 1;
}

/* quantize_row for a row whose elements are contiguous, SEGMENT blocks at a time in three
 * passes (maxima; scales, eight blocks at once for E4M3; codes), so no block waits on
 * the divisions of its own scale. */
FI_AVX2_INLINE void quantize_row_typed(fi_dtype dtype, const fi_fp4_quantize_params *p,
                                       const scale_table *t, float gsf, int64_t r)
{
    enum { SEGMENT = 256 };
    const fi_tensor *x = &p->x;
    int64_t k = x->shape[1], sv = p->sf_vec_size, blocks = k / sv, chunks = sv / 8;
    int64_t esize = (int64_t)fi_dtype_size(dtype);
    fi_sf_layout layout = p->sf_layout;
    const char *row = (const char *)x->data + r * x->stride[0] * esize;
    uint8_t *q = p->x_q + r * (k / 2), *sf = p->sf;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    float amax[SEGMENT], scale[SEGMENT];
    int32_t code[SEGMENT];
    for (int64_t c0 = 0; c0 < blocks; c0 += SEGMENT) {
        int64_t nb = blocks - c0 < SEGMENT ? blocks - c0 : SEGMENT;
        for (int64_t c = 0; c < nb; c++) {
            const char *at = row + (c0 + c) * sv * esize;
            __m256 m8 = _mm256_setzero_ps();
            for (int64_t e = 0; e < chunks; e++) /* max_ps returns m8 where x is NaN */
                m8 = _mm256_max_ps(_mm256_and_ps(load8_f32(at + 8 * e * esize, dtype), abs_mask),
                                   m8);
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            amax[c] = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        }
        int64_t c = 0;
        if (!p->sf_ue8m0)
            for (; c + 8 <= nb && e4m3_scales8(gsf, amax + c, code + c, scale + c); c += 8)
                ;
        for (; c < nb; c++) {
            block_scale bs = scale_of_block(p, t, gsf, amax[c]);
            code[c] = bs.code;
            scale[c] = bs.scale;
        }
        for (c = 0; c < nb; c++)
            sf[fi_sf_offset(r, c0 + c, blocks, layout)] = (uint8_t)code[c];
        /* sixteen elements a step; sf_vec_size is 16 or 32, a shift, not a division */
        const char *at = row + c0 * sv * esize;
        uint8_t *out = q + c0 * sv / 2;
        int per_block = sv == 32 ? 5 : 4;
        for (int64_t e = 0; e < nb * sv; e += 16) {
            float sc = scale[e >> per_block];
            __m128i packed = _mm_setzero_si128();
            if (sc != 0.0f) {
                __m256 s = _mm256_set1_ps(sc);
                packed = pack_nibbles(
                    e2m1_codes(_mm256_mul_ps(load8_f32(at + e * esize, dtype), s)),
                    e2m1_codes(_mm256_mul_ps(load8_f32(at + (e + 8) * esize, dtype), s)));
            }
            _mm_storel_epi64((__m128i *)(out + e / 2), packed);
        }
    }
}

/* One copy of the row loop per input dtype, so the loads are not a switch per element. */
FI_AVX2 static void quantize_row_avx2(const fi_fp4_quantize_params *p, const scale_table *t,
                                      float gsf, int64_t r)
{
    switch (p->x.dtype) {
    case FI_DTYPE_F16:
        quantize_row_typed(FI_DTYPE_F16, p, t, gsf, r);
        break;
    case FI_DTYPE_BF16:
        quantize_row_typed(FI_DTYPE_BF16, p, t, gsf, r);
        break;
    default:
        quantize_row_typed(FI_DTYPE_F32, p, t, gsf, r);
        break;
    }
}
#endif

/* One row's quantizer: the AVX2 one where the CPU has it and the row is contiguous. */
typedef void (*row_quantizer)(const fi_fp4_quantize_params *, const scale_table *, float, int64_t);

static row_quantizer pick_row_quantizer(const fi_fp4_quantize_params *p)
{
#ifdef FI_HAVE_X86_SIMD
    if (p->x.stride[1] == 1 && __builtin_cpu_supports("avx2") && fi_cpu_has_f16c())
        return quantize_row_avx2;
#endif
    return quantize_row;
}

typedef struct {
    const fi_fp4_quantize_params *p;
    const scale_table *table;
    float gsf;
    int64_t r0, r1; /* entries of the row map (rows themselves without one) */
} quantize_range;

static void *quantize_rows(void *arg)
{
    const quantize_range *qr = arg;
    const fi_fp4_quantize_params *p = qr->p;
    row_quantizer quantize = pick_row_quantizer(p);
    for (int64_t i = qr->r0; i < qr->r1; i++) {
        int64_t r = p->row_map ? p->row_map[i] : i;
        if (r < 0)
            continue;
        quantize(p, qr->table, p->per_token_scale ? per_token_global_scale(p, r) : qr->gsf, r);
    }
    return NULL;
}

int fi_fp4_quantize_cpu(const fi_fp4_quantize_params *p)
{
    int64_t m = p->x.shape[0], k = p->x.shape[1];
    memset(p->sf, 0, (size_t)fi_sf_bytes(m, k / p->sf_vec_size, p->sf_layout));
    float gsf = p->global_scale ? *p->global_scale : 1.0f;
    if (p->global_scale_inversed)
        gsf = 1.0f / gsf;
    enum { MAX_THREADS = 64, MIN_ROWS = 64 };
    int nt = p->num_threads < 1 ? 1 : (p->num_threads > MAX_THREADS ? MAX_THREADS : p->num_threads);
    if (nt > m / MIN_ROWS)
        nt = m / MIN_ROWS > 0 ? (int)(m / MIN_ROWS) : 1;
    scale_table table;
    for (int v = 0; v < 256; v++)
        table.sf[v] = p->sf_ue8m0 ? fi_e8m0fnu_to_f32((uint8_t)v) : fi_e4m3fn_to_f32((uint8_t)v);
    quantize_range ranges[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++)
        ranges[t] = (quantize_range){p, &table, gsf, m * t / nt, m * (t + 1) / nt};
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
