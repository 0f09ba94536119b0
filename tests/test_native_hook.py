"""The switch that lets the native core serve an installed FlashInfer (flashinfer_native.hook).

These tests stand up small FlashInfer look-alikes (a ``flashinfer`` package with a
version and an ``api_logging`` in FlashInfer's style) to cover what the real
FlashInfer of the package index cannot show here: versions too old or too new, and a
core whose extension is missing. tests/flashinfer_real runs the real one.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLASHINFER_STYLE_API_LOGGING = """
import functools, os

_API_LOG_LEVEL = int(os.environ.get("FLASHINFER_LOGLEVEL", "0"))
_TRACE_REGISTRY = []


def _attach_fi_trace(wrapped, original, trace_template=None):
    if trace_template is not None:
        wrapped.fi_trace = lambda **kw: {"name": original.__name__}
        _TRACE_REGISTRY.append(original)
    return wrapped


def flashinfer_api(func=None, *, trace=None):
    if _API_LOG_LEVEL:
        print("FLASHINFERS OWN DECORATOR RAN")
    if func is None:
        return lambda f: _attach_fi_trace(f, f, trace)
    return _attach_fi_trace(func, func, trace)


def flashinfer_experimental_api(func):
    logged = flashinfer_api(func)

    @functools.wraps(logged)
    def wrapper(*args, **kwargs):
        return logged(*args, **kwargs)

    wrapper.is_experimental = True
    return wrapper
"""

OPS = """
from .api_logging import flashinfer_api, flashinfer_experimental_api


@flashinfer_api(trace="template")
def add(a, b=1):
    return a + b


@flashinfer_experimental_api
def sub(a, b):
    return a - b
"""


def make_flashinfer(tmp_path, version, api_logging=FLASHINFER_STYLE_API_LOGGING):
    """A FlashInfer look-alike package under tmp_path/site; returns that folder."""
    package = tmp_path / "site" / "flashinfer"
    package.mkdir(parents=True)
    (package / "version.py").write_text(f"__version__ = {version!r}\n")
    imports = "from .version import __version__\n"
    if api_logging is not None:
        (package / "api_logging.py").write_text(api_logging)
        (package / "ops.py").write_text(OPS)
        imports += "from .ops import add, sub\n"
    (package / "__init__.py").write_text(imports)
    return tmp_path / "site"


def run(
    code, site, level=1, activate="import flashinfer_native.activate", pythonpath=None, flags=()
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["FLASHINFER_LOGLEVEL"] = str(level)
    env["FLASHINFER_LOGDEST"] = "stdout"
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([pythonpath] if pythonpath else []))
    return subprocess.run(
        [sys.executable, *flags, "-c", activate + "\n" + textwrap.dedent(code)],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


SERVED = """
import flashinfer, flashinfer.api_logging as al
from flashinfer_native import _C
print("native", type(flashinfer.add) is _C.APIWrapper, al._NATIVE_CORE)
print("result", flashinfer.add(2), flashinfer.sub(5, 3))
print("trace", flashinfer.add.fi_trace()["name"], len(al._TRACE_REGISTRY))
print("experimental", flashinfer.sub.is_experimental, type(flashinfer.sub.__wrapped__).__name__)
"""


def test_a_tested_flashinfer_is_served_without_warning(tmp_path):
    proc = run(SERVED, make_flashinfer(tmp_path, "0.7.2.post1"))
    assert proc.returncode == 0, proc.stderr
    assert "native True True" in proc.stdout
    assert "result 3 2" in proc.stdout
    assert "trace add 1" in proc.stdout
    assert "experimental True APIWrapper" in proc.stdout
    assert "FlashInfer API Call: add" in proc.stdout
    assert "FLASHINFERS OWN DECORATOR RAN" not in proc.stdout
    assert "warning" not in proc.stderr.lower()


@pytest.mark.parametrize("version", ["0.2.0", "99.0.0"])
def test_an_untested_flashinfer_version_warns_once_and_is_served(tmp_path, version):
    proc = run(SERVED, make_flashinfer(tmp_path, version))
    assert proc.returncode == 0, proc.stderr
    assert "native True True" in proc.stdout
    assert proc.stderr.count("FlashInferVersionWarning") == 1
    assert f"FlashInfer {version} is not a version the native core was tested with" in proc.stderr


def test_a_flashinfer_without_api_logging_is_left_alone_with_a_warning(tmp_path):
    proc = run(
        "import flashinfer; print('version', flashinfer.__version__)",
        make_flashinfer(tmp_path, "0.1.6", api_logging=None),
    )
    assert proc.returncode == 0, proc.stderr
    assert "version 0.1.6" in proc.stdout
    assert "has no flashinfer.api_logging" in proc.stderr


def test_an_api_logging_without_flashinfer_api_is_left_alone_with_a_warning(tmp_path):
    site = make_flashinfer(tmp_path, "0.9.0", api_logging="def something_else(): pass\n")
    (site / "flashinfer" / "__init__.py").write_text(
        "from .version import __version__\nfrom . import api_logging\n"
    )
    proc = run("import flashinfer.api_logging as al; print(sorted(vars(al))[-1])", site)
    assert proc.returncode == 0, proc.stderr
    assert "something_else" in proc.stdout
    assert "has no flashinfer_api; the native core stays out" in proc.stderr


def test_with_the_switch_off_flashinfers_decorator_runs(tmp_path):
    code = "import sys, flashinfer; print('core', 'flashinfer_native' in sys.modules)"
    proc = run(code, make_flashinfer(tmp_path, "0.7.2.post1"), activate="")
    assert proc.returncode == 0, proc.stderr
    assert "FLASHINFERS OWN DECORATOR RAN" in proc.stdout
    assert "core False" in proc.stdout


def test_activating_after_flashinfer_was_imported_warns(tmp_path):
    code = "import flashinfer_native.activate as a; print('active', a.ACTIVE)"
    proc = run(code, make_flashinfer(tmp_path, "0.7.2.post1"), activate="import flashinfer")
    assert proc.returncode == 0, proc.stderr
    assert "active False" in proc.stdout
    assert "flashinfer was imported before the native core was activated" in proc.stderr
    assert "FlashInferActivationWarning" in proc.stderr


def test_filtering_version_warnings_keeps_the_activated_too_late_warning(tmp_path):
    code = """
        import warnings
        from flashinfer_native.hook import FlashInferActivationWarning, FlashInferVersionWarning
        warnings.simplefilter("ignore", FlashInferVersionWarning)
        import flashinfer
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default", FlashInferActivationWarning)
            import flashinfer_native.activate
        print([w.category.__name__ for w in caught])
        print(issubclass(FlashInferActivationWarning, FlashInferVersionWarning))
        """
    proc = run(code, make_flashinfer(tmp_path, "0.7.2.post1"), activate="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == ["['FlashInferActivationWarning']", "False"]


HOOK_LINE = open(os.path.join(ROOT, "native", "flashinfer_native_hook.pth")).read()


@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_load_tensors_is_in_flashinfers_api_logging_with_or_without_the_switch(tmp_path, switch):
    import torch

    from flashinfer_native import _C

    tensors = tmp_path / "t.pt"
    _C.save_tensors(str(tensors), {"x": torch.arange(3.0)})
    code = f"""
        from flashinfer.api_logging import load_tensors
        import flashinfer.api_logging as al
        print(load_tensors({str(tensors)!r})["x"].tolist(), getattr(al, "_NATIVE_CORE", False))
        """
    site = make_flashinfer(tmp_path, "0.7.2.post1")
    env_switch = "" if switch is None else f"os.environ['FLASHINFER_NATIVE_LOGGING'] = {switch!r}\n"
    # the start-up hook's own line, as site runs it from the .pth file
    proc = run(code, site, pythonpath=ROOT, activate="import os\n" + env_switch + HOOK_LINE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"[0.0, 1.0, 2.0] {switch == '1'}"


def test_missing_extension_is_one_line_naming_the_install_command(tmp_path):
    core = tmp_path / "core"
    shutil.copytree(
        os.path.join(ROOT, "flashinfer_native"),
        core / "flashinfer_native",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    site = make_flashinfer(tmp_path, "0.7.2.post1")
    code = SERVED.splitlines()[1] + "\nprint('add', flashinfer.add(2))"
    # -S: no site-packages, where the repository's own (built) core is installed
    proc = run(code, site, pythonpath=str(core), flags=["-S"])
    assert proc.returncode == 0, proc.stderr
    assert "add 3" in proc.stdout
    assert "FLASHINFERS OWN DECORATOR RAN" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "flashinfer_native._C is not usable (not installed)" in lines[0]
    assert lines[0].endswith(
        "Install the core with: pip install ./native (from a flashinfer-c checkout)"
    )


def test_the_mirror_is_left_to_its_own_core(tmp_path):
    code = "import flashinfer.api_logging as al; print('own', al.__loader__.__class__.__name__)"
    proc = run(code, tmp_path, pythonpath=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "own SourceFileLoader" in proc.stdout
    assert proc.stderr == ""


def test_run_command_serves_flashinfer_in_the_script(tmp_path):
    site = make_flashinfer(tmp_path, "0.7.2.post1")
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys, flashinfer\n"
        "print('args', sys.argv[1:], flashinfer.add(40, 2), os.environ['FLASHINFER_NATIVE_LOGGING'])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(FLASHINFER_LOGLEVEL="1", PYTHONPATH=str(site))
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer_native", "run", str(script), "--x", "y"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "args ['--x', 'y'] 42 1" in proc.stdout
    assert "FlashInfer API Call: add" in proc.stdout
