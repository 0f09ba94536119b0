/* cpu_simd.h: whether the CPU kernels compile their x86 SIMD paths (each picked at run time
 * by cpuid, so one build runs anywhere) and the attributes those functions are built with. */
#ifndef FI_CPU_SIMD_H
#define FI_CPU_SIMD_H

#include <stdlib.h>
#include <string.h>

/* FI_PORTABLE_ONLY compiles the SIMD paths out, to test the portable ones. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(FI_PORTABLE_ONLY)
#include <immintrin.h>
#define FI_HAVE_X86_SIMD 1
#define FI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FI_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#define FI_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define FI_AVX512 __attribute__((target(FI_AVX512_TARGET)))
#define FI_AVX512_INLINE static inline __attribute__((target(FI_AVX512_TARGET), always_inline))
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

/* SIMD levels of the CPU kernels, each including the ones below. */
typedef enum { FI_ISA_PORTABLE, FI_ISA_AVX2, FI_ISA_AVX512 } fi_isa;

/* The widest level the kernels may use: the CPU's (AVX2 with FMA and F16C; AVX-512 F, BW,
 * VL and DQ), lowered by FLASHINFER_CPU_ISA=portable or avx2 so that tests run every path
 * on one machine (other values change nothing). The variable is read on every call. */
static inline fi_isa fi_cpu_isa(void)
{
#ifdef FI_HAVE_X86_SIMD
    fi_isa isa = FI_ISA_PORTABLE;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && fi_cpu_has_f16c())
        isa = FI_ISA_AVX2;
    if (isa == FI_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        isa = FI_ISA_AVX512;
    const char *cap = getenv("FLASHINFER_CPU_ISA");
    if (cap && strcmp(cap, "portable") == 0)
        return FI_ISA_PORTABLE;
    if (cap && strcmp(cap, "avx2") == 0 && isa > FI_ISA_AVX2)
        return FI_ISA_AVX2;
    return isa;
#else
    return FI_ISA_PORTABLE;
#endif
}

#endif
