/* gemm_tiled.c: float32 cache-blocked GEMM over callbacks that dequantize A rows and
 * B columns into packed panels; an AVX2/FMA micro-kernel where the CPU has one. */
#include "gemm_tiled.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fi_numeric.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define FI_HAVE_AVX2_KERNEL 1
#endif

/* Register tile MR x NR (NR is the micro-kernel's: 16, or 32 with AVX-512), cache tiles
 * MC x NC x KC (the A block stays in L2, one B strip of KC x NR in L1). */
enum { MR = 6, NR = 16, NR_MAX = 32, MC = 120, NC = 256, KC = 256 };

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

#ifdef FI_HAVE_AVX2_KERNEL
__attribute__((target("avx2,fma"))) static void micro_avx2(int64_t kc, const float *a,
                                                            const float *b, float *c,
                                                            int64_t ldc)
{
    __m256 c0[MR], c1[MR];
    for (int r = 0; r < MR; r++) {
        c0[r] = _mm256_setzero_ps();
        c1[r] = _mm256_setzero_ps();
    }
    for (int64_t kk = 0; kk < kc; kk++) {
        __m256 b0 = _mm256_loadu_ps(b + kk * NR);
        __m256 b1 = _mm256_loadu_ps(b + kk * NR + 8);
        const float *ak = a + kk * MR;
        for (int r = 0; r < MR; r++) {
            __m256 ar = _mm256_broadcast_ss(ak + r);
            c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
        }
    }
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), c0[r]));
        _mm256_storeu_ps(cr + 8, _mm256_add_ps(_mm256_loadu_ps(cr + 8), c1[r]));
    }
}

/* 6 x 32: two zmm accumulators per row. */
__attribute__((target("avx512f"))) static void micro_avx512(int64_t kc, const float *a,
                                                             const float *b, float *c,
                                                             int64_t ldc)
{
    __m512 c0[MR], c1[MR];
    for (int r = 0; r < MR; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    for (int64_t kk = 0; kk < kc; kk++) {
        __m512 b0 = _mm512_loadu_ps(b + kk * NR_MAX);
        __m512 b1 = _mm512_loadu_ps(b + kk * NR_MAX + 16);
        const float *ak = a + kk * MR;
        for (int r = 0; r < MR; r++) {
            __m512 ar = _mm512_set1_ps(ak[r]);
            c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
        }
    }
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
#ifdef FI_HAVE_AVX2_KERNEL
    if (__builtin_cpu_supports("avx512f")) {
        *nr = NR_MAX;
        return micro_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return micro_avx2;
#endif
    return micro_generic;
}

typedef struct {
    const fi_tiled_gemm *g;
    micro_fn micro;
    int nr;
    int64_t tiles_m, tiles_n, total;
    atomic_llong next;
    atomic_int failed;
} shared_state;

typedef struct {
    float *ap, *bp, *c, *tmp;
} scratch;

static void *alloc_floats(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); }

static int scratch_init(scratch *s)
{
    s->ap = alloc_floats((size_t)MC * KC);
    s->bp = alloc_floats((size_t)NC * KC);
    s->c = alloc_floats((size_t)MC * NC);
    s->tmp = alloc_floats(KC);
    if (s->ap && s->bp && s->c && s->tmp)
        return 0;
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

static void run_tile(shared_state *st, int64_t t, scratch *s)
{
    const fi_tiled_gemm *g = st->g;
    int64_t per_batch = st->tiles_m * st->tiles_n;
    int64_t bi = t / per_batch, ti = (t % per_batch) / st->tiles_n, tj = t % st->tiles_n;
    int64_t i0 = ti * MC, j0 = tj * NC;
    int64_t rows = g->m - i0 < MC ? g->m - i0 : MC;
    int64_t cols = g->n - j0 < NC ? g->n - j0 : NC;
    int64_t nr = st->nr, mp = (rows + MR - 1) / MR, np = (cols + nr - 1) / nr;
    memset(s->c, 0, (size_t)MC * NC * sizeof(float));
    for (int64_t k0 = 0; k0 < g->k; k0 += KC) {
        int64_t kc = g->k - k0 < KC ? g->k - k0 : KC;
        pack_a(g, bi, i0, rows, mp * MR, k0, kc, s);
        pack_b(g, st->nr, bi, j0, cols, np * nr, k0, kc, s);
        for (int64_t jp = 0; jp < np; jp++)
            for (int64_t ip = 0; ip < mp; ip++)
                st->micro(kc, s->ap + ip * kc * MR, s->bp + jp * kc * nr,
                          s->c + ip * MR * NC + jp * nr, NC);
    }
    store_tile(g, bi, i0, j0, rows, cols, s->c);
}

static void *worker(void *arg)
{
    shared_state *st = arg;
    scratch s;
    if (scratch_init(&s) < 0) {
        atomic_store(&st->failed, 1);
        return NULL;
    }
    for (;;) {
        int64_t t = atomic_fetch_add(&st->next, 1);
        if (t >= st->total)
            break;
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
    shared_state st = {.g = g};
    st.micro = pick_micro(&st.nr);
    st.tiles_m = (g->m + MC - 1) / MC;
    st.tiles_n = (g->n + NC - 1) / NC;
    st.total = g->batch * st.tiles_m * st.tiles_n;
    atomic_init(&st.next, 0);
    atomic_init(&st.failed, 0);
    int64_t want = g->num_threads < 1 ? 1 : g->num_threads;
    if (want > st.total)
        want = st.total;
    if (want > 256)
        want = 256;
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
