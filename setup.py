"""Build script for flashinfer-c (distribution ``flashinfer-c``): this repository's
FlashInfer mirror, the ``flashinfer`` package and its kernel extension
flashinfer._kernels (csrc/ops over kernels/cpu and kernels/cuda).

The logging core, ``flashinfer_native``, is the distribution ``flashinfer-native``
(native/setup.py); flashinfer-c requires it at the same version rather than shipping it a
second time. The extension definitions, the nvcc step and that version live in
native/build_extensions.py, shared with native/setup.py.
"""

from setuptools import setup

from native.build_extensions import VERSION, build_ext_cuda, kernels_extension

setup(
    version=VERSION,
    install_requires=[f"flashinfer-native=={VERSION}", "torch>=2.1", "click"],
    ext_modules=[kernels_extension()],
    cmdclass={"build_ext": build_ext_cuda},
)
