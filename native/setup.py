"""Build script for flashinfer-native: the logging core alone, next to an installed FlashInfer.

Builds flashinfer_native._C from the repository's sources (csrc, kernels and
flashinfer_native here are links to the root's folders; build_extensions.py holds the
extension definition shared with the root setup.py) and installs
flashinfer_native_hook.pth into site-packages: with FLASHINFER_NATIVE_LOGGING=1 in the
environment it imports flashinfer_native.activate at interpreter start-up, so that the
core serves FlashInfer's @flashinfer_api decorations. Without the variable the line
does nothing and nothing of the core is imported.
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from build_extensions import build_ext_cuda, core_extension  # noqa: E402

HOOK_PTH = "flashinfer_native_hook.pth"


class build_py_with_pth(build_py):
    """Also puts the start-up hook at the top of the wheel (site-packages itself)."""

    def run(self):
        super().run()
        self.mkpath(self.build_lib)
        shutil.copyfile(os.path.join(ROOT, HOOK_PTH), os.path.join(self.build_lib, HOOK_PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, HOOK_PTH)]


setup(
    ext_modules=[core_extension(ROOT)],
    cmdclass={"build_ext": build_ext_cuda, "build_py": build_py_with_pth},
)
