"""Serving an installed FlashInfer (``flashinfer-python``) with the native core.

``enable()`` puts a finder at the front of ``sys.meta_path``. FlashInfer's submodules
import ``flashinfer.api_logging`` before they decorate anything; when they do, the
finder's loader

1. executes FlashInfer's own ``api_logging.py`` (its file on disk, unchanged) with
   ``FLASHINFER_LOGLEVEL=0`` while it runs, so FlashInfer's logger installs no handler,
   CUDA-graph hook, exit hook or banner, and everything else it defines stays:
   experimental-API gating, the fi_trace registry, the private helpers other FlashInfer
   modules import;
2. lets ``flashinfer_native.api_logging.install`` put the native logging surface over
   it: ``flashinfer_api`` (a C wrapper per decorated API; FlashInfer's ``trace=``
   templates are handed to FlashInfer's own ``_attach_fi_trace``), ``replay_from_dump``,
   ``replay_sequence``, ``flush_graph_dumps``, ``clear_graph_dumps``, ``load_tensors``.

Without the switch, :func:`surface` (the start-up hook's other branch) only adds
``load_tensors`` to FlashInfer's own ``api_logging``, which keeps its own logging.

FlashInfer versions other than ``TESTED_VERSIONS`` get one warning and are served all
the same. A FlashInfer whose ``api_logging`` has no ``flashinfer_api``, or that has no
``api_logging`` at all, is left to itself with a warning. The repository's own
``flashinfer`` mirror is served by the core already and is left alone.
"""

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

__all__ = [
    "INSTALL_HINT",
    "TESTED_VERSIONS",
    "FlashInferActivationWarning",
    "FlashInferVersionWarning",
    "activate",
    "disable",
    "enable",
    "is_enabled",
    "status",
    "surface",
]

TESTED_VERSIONS = ("0.7.2.post1",)
PACKAGE = "flashinfer"
MODULE = "flashinfer.api_logging"
INSTALL_HINT = "pip install ./native (from a flashinfer-c checkout)"


class FlashInferVersionWarning(UserWarning):
    """The installed FlashInfer is not one the native core was tested with."""


class FlashInferActivationWarning(UserWarning):
    """The native core was switched on after FlashInfer was imported: FlashInfer keeps its
    own logging in this process."""


def _warn(message, category=FlashInferVersionWarning):
    warnings.warn(f"flashinfer_native: {message}", category, stacklevel=3)


def _is_our_mirror(package_path):
    """The repository's flashinfer mirror (it has the kernel extension FlashInfer lacks)."""
    spec = importlib.machinery.PathFinder.find_spec(f"{PACKAGE}._kernels", package_path)
    return spec is not None


def _flashinfer_version():
    """FlashInfer's ``__version__`` (its package imports ``.version`` first), or "unknown"."""
    package = sys.modules.get(PACKAGE)
    version = getattr(package, "__version__", None)
    if version is None:
        try:
            version = importlib.import_module(f"{PACKAGE}.version").__version__
        except Exception:  # noqa: BLE001 - a version we cannot read is just unknown
            version = "unknown"
    return str(version)


@contextlib.contextmanager
def _flashinfer_logging_off():
    """FLASHINFER_LOGLEVEL=0 while FlashInfer's own api_logging runs (it reads it once, at
    import), so that only the native core acts on the level the user set."""
    saved = os.environ.get("FLASHINFER_LOGLEVEL")
    os.environ["FLASHINFER_LOGLEVEL"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FLASHINFER_LOGLEVEL", None)
        else:
            os.environ["FLASHINFER_LOGLEVEL"] = saved


class _DelegatingLoader(importlib.abc.Loader):
    """A loader that runs the original one, then does its own step (``after_exec``)."""

    def __init__(self, original):
        self.original = original

    def create_module(self, spec):
        return self.original.create_module(spec)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self.original, name)


class _ApiLoggingLoader(_DelegatingLoader):
    """Executes FlashInfer's api_logging with its logging off, then installs the core's."""

    def exec_module(self, module):
        with _flashinfer_logging_off():
            self.original.exec_module(module)
        namespace = module.__dict__
        version = _flashinfer_version()
        if not callable(namespace.get("flashinfer_api")):
            _warn(
                f"FlashInfer {version}'s flashinfer.api_logging has no flashinfer_api; "
                "the native core stays out and FlashInfer logs by itself"
            )
            return
        if version not in TESTED_VERSIONS:
            _warn(
                f"FlashInfer {version} is not a version the native core was tested with "
                f"({', '.join(TESTED_VERSIONS)}); its API logging is served by the native "
                "core all the same (FLASHINFER_NATIVE_LOGGING=0 switches back to FlashInfer's)"
            )
        try:
            from .api_logging import serve_flashinfer
        except ImportError as exc:  # the extension is there but does not load
            _missing_core(exc)
            return
        serve_flashinfer(namespace, version)


class _PackageLoader(_DelegatingLoader):
    """Runs FlashInfer's package __init__, then says so if nothing was served."""

    def exec_module(self, module):
        self.original.exec_module(module)
        served = sys.modules.get(MODULE)
        if served is None:
            _warn(
                f"FlashInfer {_flashinfer_version()} has no flashinfer.api_logging: "
                "there is no @flashinfer_api to serve, the native core stays out"
            )


def load_tensors(path):
    """``flashinfer_native.dumpdir.load_tensors`` (imported on first use), for
    FlashInfer's own ``api_logging`` without the switch."""
    from .dumpdir import load_tensors as load

    return load(path)


class _SurfaceLoader(_DelegatingLoader):
    """Runs FlashInfer's api_logging as it is (its own logging), then adds
    ``load_tensors`` when FlashInfer has none."""

    def exec_module(self, module):
        self.original.exec_module(module)
        module.__dict__.setdefault("load_tensors", load_tensors)


class _Finder(importlib.abc.MetaPathFinder):
    """Hands out the loaders above for FlashInfer's package and its api_logging: serving
    (``enable``), or only adding ``load_tensors`` (``surface``)."""

    def __init__(self, serve):
        self.serve = serve

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in (PACKAGE, MODULE) or (not self.serve and fullname == PACKAGE):
            return None
        spec = self._spec_from_others(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        search = spec.submodule_search_locations if fullname == PACKAGE else path
        if search is None or _is_our_mirror(search):
            return None
        if not self.serve:
            wrap = _SurfaceLoader
        else:
            wrap = _PackageLoader if fullname == PACKAGE else _ApiLoggingLoader
        spec.loader = wrap(spec.loader)
        return spec

    def _spec_from_others(self, fullname, path, target):
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


_FINDER = _Finder(serve=True)
_SURFACE = _Finder(serve=False)


def is_enabled():
    """Whether the finder is installed in ``sys.meta_path``."""
    return _FINDER in sys.meta_path


def surface():
    """Without the switch: FlashInfer's own ``api_logging`` gains ``load_tensors`` when
    it is imported, and nothing else changes (the start-up hook calls this when
    ``FLASHINFER_NATIVE_LOGGING`` is unset or 0). Imports neither torch nor the
    extension."""
    if not is_enabled() and _SURFACE not in sys.meta_path:
        sys.meta_path.insert(0, _SURFACE)


def enable():
    """Serve FlashInfer's ``@flashinfer_api`` decorations with the native core.

    Must run before FlashInfer's first import; a FlashInfer imported earlier keeps its
    own decorator (one warning says so). Calling it again does nothing.

    Returns
    -------
    bool
        True when FlashInfer will be served (the finder is in place and FlashInfer
        was not imported yet).
    """
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_SURFACE)
    if not is_enabled():
        sys.meta_path.insert(0, _FINDER)
    served = sys.modules.get(MODULE)
    if served is not None and not getattr(served, "_NATIVE_CORE", False):
        if not _is_our_mirror(getattr(sys.modules.get(PACKAGE), "__path__", [])):
            _warn(
                "flashinfer was imported before the native core was activated: its APIs "
                "keep FlashInfer's own logging (activate before importing flashinfer)",
                FlashInferActivationWarning,
            )
        return False
    return True


def _missing_core(reason):
    sys.stderr.write(
        f"flashinfer_native: native logging is switched on but the core's extension "
        f"flashinfer_native._C is not usable ({reason}); FlashInfer keeps its own "
        f"logging. Install the core with: {INSTALL_HINT}\n"
    )


def activate():
    """Switch native logging on for this process: check the core, then ``enable()``.

    This is what ``FLASHINFER_NATIVE_LOGGING=1`` (through the start-up hook),
    ``import flashinfer_native.activate`` and ``python -m flashinfer_native run`` do.
    It imports neither torch nor the extension (a process that never imports
    FlashInfer pays for nothing but this module); it only checks that the extension is
    installed. Without it, one line on stderr names the install command and FlashInfer
    keeps its own logging.

    Returns
    -------
    bool
        True when FlashInfer will be served by the native core.
    """
    try:
        found = importlib.util.find_spec(f"{__package__}._C") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        _missing_core("not installed")
        return False
    return enable()


HOOK_FILE = "flashinfer_native_hook.pth"


def _hook_file():
    """The start-up hook's ``.pth`` file in this environment's site-packages, or None."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    for directory in dirs:
        path = os.path.join(directory, HOOK_FILE)
        if os.path.isfile(path):
            return path
    return None


def status():
    """Whether the native core serves FlashInfer in this process, and why.

    Returns
    -------
    dict
        ``variable``: the value of ``FLASHINFER_NATIVE_LOGGING`` (None when unset);
        ``switched_on``: it asks for the core; ``hook_file``: the start-up hook's
        ``.pth`` file, or None when ``pip install ./native`` did not install one here;
        ``hook_installed``: the finder is in ``sys.meta_path`` of this process;
        ``flashinfer_imported``: ``flashinfer.api_logging`` was imported;
        ``served``: it is served by the native core (None before it is imported).
    """
    value = os.environ.get("FLASHINFER_NATIVE_LOGGING")
    module = sys.modules.get(MODULE)
    return {
        "variable": value,
        "switched_on": value not in (None, "", "0"),
        "hook_file": _hook_file(),
        "hook_installed": is_enabled(),
        "flashinfer_imported": module is not None,
        "served": None if module is None else bool(getattr(module, "_NATIVE_CORE", False)),
    }


def disable():
    """Remove the finder (modules already imported stay as they are)."""
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_FINDER)
