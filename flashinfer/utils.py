"""FlashInfer's backend-requirement surface: which backends an API has, on which GPUs they
run, and the checks a call goes through before its kernel.

``backend_requirement`` decorates an API the way FlashInfer does (outermost, above
``@flashinfer_api``): the decorated function gains ``is_backend_supported(backend,
cc=None)``, ``is_compute_capability_supported(cc)``, ``has_backend``,
``has_backend_choices``, ``experimental_backends``, ``suitable_auto_backends`` (with a
heuristic) and accepts a ``skip_check`` keyword. Compute capabilities are integers
``major * 10 + minor``; a call on CPU tensors has capability ``None``, which only CPU
implementations accept.

What our builds can run is answered truthfully: ``cuda_kernel_capabilities()`` lists the
GPUs this build's CUDA kernels have code for (SASS for ``FLASHINFER_CUDA_ARCHS``, empty
without CUDA), ``cublaslt_available()`` whether cuBLASLt loads.
"""

import functools
import inspect
import os

import torch

from . import _kernels

__all__ = [
    "BackendSupportedError",
    "backend_requirement",
    "cublaslt_available",
    "cuda_kernel_capabilities",
    "get_compute_capability",
    "preferring",
    "requirement",
    "supported_compute_capability",
]

# Every compute capability FlashInfer's checkers name (Turing to Blackwell).
KNOWN_COMPUTE_CAPABILITIES = (75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)
# cuBLASLt's fp8 matmul needs fp8 tensor cores: Ada (8.9) and newer
CUBLASLT_FP8_MIN_CAPABILITY = 89


class BackendSupportedError(ValueError):
    """A backend (or compute capability) the API cannot run.

    FlashInfer derives it from Exception; here it is also a ValueError, what this
    package raised for an unknown backend before, so code catching either still works.
    """


def get_compute_capability(device):
    """(major, minor) of a CUDA device, as FlashInfer's helper.

    Parameters
    ----------
    device : torch.device or str
        A CUDA device.

    Returns
    -------
    tuple of int
        ``torch.cuda.get_device_capability(device)``.

    Raises
    ------
    ValueError
        If ``device`` is not a CUDA device.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a cuda device, got {device}")
    return torch.cuda.get_device_capability(device)


def version_at_least(version, base_version):
    """Whether ``version`` is at least ``base_version`` by PEP 440 (``"12.10" >= "12.9"``,
    ``"0.7.2.post1" >= "0.7.2"``), as FlashInfer's helper; needs the ``packaging`` module."""
    from packaging import version as pkg_version

    return pkg_version.parse(version) >= pkg_version.parse(base_version)


def _runs_sass(arch, cc):
    """Whether SASS built for arch ("80", "90a") runs on compute capability cc."""
    if arch.endswith("a"):
        return int(arch[:-1]) == cc
    built = int(arch)
    return built // 10 == cc // 10 and built % 10 <= cc % 10


@functools.lru_cache(maxsize=1)
def cuda_kernel_capabilities():
    """The compute capabilities this build's CUDA kernels run on.

    Returns
    -------
    tuple of int
        The known capabilities for which an arch in ``_kernels.cuda_archs`` has SASS
        (same major version, minor not above; ``90a`` only 90). Empty without CUDA kernels.
    """
    if not _kernels.cuda_built:
        return ()
    archs = [a for a in _kernels.cuda_archs.split(";") if a]
    return tuple(cc for cc in KNOWN_COMPUTE_CAPABILITIES if any(_runs_sass(a, cc) for a in archs))


@functools.lru_cache(maxsize=1)
def _cublas_lib_dir():
    """The directory of the pip wheel's libcublasLt that torch ships with (``nvidia/cublas/lib``
    for CUDA 12, ``nvidia/cu13/lib`` for CUDA 13), or None. Only a hint: the C side first
    uses a cuBLASLt the process has already loaded."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for sub in ("cublas", "cu13"):
            lib = os.path.join(base, sub, "lib")
            if os.path.isdir(lib) and any(f.startswith("libcublasLt.so") for f in os.listdir(lib)):
                return lib
    return None


@functools.lru_cache(maxsize=1)
def cublaslt_available():
    """Whether cuBLASLt can be loaded for bmm_fp8 (always False without CUDA kernels).

    Returns
    -------
    bool
        The loader found libcublasLt (in the process, torch's wheel or the loader path).
    """
    return _kernels.cublaslt_library(_cublas_lib_dir()) is not None


def supported_compute_capability(supported_ccs):
    """Mark a requirement checker with the compute capabilities it supports (FlashInfer's).

    Parameters
    ----------
    supported_ccs : iterable of int
        Capabilities ``major * 10 + minor``; ``None`` in it stands for CPU tensors.

    Returns
    -------
    callable
        A decorator setting ``_supported_ccs`` and ``is_compute_capability_supported(cc)``
        on the checker.
    """
    ccs = set(supported_ccs)
    for cc in ccs:
        if cc is not None and (isinstance(cc, bool) or not isinstance(cc, int)):
            raise TypeError(f"supported_ccs: {cc!r} is not an integer capability")

    def decorator(checker):
        checker._supported_ccs = ccs
        checker.is_compute_capability_supported = lambda cc: cc in ccs
        return checker

    return decorator


def requirement(runs_on):
    """A backend checker taking every problem (our kernel glue checks each call and names
    the argument at fault) on the capabilities ``runs_on(cc)`` accepts (None: CPU tensors).

    Parameters
    ----------
    runs_on : callable
        ``cc -> bool``, evaluated at query time.

    Returns
    -------
    callable
        The checker, with ``is_compute_capability_supported = runs_on``.
    """

    def checker(**kwargs):
        return True

    checker.is_compute_capability_supported = runs_on
    checker.needs_arguments = False
    return checker


def _runs_on_cublaslt(cc):
    return (
        cc in KNOWN_COMPUTE_CAPABILITIES
        and cc >= CUBLASLT_FP8_MIN_CAPABILITY
        and cublaslt_available()
    )


# Our implementations: the CPU kernels (CPU tensors), this build's CUDA kernels, cuBLASLt.
CPU_REQUIREMENT = requirement(lambda cc: cc is None)
CUDA_KERNEL_REQUIREMENT = requirement(lambda cc: cc in cuda_kernel_capabilities())
CUBLASLT_REQUIREMENT = requirement(_runs_on_cublaslt)


def preferring(order):
    """A ``heuristic_func``: the suitable backends, those in ``order`` first, in that order.

    Parameters
    ----------
    order : sequence of str
        Backend names, most preferred first.

    Returns
    -------
    callable
        ``(suitable, **kwargs) -> list``.
    """

    def heuristic(suitable, **kwargs):
        return sorted(suitable, key=lambda b: order.index(b) if b in order else len(order))

    heuristic.needs_arguments = False
    return heuristic


def _capability_of(args, kwargs):
    """major * 10 + minor of the first tensor argument's CUDA device; None otherwise."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.device.type != "cuda":
                return None
            major, minor = torch.cuda.get_device_capability(value.device)
            return major * 10 + minor
    return None


class _CallArguments:
    """A call's arguments by name with defaults applied, as FlashInfer's checkers take them.

    Binding costs more than the rest of a check, so it happens once, and only for checkers
    that read the arguments (``requirement()`` checkers and ``preferring()`` heuristics
    set ``needs_arguments = False``)."""

    def __init__(self, sig, args, kwargs):
        self.sig, self.args, self.kwargs, self.bound = sig, args, kwargs, None

    def apply(self, f, *first):
        """f(*first, **arguments)."""
        if not getattr(f, "needs_arguments", True):
            return f(*first)
        if self.bound is None:
            bound = self.sig.bind(*self.args, **self.kwargs)
            bound.apply_defaults()
            self.bound = dict(bound.arguments)
        return f(*first, **self.bound)


def _backend_lookup(sig):
    """(args, kwargs) -> the call's backend argument (its default when not given), or None
    for an API without one; without binding the whole signature."""
    if "backend" not in sig.parameters:
        return lambda args, kwargs: None
    position = list(sig.parameters).index("backend")
    default = sig.parameters["backend"].default

    def backend_of(args, kwargs):
        if "backend" in kwargs:
            return kwargs["backend"]
        return args[position] if len(args) > position else default

    return backend_of


def backend_requirement(backend_checks, common_check=None, heuristic_func=None):
    """Decorate an API with FlashInfer's backend checks (see the module docstring).

    Parameters
    ----------
    backend_checks : dict
        Backend name -> checker taking the API's arguments (defaults applied) and returning
        whether it takes this problem; checkers carry ``is_compute_capability_supported``
        (``supported_compute_capability``). Empty: the API has one implicit backend,
        described by ``common_check``.
    common_check : callable, optional
        A check every backend needs, with the same arguments.
    heuristic_func : callable, optional
        ``(suitable_backends, *args, **kwargs) -> ordered list`` for ``backend="auto"``;
        the result is kept in ``suitable_auto_backends``.

    Returns
    -------
    callable
        The decorator. A call checks its backend and capability (``BackendSupportedError``)
        and problem (``ValueError``) unless ``skip_check=True``, then calls the API.
    """

    def decorator(func):
        sig = inspect.signature(func)
        backend_of = _backend_lookup(sig)
        name = func.__name__

        def has_backend_choices():
            return bool(backend_checks)

        def has_backend(backend):
            return backend in backend_checks

        def is_backend_supported(backend, cc=None, *, compute_capability=None):
            if not backend_checks:
                raise ValueError(
                    f"Invalid is_backend_supported call: no backend choices for {name}"
                )
            if compute_capability is not None:
                cc = compute_capability
            checker = backend_checks.get(backend)
            if checker is None:
                return False
            if cc is None:
                return True
            supported = getattr(checker, "is_compute_capability_supported", None)
            return bool(supported and supported(cc))

        def is_compute_capability_supported(cc):
            checkers = list(backend_checks.values()) or [common_check]
            return any(
                hasattr(c, "is_compute_capability_supported")
                and c.is_compute_capability_supported(cc)
                for c in checkers
            )

        def problem_supported(backend, call):
            if common_check is not None and not call.apply(common_check):
                return False
            return not backend_checks or call.apply(backend_checks[backend])

        def suitable_auto_backends(cc, call):
            # updated in place: @flashinfer_api's copy of __dict__ shares this list
            found = wrapper.suitable_auto_backends
            found.clear()
            if common_check is not None and not call.apply(common_check):
                return False
            suitable = []
            for backend, checker in backend_checks.items():
                try:
                    if checker.is_compute_capability_supported(cc) and call.apply(checker):
                        suitable.append(backend)
                except ValueError:
                    continue
            found.extend(call.apply(heuristic_func, suitable) if heuristic_func else suitable)
            return bool(found)

        def check(args, kwargs):
            call = _CallArguments(sig, args, kwargs)
            cc = _capability_of(args, kwargs)
            backend = backend_of(args, kwargs)
            if not backend_checks:
                if not is_compute_capability_supported(cc):
                    raise BackendSupportedError(f"{name} does not support compute capability {cc}")
            elif backend == "auto" and heuristic_func is not None:
                if not suitable_auto_backends(cc, call):
                    where = "CPU tensors" if cc is None else f"compute capability {cc}"
                    raise BackendSupportedError(
                        f"No suitable auto backends found for {name} on {where}"
                    )
                return
            elif backend not in backend_checks:
                accepted = ", ".join(list(backend_checks) + (["auto"] if heuristic_func else []))
                raise BackendSupportedError(
                    f"{name} does not support backend '{backend}'; accepted: {accepted}"
                )
            elif not is_backend_supported(backend, cc):
                here = [b for b in backend_checks if is_backend_supported(b, cc)]
                raise BackendSupportedError(
                    f"{name} does not support backend '{backend}' with capability {cc}; "
                    f"backends that run there in this build: {here or 'none'}"
                )
            if not problem_supported(backend, call):
                raise ValueError(f"Problem size is not supported for {name}")

        @functools.wraps(func)
        def wrapper(*args, skip_check=False, **kwargs):
            if not skip_check:
                check(args, kwargs)
            elif heuristic_func is not None and kwargs.get("backend") == "auto":
                suitable_auto_backends(
                    _capability_of(args, kwargs), _CallArguments(sig, args, kwargs)
                )
            return func(*args, **kwargs)

        wrapper.is_backend_supported = is_backend_supported
        wrapper.is_compute_capability_supported = is_compute_capability_supported
        wrapper.has_backend = has_backend
        wrapper.has_backend_choices = has_backend_choices
        wrapper.experimental_backends = frozenset()
        wrapper.dropped_experimental_backends = []
        wrapper.suitable_auto_backends = []
        return wrapper

    return decorator
