"""The two distributions as pip builds them (docs/install.md#the-two-distributions):
``flashinfer-native`` (native/) ships the core, ``flashinfer-c`` (the root) ships the
mirror and requires the core at the one version of flashinfer_native/version.py.

Both wheels are built once, without CUDA (FLASHINFER_NO_CUDA=1), from a copy of the
checkout's files as a clone has them (no builds, no links, no virtualenvs), the way
``pip install ./native .`` builds them: in the source tree, with this virtualenv's
setuptools."""

import email.parser
import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from flashinfer_native.version import __version__ as VERSION

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the two setup scripts read: the rest of the checkout stays behind
BUILD_INPUTS = [
    "setup.py",
    "pyproject.toml",
    "README.md",
    "native",
    "csrc",
    "kernels",
    "flashinfer",
    "flashinfer_native",
]


def git_files(*paths):
    """The checkout's files under ``paths`` as git sees them (tracked, and new ones not
    ignored), with their modes."""
    staged = subprocess.run(
        ["git", "ls-files", "-s", "--", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    modes = {line.split("\t", 1)[1]: line.split()[0] for line in staged}
    new = subprocess.run(
        ["git", "ls-files", "-o", "--exclude-standard", "--", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return {**modes, **{f: "new" for f in new}}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """{distribution name: (wheel path, zipfile)} and pip's build output."""
    src = tmp_path_factory.mktemp("src")
    for f in git_files(*BUILD_INPUTS):
        path = os.path.join(REPO, f)
        if os.path.islink(path) or os.path.isfile(path):  # a deleted file is no input
            os.makedirs(src / os.path.dirname(f), exist_ok=True)
            shutil.copy2(path, src / f, follow_symlinks=False)  # a link stays a link
    out = tmp_path_factory.mktemp("wheels")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(FLASHINFER_NO_CUDA="1", CCACHE_DISABLE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(out), "./native", "."],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # a bound against a hang, not a speed check (two extensions compile)
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    found = {}
    for path in sorted(glob.glob(str(out / "*.whl"))):
        z = zipfile.ZipFile(path)
        meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        assert len(meta) == 1, path
        found[email.parser.Parser().parsestr(z.read(meta[0]).decode())["Name"]] = (path, z)
    yield found, build.stdout + build.stderr
    for _, z in found.values():
        z.close()


def metadata(z):
    (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(z.read(name).decode())


def entry_points(z):
    (name,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return z.read(name).decode().split()


def test_exactly_one_wheel_ships_the_core(wheels):
    found, _ = wheels
    assert sorted(found) == ["flashinfer-c", "flashinfer-native"]
    holding = [
        d
        for d, (_, z) in found.items()
        if any(n.startswith("flashinfer_native/") for n in z.namelist())
    ]
    assert holding == ["flashinfer-native"]
    native = found["flashinfer-native"][1].namelist()
    assert "flashinfer_native/version.py" in native
    assert [n for n in native if n.startswith("flashinfer_native/_C.")]
    mirror = found["flashinfer-c"][1].namelist()
    assert [n for n in mirror if n.startswith("flashinfer/_kernels.")]
    assert {n.split("/")[0] for n in mirror if not n.startswith("flashinfer_c-")} == {"flashinfer"}


def test_the_mirror_requires_the_core_at_the_one_version(wheels):
    found, _ = wheels
    native, mirror = metadata(found["flashinfer-native"][1]), metadata(found["flashinfer-c"][1])
    assert native["Version"] == mirror["Version"] == VERSION
    requires = mirror.get_all("Requires-Dist")
    assert f"flashinfer-native=={VERSION}" in requires
    assert [r for r in requires if r.startswith("flashinfer-native")] == [
        f"flashinfer-native=={VERSION}"
    ]
    # each command in one distribution: the core's with the core
    assert "flashinfer-native" not in " ".join(entry_points(found["flashinfer-c"][1]))
    assert "flashinfer-native=flashinfer_native.__main__:main" in "".join(
        entry_points(found["flashinfer-native"][1])
    )


def test_the_core_wheel_carries_the_start_up_hook(wheels):
    found, _ = wheels
    z = found["flashinfer-native"][1]
    with open(os.path.join(REPO, "native", "flashinfer_native_hook.pth"), "rb") as f:
        assert z.read("flashinfer_native_hook.pth") == f.read()
    assert "flashinfer_native_hook.pth" not in found["flashinfer-c"][1].namelist()


def test_the_version_is_written_once_and_nothing_is_a_link():
    files = git_files(".")
    assert [f for f, mode in files.items() if mode == "120000"] == []
    written = []
    for f in files:
        if f.endswith((".py", ".toml", ".cfg")) and os.path.isfile(os.path.join(REPO, f)):
            with open(os.path.join(REPO, f), encoding="utf-8") as text:
                if any(
                    line.startswith(("__version__ =", "version ="))
                    for line in text.read().splitlines()
                ):
                    written.append(f)
    assert written == ["flashinfer_native/version.py"]


def test_the_two_wheels_together_import_and_run_without_cuda(wheels, tmp_path):
    """Unpacked side by side (what pip installs), the mirror runs CPU attention on the
    core of the other wheel; neither extension has CUDA kernels."""
    found, log = wheels
    assert "flashinfer_native._C: CUDA kernels not built" in log
    assert "flashinfer._kernels: CUDA kernels not built" in log
    site = tmp_path / "site"
    for _, z in found.values():
        z.extractall(site)
    code = (
        "import torch, flashinfer, flashinfer_native\n"
        "from flashinfer import _kernels; from flashinfer_native import _C\n"
        f"assert flashinfer.__file__.startswith({str(site)!r}), flashinfer.__file__\n"
        f"assert _C.__file__.startswith({str(site)!r}), _C.__file__\n"
        "assert flashinfer.__version__ == flashinfer_native.__version__\n"
        "assert _C.cuda_built is False and _C.cuda_archs == ''\n"
        "assert _kernels.cuda_built is False and _kernels.cuda_archs == ''\n"
        "q = torch.ones(1, 1, 64); i = torch.tensor([0, 1], dtype=torch.int32)\n"
        "out = torch.empty_like(q); _kernels.attention(q, q, q, out, None, i, i)\n"
        "assert torch.equal(out, q)\n"
        "try:\n"
        "    _kernels.attention(q.to('meta'), q, q, out, None, i, i)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "print(flashinfer.__version__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [
        "attention: q is on meta; this build runs attention on cpu tensors only"
        " (built without CUDA kernels: no nvcc at build time)",
        VERSION,
    ]
