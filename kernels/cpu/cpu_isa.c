/* cpu_isa.c: which SIMD paths the CPU kernels were compiled with and which one this
 * process takes (fi_cpu_isa), for `flashinfer-native info` (docs/install.md). */
#include "cpu_simd.h"
#include "flashinfer_kernels.h"

const char *fi_cpu_isa_paths(void)
{
#ifdef FI_HAVE_X86_SIMD
    return "portable avx2 avx512";
#else
    return "portable";
#endif
}

const char *fi_cpu_isa_name(void)
{
    switch (fi_cpu_isa()) {
    case FI_ISA_AVX512:
        return "avx512";
    case FI_ISA_AVX2:
        return "avx2";
    default:
        return "portable";
    }
}
