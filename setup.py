"""Build script for flashinfer-c (distribution ``flashinfer-c``): two C extensions.

- flashinfer_native._C, the logging core (csrc/core) and the tensor files
  (csrc/tensorfile), with the statistics kernels: everything the standalone core needs.
- flashinfer._kernels, the kernel entry points of the flashinfer mirror (csrc/ops) over
  the compute kernels (kernels/cpu, kernels/cuda).

The extension definitions and the nvcc step live in native/build_extensions.py, shared
with native/setup.py (distribution ``flashinfer-native``: the core alone).
"""

import os
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "native"))

from build_extensions import build_ext_cuda, core_extension, kernels_extension  # noqa: E402

setup(
    ext_modules=[core_extension(ROOT), kernels_extension(ROOT)],
    cmdclass={"build_ext": build_ext_cuda},
)
