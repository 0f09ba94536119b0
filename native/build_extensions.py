"""The C extensions of flashinfer-c and their nvcc step, shared by both distributions.

- ``setup.py`` at the repository root (distribution ``flashinfer-c``: the flashinfer
  mirror and the logging core) builds ``core_extension()`` and ``kernels_extension()``.
- ``native/setup.py`` (distribution ``flashinfer-native``: the logging core alone, to
  serve an installed FlashInfer) builds ``core_extension()`` only, from the same
  sources: ``native/csrc`` and ``native/kernels`` are links to the root's folders.

Source paths are relative to the directory of the setup.py being run (its working
directory under pip), which every function receives as ``root``.

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


def rel(root, pattern):
    """Files matching ``pattern`` under ``root``, as sorted paths relative to it."""
    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))


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


class build_ext_cuda(build_ext):
    """Compiles each extension's .cu files with nvcc into build_temp and links the objects;
    C files are compiled in parallel."""

    def build_extension(self, ext):
        self.compiler.compile = types.MethodType(parallel_compile, self.compiler)
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
        root = ext.source_root
        headers = rel(root, "kernels/include/*.h") + rel(root, "kernels/cuda/*.cuh")
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
            deps = [os.path.join(root, d) for d in [src] + headers] + [os.path.abspath(__file__)]
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
            list(pool.map(lambda cmd: subprocess.check_call(cmd, cwd=root), commands))
        return objects


def extension(root, name, sources, cuda_sources):
    """A C11 extension; cuda_sources are compiled by nvcc when CUDA kernels are built."""
    cuda_sources = cuda_sources if NVCC else []
    ext = Extension(
        name,
        sources=sources,
        include_dirs=["csrc/core", "csrc/tensorfile", "csrc/ops", "kernels/include"],
        depends=rel(root, "csrc/*/*.h")
        + rel(root, "kernels/include/*.h")
        + rel(root, "kernels/cpu/*.h")
        + (cuda_sources + rel(root, "kernels/cuda/*.cuh") if cuda_sources else []),
        extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-D_GNU_SOURCE"]
        + (cuda_cflags if cuda_sources else [])
        + extra_cflags,
        extra_link_args=["-lpthread", "-lm", "-ldl"]
        + (cuda_ldflags if cuda_sources else [])
        + extra_ldflags,
    )
    ext.cuda_sources = cuda_sources
    ext.source_root = root
    return ext


CORE_KERNELS = ["kernels/cpu/stats.c", "kernels/cpu/chunk_hash.c"]
CORE_CUDA = ["kernels/cuda/common.cu", "kernels/cuda/stats.cu", "kernels/cuda/chunk_hash.cu"]


def core_extension(root):
    """flashinfer_native._C: the logging core (csrc/core), the tensor files
    (csrc/tensorfile) and the statistics kernels: everything the core needs."""
    return extension(
        root,
        "flashinfer_native._C",
        rel(root, "csrc/core/*.c")
        + rel(root, "csrc/tensorfile/*.c")
        + CORE_KERNELS
        + ["kernels/cpu/cpu_isa.c"],
        CORE_CUDA,
    )


def kernels_extension(root):
    """flashinfer._kernels: the mirror's kernel entry points (csrc/ops) over the compute
    kernels (kernels/cpu, kernels/cuda)."""
    return extension(
        root,
        "flashinfer._kernels",
        rel(root, "csrc/ops/*.c")
        + ["csrc/tensorfile/tensor.c", "csrc/tensorfile/strbuf.c", "csrc/core/cuda_info.c"]
        + [c for c in rel(root, "kernels/cpu/*.c") if c not in CORE_KERNELS],
        [c for c in rel(root, "kernels/cuda/*.cu") if c not in CORE_CUDA[1:]],
    )
