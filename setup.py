"""Build script for flashinfer-c: the C extension flashinfer._C.

The extension is C11 on the plain Python C API; torch is not needed to build it.
FLASHINFER_EXTRA_CFLAGS / FLASHINFER_EXTRA_LDFLAGS append flags (lint, sanitizers).
"""

import glob
import os
import shlex

from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def rel(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


extra_cflags = shlex.split(os.environ.get("FLASHINFER_EXTRA_CFLAGS", ""))
extra_ldflags = shlex.split(os.environ.get("FLASHINFER_EXTRA_LDFLAGS", ""))

ext = Extension(
    "flashinfer._C",
    sources=rel("csrc/*.c") + rel("kernels/cpu/*.c"),
    include_dirs=["csrc", "kernels/include"],
    depends=rel("csrc/*.h") + rel("kernels/include/*.h") + rel("kernels/cpu/*.h"),
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-D_GNU_SOURCE"] + extra_cflags,
    extra_link_args=["-lpthread", "-lm"] + extra_ldflags,
)

setup(ext_modules=[ext])
