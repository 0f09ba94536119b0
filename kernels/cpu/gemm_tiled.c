/* gemm_tiled.c: float32 cache-blocked GEMM over callbacks that dequantize A rows and
 * B columns into packed panels (AVX-512 / AVX2 micro-kernels), and a direct path for m <= 16. */
#include "gemm_tiled.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_simd.h"
#include "fi_numeric.h"

/* Loops over arrays of vector registers are unrolled before gcc scalarizes the arrays;
 * otherwise every accumulator goes through the stack on every k step (half the speed). */
#define UNROLLED _Pragma("GCC unroll 16")

/* Register tile MR x NR (NR is the micro-kernel's: 16, or 32 with AVX-512), cache tiles
 * MC x NC x KC (the A block stays in L2, one B strip of KC x NR in L1). */
enum { MR = 6, NR = 16, NR_MAX = 32, MC = 120, NC = 512, KC = 256 };

typedef void (*micro_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc);

/* c[MR][NR] += a-panel @ b-panel, written so gcc vectorizes the j loop. */
static void micro_generic(int64_t kc, const float *a, const float *b, float *c, int64_t ldc)
{
    float acc[MR][NR];
    memset(acc, 0, sizeof(acc));
    for (int64_t kk = 0; kk < kc; kk++) {
        const float *ak = a + kk * MR, *bk = b + kk * NR;
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++)
                acc[r][j] += ak[r] * bk[j];
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++)
            c[r * ldc + j] += acc[r][j];
}

#ifdef FI_HAVE_X86_SIMD
__attribute__((target("avx2,fma"))) static void micro_avx2(int64_t kc, const float *a,
                                                           const float *b, float *c, int64_t ldc)
{
    __m256 c0[MR], c1[MR];
    UNROLLED
    for (int r = 0; r < MR; r++) {
        c0[r] = _mm256_setzero_ps();
        c1[r] = _mm256_setzero_ps();
    }
    for (int64_t kk = 0; kk < kc; kk++) {
        __m256 b0 = _mm256_loadu_ps(b + kk * NR);
        __m256 b1 = _mm256_loadu_ps(b + kk * NR + 8);
        const float *ak = a + kk * MR;
        UNROLLED
        for (int r = 0; r < MR; r++) {
            __m256 ar = _mm256_broadcast_ss(ak + r);
            c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
        }
    }
    UNROLLED
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), c0[r]));
        _mm256_storeu_ps(cr + 8, _mm256_add_ps(_mm256_loadu_ps(cr + 8), c1[r]));
    }
}

/* 6 x 32: two zmm accumulators per row. */
__attribute__((target("avx512f"))) static void micro_avx512(int64_t kc, const float *a,
                                                            const float *b, float *c, int64_t ldc)
{
    __m512 c0[MR], c1[MR];
    UNROLLED
    for (int r = 0; r < MR; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    for (int64_t kk = 0; kk < kc; kk++) {
        __m512 b0 = _mm512_loadu_ps(b + kk * NR_MAX);
        __m512 b1 = _mm512_loadu_ps(b + kk * NR_MAX + 16);
        const float *ak = a + kk * MR;
        UNROLLED
        for (int r = 0; r < MR; r++) {
            __m512 ar = _mm512_set1_ps(ak[r]);
            c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
        }
    }
    UNROLLED
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        _mm512_storeu_ps(cr, _mm512_add_ps(_mm512_loadu_ps(cr), c0[r]));
        _mm512_storeu_ps(cr + 16, _mm512_add_ps(_mm512_loadu_ps(cr + 16), c1[r]));
    }
}
#endif

/* The widest micro-kernel this CPU runs, with its panel width. */
static micro_fn pick_micro(int *nr)
{
    *nr = NR;
#ifdef FI_HAVE_X86_SIMD
    if (__builtin_cpu_supports("avx512f")) {
        *nr = NR_MAX;
        return micro_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return micro_avx2;
#endif
    return micro_generic;
}

/* Work is split into units. Large m: a unit is (batch, chunk of up to mb rows, NC-column
 * strip); each B k-block is dequantized and packed once per unit and reused by every MC
 * tile of the chunk. Small m (<= SMALL_M): a unit is (batch, run of cols_per_unit
 * columns), B is walked once and dotted against the dequantized rows of A. */
enum { MB_MAX = 8 * MC, SMALL_M = FI_TILED_SMALL_M, LANES = 16, SMALL_KC = 512, SMALL_NJ = 8 };

typedef struct {
    const fi_tiled_gemm *g;
    micro_fn micro;
    int nr;
    int small; /* the small-m path */
    int64_t mb, tiles_m, tiles_n, total;
    int64_t cols_per_unit; /* small-m path */
    int64_t kp;            /* small-m path: k rounded up to LANES */
    atomic_llong next;
    atomic_int failed;
} shared_state;

typedef struct {
    float *ap, *bp, *c, *tmp;
    int64_t a_batch; /* small-m path: the batch whose rows of A sit in ap, or -1 */
} scratch;

static void *alloc_floats(size_t n)
{
    return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
}

static int scratch_init(const shared_state *st, scratch *s)
{
    const fi_tiled_gemm *g = st->g;
    s->a_batch = -1;
    if (st->small) {
        s->ap = alloc_floats((size_t)g->m * (size_t)st->kp);
        s->bp = NULL;
        s->c = NULL;
        s->tmp = alloc_floats((size_t)SMALL_NJ * SMALL_KC);
        if (s->ap && s->tmp)
            return 0;
    } else {
        s->ap = alloc_floats((size_t)MC * KC);
        s->bp = alloc_floats((size_t)NC * KC);
        s->c = alloc_floats((size_t)(st->mb + MR) * NC);
        s->tmp = alloc_floats(KC);
        if (s->ap && s->bp && s->c && s->tmp)
            return 0;
    }
    free(s->ap);
    free(s->bp);
    free(s->c);
    free(s->tmp);
    return -1;
}

static void scratch_free(scratch *s)
{
    free(s->ap);
    free(s->bp);
    free(s->c);
    free(s->tmp);
}

/* Packs rows [i0, i0+rows) of A's k-block into MR-row panels, zero rows past the edge. */
static void pack_a(const fi_tiled_gemm *g, int64_t bi, int64_t i0, int64_t rows, int64_t padded,
                   int64_t k0, int64_t kc, scratch *s)
{
    for (int64_t r = 0; r < padded; r++) {
        float *panel = s->ap + (r / MR) * kc * MR + r % MR;
        if (r < rows)
            g->row_a(g->ctx, bi, i0 + r, k0, kc, s->tmp);
        else
            memset(s->tmp, 0, (size_t)kc * sizeof(float));
        for (int64_t kk = 0; kk < kc; kk++)
            panel[kk * MR] = s->tmp[kk];
    }
}

static void pack_b(const fi_tiled_gemm *g, int nr, int64_t bi, int64_t j0, int64_t cols,
                   int64_t padded, int64_t k0, int64_t kc, scratch *s)
{
    for (int64_t c = 0; c < padded; c++) {
        float *panel = s->bp + (c / nr) * kc * nr + c % nr;
        if (c < cols)
            g->col_b(g->ctx, bi, j0 + c, k0, kc, s->tmp);
        else
            memset(s->tmp, 0, (size_t)kc * sizeof(float));
        for (int64_t kk = 0; kk < kc; kk++)
            panel[kk * nr] = s->tmp[kk];
    }
}

static void store_value(const fi_tiled_gemm *g, int64_t at, float v)
{
    switch (g->out.dtype) {
    case FI_DTYPE_BF16:
        ((uint16_t *)g->out.data)[at] = fi_f32_to_bf16(v * g->scale);
        break;
    case FI_DTYPE_F16:
        ((uint16_t *)g->out.data)[at] = fi_f32_to_f16(v * g->scale);
        break;
    default:
        ((float *)g->out.data)[at] = v * g->scale;
        break;
    }
}

static void store_tile(const fi_tiled_gemm *g, int64_t bi, int64_t i0, int64_t j0, int64_t rows,
                       int64_t cols, const float *c)
{
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = (bi * g->m + i0 + r) * g->n + j0;
        const float *cr = c + r * NC;
        switch (g->out.dtype) {
        case FI_DTYPE_BF16:
            for (int64_t j = 0; j < cols; j++)
                ((uint16_t *)g->out.data)[base + j] = fi_f32_to_bf16(cr[j] * g->scale);
            break;
        case FI_DTYPE_F16:
            for (int64_t j = 0; j < cols; j++)
                ((uint16_t *)g->out.data)[base + j] = fi_f32_to_f16(cr[j] * g->scale);
            break;
        default:
            for (int64_t j = 0; j < cols; j++)
                ((float *)g->out.data)[base + j] = cr[j] * g->scale;
            break;
        }
    }
}

/* One unit of the large-m path: rows [i0, i0+rows) x an NC strip, all of k. */
static void run_tile(shared_state *st, int64_t t, scratch *s)
{
    const fi_tiled_gemm *g = st->g;
    int64_t per_batch = st->tiles_m * st->tiles_n;
    int64_t bi = t / per_batch, ti = (t % per_batch) / st->tiles_n, tj = t % st->tiles_n;
    int64_t i0 = ti * st->mb, j0 = tj * NC;
    int64_t rows = g->m - i0 < st->mb ? g->m - i0 : st->mb;
    int64_t cols = g->n - j0 < NC ? g->n - j0 : NC;
    int64_t nr = st->nr, np = (cols + nr - 1) / nr;
    memset(s->c, 0, (size_t)(rows + MR) * NC * sizeof(float));
    for (int64_t k0 = 0; k0 < g->k; k0 += KC) {
        int64_t kc = g->k - k0 < KC ? g->k - k0 : KC;
        pack_b(g, st->nr, bi, j0, cols, np * nr, k0, kc, s);
        for (int64_t it = 0; it < rows; it += MC) {
            int64_t r = rows - it < MC ? rows - it : MC, mp = (r + MR - 1) / MR;
            pack_a(g, bi, i0 + it, r, mp * MR, k0, kc, s);
            float *c = s->c + it * NC;
            for (int64_t jp = 0; jp < np; jp++)
                for (int64_t ip = 0; ip < mp; ip++)
                    st->micro(kc, s->ap + ip * kc * MR, s->bp + jp * kc * nr,
                              c + ip * MR * NC + jp * nr, NC);
        }
    }
    store_tile(g, bi, i0, j0, rows, cols, s->c);
}

/* acc[r][e] += sum over kk = e (mod LANES), kk < kp, of a[r][kk] * b[kk], for r < m;
 * kp is a multiple of LANES. Four rows at a time; a group short of four repeats its first
 * row and drops the extra sums. */
typedef void small_dot_kernel(int64_t m, int64_t kp, const float *a, int64_t lda, const float *b,
                              float acc[][LANES]);
typedef small_dot_kernel *small_dot_fn;

static void small_dot_generic(int64_t m, int64_t kp, const float *a, int64_t lda, const float *b,
                              float acc[][LANES])
{
    for (int64_t r = 0; r < m; r++)
        for (int64_t kk = 0; kk < kp; kk += LANES)
            for (int e = 0; e < LANES; e++)
                acc[r][e] += a[r * lda + kk + e] * b[kk + e];
}

#ifdef FI_HAVE_X86_SIMD
__attribute__((target("avx2,fma"))) static void small_dot_avx2(int64_t m, int64_t kp,
                                                               const float *a, int64_t lda,
                                                               const float *b, float acc[][LANES])
{
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
        int64_t rows = m - r0 < 4 ? m - r0 : 4;
        const float *ar[4];
        UNROLLED
        for (int r = 0; r < 4; r++)
            ar[r] = a + (r0 + (r < rows ? r : 0)) * lda;
        __m256 lo[4], hi[4];
        UNROLLED
        for (int r = 0; r < 4; r++) {
            lo[r] = _mm256_setzero_ps();
            hi[r] = _mm256_setzero_ps();
        }
        for (int64_t kk = 0; kk < kp; kk += LANES) {
            __m256 b0 = _mm256_loadu_ps(b + kk), b1 = _mm256_loadu_ps(b + kk + 8);
            UNROLLED
            for (int r = 0; r < 4; r++) {
                lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(ar[r] + kk), b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(ar[r] + kk + 8), b1, hi[r]);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float *d = acc[r0 + r];
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), lo[r]));
            _mm256_storeu_ps(d + 8, _mm256_add_ps(_mm256_loadu_ps(d + 8), hi[r]));
        }
    }
}

__attribute__((target("avx512f"))) static void small_dot_avx512(int64_t m, int64_t kp,
                                                                const float *a, int64_t lda,
                                                                const float *b, float acc[][LANES])
{
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
        int64_t rows = m - r0 < 4 ? m - r0 : 4;
        const float *ar[4];
        UNROLLED
        for (int r = 0; r < 4; r++)
            ar[r] = a + (r0 + (r < rows ? r : 0)) * lda;
        /* two accumulators per row over alternate k-steps hide the FMA latency */
        __m512 c0[4], c1[4];
        UNROLLED
        for (int r = 0; r < 4; r++) {
            c0[r] = _mm512_setzero_ps();
            c1[r] = _mm512_setzero_ps();
        }
        int64_t kk = 0;
        for (; kk + 2 * LANES <= kp; kk += 2 * LANES) {
            __m512 b0 = _mm512_loadu_ps(b + kk), b1 = _mm512_loadu_ps(b + kk + LANES);
            UNROLLED
            for (int r = 0; r < 4; r++) {
                c0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(ar[r] + kk), b0, c0[r]);
                c1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(ar[r] + kk + LANES), b1, c1[r]);
            }
        }
        if (kk < kp) {
            __m512 b0 = _mm512_loadu_ps(b + kk);
            UNROLLED
            for (int r = 0; r < 4; r++)
                c0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(ar[r] + kk), b0, c0[r]);
        }
        for (int64_t r = 0; r < rows; r++) {
            float *d = acc[r0 + r];
            _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), _mm512_add_ps(c0[r], c1[r])));
        }
    }
}
#endif

static small_dot_fn pick_small_dot(void)
{
#ifdef FI_HAVE_X86_SIMD
    if (__builtin_cpu_supports("avx512f"))
        return small_dot_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return small_dot_avx2;
#endif
    return small_dot_generic;
}

/* One unit of the small-m path: columns [j0, j0+cols) of batch bi, each column of B
 * dequantized once, SMALL_KC at a time, and dotted against all m rows of A. */
static void run_small(shared_state *st, int64_t t, scratch *s, small_dot_fn dot)
{
    const fi_tiled_gemm *g = st->g;
    int64_t per_batch = st->tiles_n;
    int64_t bi = t / per_batch, j0 = (t % per_batch) * st->cols_per_unit;
    int64_t cols = g->n - j0 < st->cols_per_unit ? g->n - j0 : st->cols_per_unit;
    int64_t kp = st->kp;
    if (s->a_batch != bi) { /* rows of A as float32, zero-padded to kp */
        for (int64_t r = 0; r < g->m; r++) {
            float *ar = s->ap + r * kp;
            for (int64_t k0 = 0; k0 < g->k; k0 += KC)
                g->row_a(g->ctx, bi, r, k0, g->k - k0 < KC ? g->k - k0 : KC, ar + k0);
            memset(ar + g->k, 0, (size_t)(kp - g->k) * sizeof(float));
        }
        s->a_batch = bi;
    }
    if (g->dot_b) { /* the caller widens B in registers: one pass down each column */
        float out[SMALL_M];
        for (int64_t j = j0; j < j0 + cols; j++) {
            g->dot_b(g->ctx, bi, j, s->ap, kp, g->m, out);
            for (int64_t r = 0; r < g->m; r++)
                store_value(g, (bi * g->m + r) * g->n + j, out[r]);
        }
        return;
    }
    /* SMALL_NJ neighbouring columns share each k-chunk, so B is read in longer runs */
    float acc[SMALL_NJ][SMALL_M][LANES];
    for (int64_t jg = j0; jg < j0 + cols; jg += SMALL_NJ) {
        int64_t nj = j0 + cols - jg < SMALL_NJ ? j0 + cols - jg : SMALL_NJ;
        memset(acc, 0, sizeof(acc));
        for (int64_t k0 = 0; k0 < g->k; k0 += SMALL_KC) {
            int64_t kc = g->k - k0 < SMALL_KC ? g->k - k0 : SMALL_KC;
            int64_t kcp = (kc + LANES - 1) / LANES * LANES;
            for (int64_t c = 0; c < nj; c++) {
                float *bt = s->tmp + c * SMALL_KC;
                g->col_b(g->ctx, bi, jg + c, k0, kc, bt);
                memset(bt + kc, 0, (size_t)(kcp - kc) * sizeof(float));
            }
            for (int64_t c = 0; c < nj; c++)
                dot(g->m, kcp, s->ap + k0, kp, s->tmp + c * SMALL_KC, acc[c]);
        }
        for (int64_t c = 0; c < nj; c++)
            for (int64_t r = 0; r < g->m; r++) {
                float sum = 0.0f;
                for (int e = 0; e < LANES; e++)
                    sum += acc[c][r][e];
                store_value(g, (bi * g->m + r) * g->n + jg + c, sum);
            }
    }
}

static void *worker(void *arg)
{
    shared_state *st = arg;
    scratch s;
    if (scratch_init(st, &s) < 0) {
        atomic_store(&st->failed, 1);
        return NULL;
    }
    small_dot_fn dot = st->small ? pick_small_dot() : NULL;
    for (;;) {
        int64_t t = atomic_fetch_add(&st->next, 1);
        if (t >= st->total)
            break;
        if (st->small)
            run_small(st, t, &s, dot);
        else
            run_tile(st, t, &s);
    }
    scratch_free(&s);
    return NULL;
}

int fi_tiled_gemm_run(const fi_tiled_gemm *g)
{
    if (g->batch <= 0 || g->m <= 0 || g->n <= 0)
        return 0;
    if (g->k == 0) { /* empty sum: zeros, through the same store path */
        float *zero = calloc((size_t)NC, sizeof(float) * MC);
        if (!zero)
            return -1;
        for (int64_t b = 0; b < g->batch; b++)
            for (int64_t i = 0; i < g->m; i += MC)
                for (int64_t j = 0; j < g->n; j += NC)
                    store_tile(g, b, i, j, g->m - i < MC ? g->m - i : MC,
                               g->n - j < NC ? g->n - j : NC, zero);
        free(zero);
        return 0;
    }
    int64_t want = g->num_threads < 1 ? 1 : g->num_threads;
    if (want > 256)
        want = 256;
    shared_state st = {.g = g};
    st.micro = pick_micro(&st.nr);
    st.small = g->m <= SMALL_M;
    if (st.small) {
        /* about four units per thread over the whole call, at least LANES columns each */
        int64_t units = want * 4 / g->batch + 1;
        st.cols_per_unit = (g->n + units - 1) / units;
        if (st.cols_per_unit < LANES)
            st.cols_per_unit = LANES;
        st.kp = (g->k + LANES - 1) / LANES * LANES;
        st.tiles_m = 1;
        st.tiles_n = (g->n + st.cols_per_unit - 1) / st.cols_per_unit;
    } else {
        /* rows split into equal chunks of at most MB_MAX (a multiple of MR), more of them
         * while there are fewer than two units per thread */
        st.tiles_n = (g->n + NC - 1) / NC;
        int64_t chunks = (g->m + MB_MAX - 1) / MB_MAX;
        for (;;) {
            st.mb = ((g->m + chunks - 1) / chunks + MR - 1) / MR * MR;
            if (st.mb <= MC || g->batch * chunks * st.tiles_n >= 2 * want)
                break;
            chunks++;
        }
        st.tiles_m = (g->m + st.mb - 1) / st.mb;
    }
    st.total = g->batch * st.tiles_m * st.tiles_n;
    atomic_init(&st.next, 0);
    atomic_init(&st.failed, 0);
    if (want > st.total)
        want = st.total;
    pthread_t threads[256];
    int started = 0;
    for (int64_t i = 1; i < want; i++) {
        if (pthread_create(&threads[started], NULL, worker, &st) != 0)
            break; /* fewer threads still finish the work */
        started++;
    }
    worker(&st);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    /* a worker that could not allocate did no tiles; others covered them unless all failed */
    if (atomic_load(&st.failed) && atomic_load(&st.next) < st.total)
        return -1;
    return 0;
}
