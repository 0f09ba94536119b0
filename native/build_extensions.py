"""The build of flashinfer-c's C extensions, their nvcc step and the version, shared by
both distributions.

- ``native/setup.py`` (distribution ``flashinfer-native``: the logging core, alone or
  under an installed FlashInfer) builds ``core_extension()`` and the ``flashinfer_native``
  package.
- ``setup.py`` at the repository root (distribution ``flashinfer-c``: the flashinfer
  mirror) builds ``kernels_extension()`` and the ``flashinfer`` package, and requires
  ``flashinfer-native`` at the same version instead of shipping the core a second time.

Both read the sources where they are in the checkout (:data:`REPO`, the folder above this
one; no links): source paths are written relative to it and handed to setuptools relative
to the working directory of the setup.py being run, or absolute where that is outside it
(native/), so that object files stay under the build folder. Both import this module as
the sibling of their setup.py (setuptools' ``build_meta:__legacy__`` backend, which both
pyproject.toml files name, runs setup.py with its folder on ``sys.path``): the root's as
``native.build_extensions``, native/'s as ``build_extensions``. :data:`VERSION` is read
from flashinfer_native/version.py, the one place the version is written.

Both extensions are C11 on the plain Python C API; torch is not needed to build them.
FLASHINFER_EXTRA_CFLAGS / FLASHINFER_EXTRA_LDFLAGS append flags (lint, sanitizers).
When nvcc is found (PATH, or CUDA_HOME/bin) and FLASHINFER_NO_CUDA is not set, the
kernels/cuda/*.cu each extension uses are compiled with nvcc for the architectures in
FLASHINFER_CUDA_ARCHS (default "80;90"; "90a" selects sm_90a) and linked with the
static CUDA runtime only.
"""

import concurrent.futures
import glob
import os
import re
import shlex
import shutil
import subprocess
import types

from setuptools import Extension
from setuptools.command.build_ext import build_ext

# The checkout: flashinfer_native/, csrc/, kernels/ and flashinfer/ are folders of it.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION_FILE = os.path.join("flashinfer_native", "version.py")


def read_version():
    """``__version__`` of flashinfer_native/version.py, read as text (nothing is imported:
    the package needs its extension, which is not built yet)."""
    with open(os.path.join(REPO, VERSION_FILE), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
    if m is None:
        raise SystemExit(f'{VERSION_FILE}: no line __version__ = "..."')
    return m.group(1)


VERSION = read_version()


def rel(pattern):
    """Files of the checkout matching ``pattern``, as sorted paths relative to it."""
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, pattern)))


def here(path):
    """``path`` (relative to the checkout) as setuptools takes it from the setup.py being
    run: relative to its working directory (``../csrc`` from native/)."""
    return os.path.relpath(os.path.join(REPO, path))


def package_dir(package):
    """The folder of ``package`` (a folder of the checkout), as setuptools' package_dir
    takes it: relative to the working directory."""
    return here(package.replace(".", "/"))


def find_nvcc():
    """The nvcc to use, or None: FLASHINFER_NO_CUDA set, or no nvcc anywhere."""
    if os.environ.get("FLASHINFER_NO_CUDA", "") not in ("", "0"):
        return None
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def cuda_lib_dirs(nvcc):
    """Directories holding libcudart_static.a, from nvcc's own idea of its toolkit."""
    dirs = []
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        ).stderr
        m = re.search(r"^#\$ LIBRARIES=(.*)$", out, re.M)
        if m:
            dirs += [a[2:] for a in shlex.split(m.group(1)) if a.startswith("-L")]
    except (OSError, subprocess.SubprocessError):
        pass
    top = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    dirs += [os.path.join(top, "lib64"), os.path.join(top, "targets", "x86_64-linux", "lib")]
    found = []
    for d in dirs:
        d = os.path.normpath(d)
        if d not in found and os.path.exists(os.path.join(d, "libcudart_static.a")):
            found.append(d)
    return found


def cuda_archs():
    archs = os.environ.get("FLASHINFER_CUDA_ARCHS", "80;90")
    return [a.strip() for a in re.split(r"[;, ]+", archs) if a.strip()]


def gencode_flags(archs):
    flags = []
    for a in archs:
        if not re.fullmatch(r"\d+a?", a):
            raise SystemExit(f"FLASHINFER_CUDA_ARCHS: '{a}' is not an arch such as 80, 90, 90a")
        flags.append(f"-gencode=arch=compute_{a},code=sm_{a}")
    return flags


NVCC = find_nvcc()
ARCHS = cuda_archs() if NVCC else []

extra_cflags = shlex.split(os.environ.get("FLASHINFER_EXTRA_CFLAGS", ""))
extra_ldflags = shlex.split(os.environ.get("FLASHINFER_EXTRA_LDFLAGS", ""))
cuda_cflags = []
cuda_ldflags = []
if NVCC:
    cuda_cflags = ["-DFI_WITH_CUDA=1", '-DFI_CUDA_ARCHS="%s"' % ";".join(ARCHS)]
    libdirs = cuda_lib_dirs(NVCC)
    cuda_ldflags = [f"-L{d}" for d in libdirs] + [
        "-lcudart_static",
        "-ldl",
        "-lrt",
        "-lpthread",
        "-lstdc++",
    ]


def parallel_compile(
    self,
    sources,
    output_dir=None,
    macros=None,
    include_dirs=None,
    debug=0,
    extra_preargs=None,
    extra_postargs=None,
    depends=None,
):
    """CCompiler.compile with the sources compiled side by side, one per core: distutils
    compiles an extension's 50 C files one after another."""
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs
    )
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    with concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(one, [obj for obj in objects if obj in build]))
    return objects


def checkout_object_filenames(self, source_filenames, strip_dir=False, output_dir=""):
    """CCompiler.object_filenames of each source's place in the checkout: native/'s
    ``../csrc/core/x.c`` is ``csrc/core/x.o`` under the build folder, as from the root,
    not ``../csrc/core/x.o`` beside it."""
    names = [os.path.relpath(os.path.abspath(s), REPO) for s in source_filenames]
    return type(self).object_filenames(self, names, strip_dir, output_dir)


class build_ext_cuda(build_ext):
    """Compiles each extension's .cu files with nvcc into build_temp and links the objects;
    C files are compiled in parallel."""

    def build_extension(self, ext):
        self.compiler.compile = types.MethodType(parallel_compile, self.compiler)
        self.compiler.object_filenames = types.MethodType(checkout_object_filenames, self.compiler)
        if ext.cuda_sources:
            objects = self.compile_cuda(ext)
            ext.extra_objects = list(ext.extra_objects or []) + objects
            ext.depends = list(ext.depends) + objects  # relink when an object changed
        print(
            f"{ext.name}: CUDA kernels built for sm " + ";".join(ARCHS)
            if ext.cuda_sources
            else f"{ext.name}: CUDA kernels not built (no nvcc, or FLASHINFER_NO_CUDA set)"
        )
        super().build_extension(ext)

    def compile_cuda(self, ext):
        out_dir = os.path.abspath(os.path.join(self.build_temp, "cuda"))
        os.makedirs(out_dir, exist_ok=True)
        headers = rel("kernels/include/*.h") + rel("kernels/cuda/*.cuh")
        flags = [
            "-O3",
            "-std=c++17",
            "--expt-relaxed-constexpr",
            "-Xcompiler",
            "-fPIC,-Wall,-Wextra",
            "-Ikernels/include",
            "-Ikernels/cuda",
        ] + gencode_flags(ARCHS)
        flags += shlex.split(os.environ.get("FLASHINFER_NVCC_FLAGS", ""))
        objects, commands = [], []
        for src in ext.cuda_sources:
            obj = os.path.join(out_dir, os.path.basename(src)[:-3] + ".o")
            objects.append(obj)
            deps = [os.path.join(REPO, d) for d in [src] + headers] + [os.path.abspath(__file__)]
            if os.path.exists(obj) and all(
                os.path.getmtime(obj) >= os.path.getmtime(d) for d in deps
            ):
                continue
            commands.append([NVCC] + flags + ["-c", src, "-o", obj])
        # nvcc runs one file on one core for minutes; the files are independent, so they
        # compile side by side (a 16-core GPU machine builds in the time of the slowest).
        with concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            for cmd in commands:
                print(" ".join(shlex.quote(c) for c in cmd))
            list(pool.map(lambda cmd: subprocess.check_call(cmd, cwd=REPO), commands))
        return objects


def extension(name, sources, cuda_sources):
    """A C11 extension of the checkout's ``sources``; ``cuda_sources`` are compiled by nvcc
    (in the checkout) when CUDA kernels are built."""
    cuda_sources = cuda_sources if NVCC else []
    ext = Extension(
        name,
        sources=[here(s) for s in sources],
        include_dirs=[
            here(d) for d in ("csrc/core", "csrc/tensorfile", "csrc/ops", "kernels/include")
        ],
        depends=[
            here(d)
            for d in rel("csrc/*/*.h")
            + rel("kernels/include/*.h")
            + rel("kernels/cpu/*.h")
            + (cuda_sources + rel("kernels/cuda/*.cuh") if cuda_sources else [])
        ],
        extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-D_GNU_SOURCE"]
        + (cuda_cflags if cuda_sources else [])
        + extra_cflags,
        extra_link_args=["-lpthread", "-lm", "-ldl"]
        + (cuda_ldflags if cuda_sources else [])
        + extra_ldflags,
    )
    ext.cuda_sources = cuda_sources
    return ext


CORE_KERNELS = ["kernels/cpu/stats.c", "kernels/cpu/chunk_hash.c"]
CORE_CUDA = ["kernels/cuda/common.cu", "kernels/cuda/stats.cu", "kernels/cuda/chunk_hash.cu"]


def core_extension():
    """flashinfer_native._C: the logging core (csrc/core), the tensor files
    (csrc/tensorfile) and the statistics kernels: everything the core needs."""
    return extension(
        "flashinfer_native._C",
        rel("csrc/core/*.c")
        + rel("csrc/tensorfile/*.c")
        + CORE_KERNELS
        + ["kernels/cpu/cpu_isa.c"],
        CORE_CUDA,
    )


def kernels_extension():
    """flashinfer._kernels: the mirror's kernel entry points (csrc/ops) over the compute
    kernels (kernels/cpu, kernels/cuda)."""
    return extension(
        "flashinfer._kernels",
        rel("csrc/ops/*.c")
        + ["csrc/tensorfile/tensor.c", "csrc/tensorfile/strbuf.c", "csrc/core/cuda_info.c"]
        + [c for c in rel("kernels/cpu/*.c") if c not in CORE_KERNELS],
        [c for c in rel("kernels/cuda/*.cu") if c not in CORE_CUDA[1:]],
    )
