/* cpu_simd.h: whether the CPU kernels compile their x86 SIMD paths (each picked at run time
 * by cpuid, so one build runs anywhere) and the attributes those functions are built with. */
#ifndef FI_CPU_SIMD_H
#define FI_CPU_SIMD_H

/* FI_PORTABLE_ONLY compiles the SIMD paths out, to test the portable ones. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(FI_PORTABLE_ONLY)
#include <immintrin.h>
#define FI_HAVE_X86_SIMD 1
#define FI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FI_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#endif

#endif
