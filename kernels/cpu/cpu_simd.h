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

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>

/* Whether the CPU has F16C (cpuid leaf 1, ecx bit 29). __builtin_cpu_supports has no
 * "f16c" in clang before 16, and the fuzz build uses clang. Asked once: cpuid is slow
 * under a hypervisor. */
static inline int fi_cpu_has_f16c(void)
{
    static int known = -1;
    if (known < 0) {
        unsigned a, b, c, d;
        known = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 1 : 0;
    }
    return known;
}
#endif

#endif
