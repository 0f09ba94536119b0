"""Build script for flashinfer-native: the logging core, alone next to an installed
FlashInfer or under this repository's mirror (flashinfer-c depends on it).

Builds flashinfer_native._C and the flashinfer_native package from the checkout's
folders (build_extensions.py, this file's sibling, holds the extension definition shared
with the root setup.py and the version both read) and installs
flashinfer_native_hook.pth into site-packages: with FLASHINFER_NATIVE_LOGGING=1 in the
environment it imports flashinfer_native.activate at interpreter start-up, so that the
core serves FlashInfer's @flashinfer_api decorations. Without the variable the line
does nothing and nothing of the core is imported. An editable install (make build's)
leaves the hook out: the mirror's virtualenv is not served through it.
"""

import os
import shutil

from build_extensions import VERSION, build_ext_cuda, core_extension, package_dir
from setuptools import setup
from setuptools.command.build_py import build_py

HOOK_PTH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flashinfer_native_hook.pth")


class build_py_with_pth(build_py):
    """Also puts the start-up hook at the top of the wheel (site-packages itself)."""

    def run(self):
        super().run()
        if not self.editable_mode:
            self.mkpath(self.build_lib)
            shutil.copyfile(HOOK_PTH, os.path.join(self.build_lib, os.path.basename(HOOK_PTH)))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return outputs + [os.path.join(self.build_lib, os.path.basename(HOOK_PTH))]


setup(
    version=VERSION,
    packages=["flashinfer_native"],
    package_dir={"flashinfer_native": package_dir("flashinfer_native")},
    # the package is Python files only; setuptools' manifest scan of package data cannot
    # follow a package folder outside native/
    include_package_data=False,
    ext_modules=[core_extension()],
    cmdclass={"build_ext": build_ext_cuda, "build_py": build_py_with_pth},
)
