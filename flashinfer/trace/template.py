"""Trace templates: the schema of one FlashInfer operation, turned into a definition.

A :class:`TraceTemplate` names an operation's axes (``Var`` for sizes that change from
call to call, ``Const`` for sizes fixed by the model), its inputs and outputs (``Tensor``
with one axis name per dimension, ``Scalar``) and optionally a reference implementation,
a correctness check and an input generator. ``template.build_fi_trace_fn(fi_api)``
returns the ``fi_trace(save_dir=None, name=None, **kwargs)`` callable that every traced
API carries: given the API's arguments it reads the axis values from the tensors' shapes
and returns a flashinfer-bench definition dict (the format FlashInfer writes), writing
``<name>.json`` when a directory is given or ``FLASHINFER_TRACE_DUMP_DIR`` is set.

Axis values are found automatically, in this order: a ``Const(value=...)``; the first
required ``Tensor`` input whose ``dim_names`` hold the axis; a ``Scalar`` input named
after the axis; the first optional ``Tensor`` input holding it; a keyword argument
named after the axis.
"""

import contextlib
import inspect
import json
import os
from pathlib import Path

import torch

__all__ = [
    "Const",
    "Scalar",
    "Tensor",
    "TraceTemplate",
    "Var",
    "default_check",
    "default_tolerances",
    "standard_check",
]


def _get_trace_dump_dir():
    """``FLASHINFER_TRACE_DUMP_DIR`` now (None when unset)."""
    return os.environ.get("FLASHINFER_TRACE_DUMP_DIR")


def _is_trace_dump_enabled():
    """True when ``FLASHINFER_TRACE_DUMP`` is set to anything but ``0`` or empty."""
    return os.environ.get("FLASHINFER_TRACE_DUMP", "0") not in ("0", "")


# The values at import time, kept under FlashInfer's names for code that reads them.
_TRACE_DUMP_DIR = _get_trace_dump_dir()
_TRACE_DUMP_ENABLED = _is_trace_dump_enabled()

# Definition names already written by the auto-dump this process (one file per name).
_DUMPED_NAMES = set()


def _dtype_str(dtype):
    """``torch.bfloat16`` -> ``"bfloat16"`` (any value: its str without ``torch.``)."""
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------ correctness checks


def default_tolerances(dtype):
    """``(rtol, atol)`` used by :func:`default_check` for outputs of ``dtype``.

    Parameters
    ----------
    dtype : torch.dtype or str
        The output dtype (``torch.float16`` or ``"float16"``).

    Returns
    -------
    tuple of float
        Relative and absolute tolerance: 1e-7 for float64, 1e-5 for float32, 1e-3 for
        float16, 1e-2 for bfloat16, 0.1 for fp8, 1.0 for fp4 and 0 (exact) otherwise.
    """
    name = _dtype_str(dtype)
    by_name = {
        "float64": 1e-7,
        "double": 1e-7,
        "float32": 1e-5,
        "float": 1e-5,
        "float16": 1e-3,
        "half": 1e-3,
        "bfloat16": 1e-2,
    }
    if name in by_name:
        return by_name[name], by_name[name]
    if name.startswith("float8"):
        return 1e-1, 1e-1
    if name.startswith("float4") or "fp4" in name:
        return 1.0, 1.0
    return 0.0, 0.0


def _output_pairs(reference_outputs, actual_outputs):
    """Matching (reference, actual) pairs, or None when the structures differ."""
    if isinstance(reference_outputs, dict) or isinstance(actual_outputs, dict):
        same = isinstance(reference_outputs, dict) and isinstance(actual_outputs, dict)
        if not same or reference_outputs.keys() != actual_outputs.keys():
            return None
        return [(reference_outputs[k], actual_outputs[k]) for k in reference_outputs]

    def as_list(x):
        return list(x) if isinstance(x, (list, tuple)) else [x]

    refs, actuals = as_list(reference_outputs), as_list(actual_outputs)
    return list(zip(refs, actuals)) if len(refs) == len(actuals) else None


def _cosine_similarity(a, b):
    """Cosine similarity over the positions where both are finite (1.0 if none)."""
    a = a.reshape(-1).float()
    b = b.reshape(-1).float()
    keep = torch.isfinite(a) & torch.isfinite(b)
    if not bool(keep.any()):
        return 1.0
    a, b = a[keep], b[keep]
    na, nb = torch.linalg.vector_norm(a).item(), torch.linalg.vector_norm(b).item()
    if na == 0 or nb == 0:
        return 1.0 if torch.equal(a, b) else 0.0
    return (torch.dot(a, b) / (na * nb)).item()


def _tensor_passes(ref, actual, rtol, atol, max_mismatch_pct, min_cos_sim):
    if ref.shape != actual.shape:
        return False
    if ref.numel() == 0:
        return True
    if not (torch.is_floating_point(ref) or torch.is_floating_point(actual)):
        mismatch = 100.0 * (actual != ref).float().mean().item()
        return mismatch <= max_mismatch_pct
    default_rtol, default_atol = default_tolerances(
        actual.dtype if torch.is_floating_point(actual) else ref.dtype
    )
    close = torch.isclose(
        actual.float(),
        ref.float(),
        rtol=default_rtol if rtol is None else rtol,
        atol=default_atol if atol is None else atol,
    )
    if 100.0 * (1.0 - close.float().mean().item()) > max_mismatch_pct:
        return False
    return min_cos_sim is None or _cosine_similarity(actual, ref) >= min_cos_sim


def default_check(
    reference_outputs,
    actual_outputs,
    *,
    rtol=None,
    atol=None,
    max_mismatch_pct=0.0,
    min_cos_sim=1.0 - 1e-3,
):
    """Whether ``actual_outputs`` pass against ``reference_outputs``.

    Parameters
    ----------
    reference_outputs, actual_outputs
        A single output, a list/tuple of outputs, or dicts with the same keys.
    rtol, atol : float, optional
        Tolerances; by default :func:`default_tolerances` of the output dtype.
    max_mismatch_pct : float
        Percentage of elements allowed outside the tolerances (exact comparison for
        integer tensors).
    min_cos_sim : float or None
        Minimum cosine similarity of floating outputs (None: not checked).

    Returns
    -------
    bool
        True when every output has the reference's shape and passes; non-tensor
        outputs are compared with ``==``.
    """
    pairs = _output_pairs(reference_outputs, actual_outputs)
    if pairs is None:
        return False
    for ref, actual in pairs:
        if isinstance(ref, torch.Tensor) != isinstance(actual, torch.Tensor):
            return False
        if not isinstance(ref, torch.Tensor):
            if ref != actual:
                return False
        elif not _tensor_passes(ref, actual, rtol, atol, max_mismatch_pct, min_cos_sim):
            return False
    return True


def standard_check(
    reference_outputs,
    actual_outputs,
    *,
    rtol=None,
    atol=None,
    max_mismatch_pct=0.0,
    min_cos_sim=1.0 - 1e-3,
):
    """The check a template gets when it names none: :func:`default_check` as is."""
    from flashinfer.trace import default_check

    return default_check(
        reference_outputs,
        actual_outputs,
        rtol=rtol,
        atol=atol,
        max_mismatch_pct=max_mismatch_pct,
        min_cos_sim=min_cos_sim,
    )


# ------------------------------------------------------------ embedded source snippets

_SNIPPET_IMPORTS = "import math\n\nimport torch\nimport torch.nn.functional as F\n\n"


def _source_without_future_imports(obj):
    lines = inspect.getsource(obj).splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith("from __future__ import"))


def _snippet(fn, dependencies_attr, include_helpers):
    """Standalone source for ``fn``: imports, the helper module (init snippets), the
    functions named by ``fn.<dependencies_attr>``, then ``fn`` itself.

    flashinfer-bench runs these strings with ``exec``, so everything ``fn`` calls at
    module level must be inside the string."""
    parts = [_SNIPPET_IMPORTS]
    if include_helpers:
        from .templates import _init_helpers

        parts.append(_source_without_future_imports(_init_helpers) + "\n")
    for dep in getattr(fn, dependencies_attr, ()):
        parts.append(inspect.getsource(dep) + "\n")
    parts.append(inspect.getsource(fn))
    return "".join(parts)


# --------------------------------------------------------------------------- markers


class Var:
    """An axis whose size changes from call to call (batch size, sequence length)."""

    def __init__(self, description=""):
        self.description = description


class Const:
    """An axis fixed by the model (head count, hidden size); its value names the definition.

    Parameters
    ----------
    description : str
        Written to the definition.
    abbrev : str, optional
        Prefix of the value in the definition name (``"h"`` gives ``h32``); None uses
        the axis name, ``""`` leaves the axis out of the name.
    value : int, optional
        A fixed value that needs no argument to carry it.
    """

    def __init__(self, description="", abbrev=None, value=None):
        if value is not None and type(value) is not int:
            raise TypeError(f"Const value must be an int or None, got {type(value).__name__}")
        self.description = description
        self.abbrev = abbrev
        self.value = value


class Tensor:
    """A tensor input or output, one axis name per dimension.

    Parameters
    ----------
    dim_names : list of str
        The axis of each dimension.
    param : str, optional
        The API parameter holding it (default: the key of the entry).
    tuple_idx : int, optional
        Index into a tuple parameter (``paged_kv_cache=(k, v)``).
    dtype : str, optional
        Outputs: the dtype written. Inputs: the dtype written for an absent optional
        tensor (present tensors write their own dtype).
    dtype_from : str, optional
        Outputs: the parameter whose tensor dtype is written (before ``dtype``).
    dtype_from_scalar : str, optional
        Outputs: a dtype-valued parameter used when ``dtype_from`` finds no tensor.
    optional : bool
        Whether the tensor may be absent.
    description : str
        Written to the definition.
    """

    def __init__(
        self,
        dim_names,
        *,
        param=None,
        tuple_idx=None,
        dtype=None,
        dtype_from=None,
        dtype_from_scalar=None,
        optional=False,
        description="",
    ):
        self.dim_names = dim_names
        self.param = param
        self.tuple_idx = tuple_idx
        self.dtype = dtype
        self.dtype_from = dtype_from
        self.dtype_from_scalar = dtype_from_scalar
        self.optional = optional
        self.description = description


class Scalar:
    """A scalar (non-tensor) input or output with a fixed dtype string."""

    def __init__(self, dtype="float32", *, param=None, optional=False, description=""):
        self.dtype = dtype
        self.param = param
        self.optional = optional
        self.description = description


def _tensor_arg(kwargs, param, tuple_idx=None):
    """The tensor passed as ``param`` (or item ``tuple_idx`` of it), else None."""
    value = kwargs.get(param)
    if tuple_idx is not None:
        ok = isinstance(value, (tuple, list)) and len(value) > tuple_idx
        value = value[tuple_idx] if ok else None
    return value if isinstance(value, torch.Tensor) else None


def _int_arg(kwargs, name):
    try:
        return int(kwargs[name]) if kwargs.get(name) is not None else None
    except (TypeError, ValueError):
        return None


class _Source:
    """Where an axis value comes from: a fixed value, a tensor dimension or a scalar."""

    def __init__(self, fixed=None, param=None, tuple_idx=None, dim=None, scalar=None):
        self.fixed, self.param, self.tuple_idx = fixed, param, tuple_idx
        self.dim, self.scalar = dim, scalar

    def read(self, kwargs):
        if self.fixed is not None:
            return self.fixed
        if self.scalar is not None:
            return _int_arg(kwargs, self.scalar)
        t = _tensor_arg(kwargs, self.param, self.tuple_idx)
        return int(t.shape[self.dim]) if t is not None and self.dim < t.ndim else None


# -------------------------------------------------------------------------- template


class TraceTemplate:
    """The schema of one operation, from which ``fi_trace`` builds definitions.

    Parameters
    ----------
    op_type : str
        The operation family (``"gqa_paged"``, ``"gemm_fp4"``, ...).
    axes : dict
        Axis name -> ``Var()`` or ``Const()``, in definition order.
    inputs, outputs : dict
        Definition key -> ``Tensor`` or ``Scalar``.
    name_prefix : str, optional
        Start of the definition name (default ``op_type``).
    reference : callable, optional
        A plain-torch implementation; its source is embedded as ``"reference"``.
    check : callable, optional
        ``check(reference_outputs, actual_outputs, **thresholds) -> bool``; its source
        is embedded as ``"check"`` (default :func:`standard_check`).
    init : callable, optional
        Builds valid API arguments from the ``Var`` axes (keyword-only) plus
        ``device``/``seed``; exposed as the API's ``fi_init`` and embedded as ``"init"``.
    constraints : list of str, optional
        Python expressions over axes and inputs that hold for valid calls.
    tags : list of str, optional
        Tags after the ``fi_api:<qualified name>`` tag.
    description : str
        Written to the definition.
    """

    def __init__(
        self,
        op_type,
        axes,
        inputs,
        outputs,
        *,
        name_prefix=None,
        reference=None,
        check=None,
        init=None,
        constraints=None,
        tags=None,
        description="",
    ):
        self.op_type = op_type
        self.name_prefix = name_prefix
        self.axes = axes
        self.inputs = inputs
        self.outputs = outputs
        self.reference = reference
        self.check = standard_check if check is None else check
        self.init = init
        self.constraints = constraints or []
        self.tags = tags or []
        self.description = description
        self._sources = {}  # id of the rendered function -> its snippet

    # -- axis values

    def _tensor_source(self, axis, allow_optional):
        for key, d in self.inputs.items():
            if isinstance(d, Tensor) and axis in d.dim_names and (allow_optional or not d.optional):
                param = d.param if d.param is not None else key
                return _Source(param=param, tuple_idx=d.tuple_idx, dim=d.dim_names.index(axis))
        return None

    def _axis_source(self, axis):
        marker = self.axes[axis]
        if isinstance(marker, Const) and marker.value is not None:
            return _Source(fixed=marker.value)
        source = self._tensor_source(axis, allow_optional=False)
        if source is None and isinstance(self.inputs.get(axis), Scalar):
            scalar = self.inputs[axis]
            source = _Source(scalar=scalar.param if scalar.param is not None else axis)
        if source is None:
            source = self._tensor_source(axis, allow_optional=True)
        return source if source is not None else _Source(scalar=axis)

    def axis_values(self, kwargs):
        """Axis name -> int for every axis the arguments ``kwargs`` determine."""
        values = {}
        for axis in self.axes:
            with contextlib.suppress(Exception):
                v = self._axis_source(axis).read(kwargs)
                if v is not None:
                    values[axis] = v
        return values

    def definition_name(self, axis_values):
        """``name_prefix`` (or ``op_type``) then ``_<abbrev><value>`` per known Const axis."""
        parts = [self.name_prefix if self.name_prefix is not None else self.op_type]
        for axis, marker in self.axes.items():
            if isinstance(marker, Const) and axis in axis_values:
                prefix = axis if marker.abbrev is None else marker.abbrev
                if prefix != "":
                    parts.append(f"{prefix}{axis_values[axis]}")
        return "_".join(parts)

    # -- definition sections

    def _axes_json(self, values):
        out = {}
        for axis, marker in self.axes.items():
            entry = {"type": "var" if isinstance(marker, Var) else "const"}
            if not isinstance(marker, Var) and axis in values:
                entry["value"] = values[axis]
            if marker.description:
                entry["description"] = marker.description
            out[axis] = entry
        return out

    def _input_dtype(self, key, d, kwargs):
        if isinstance(d, Scalar):
            return d.dtype
        t = _tensor_arg(kwargs, d.param if d.param is not None else key, d.tuple_idx)
        if t is not None:
            return _dtype_str(t.dtype)
        return d.dtype if d.optional and d.dtype is not None else "unknown"

    def _inferred_output_dtype(self, d, kwargs):
        """The dtype of the first input tensor sharing an axis with output ``d``."""
        for key, src in self.inputs.items():
            if isinstance(src, Tensor) and any(n in src.dim_names for n in d.dim_names):
                t = _tensor_arg(kwargs, src.param if src.param is not None else key, src.tuple_idx)
                if t is not None:
                    return _dtype_str(t.dtype)
        return "unknown"

    def _output_dtype(self, d, kwargs):
        if isinstance(d, Scalar):
            return d.dtype
        if d.dtype_from is not None:
            t = _tensor_arg(kwargs, d.dtype_from)
            if t is not None:
                return _dtype_str(t.dtype)
            if d.dtype_from_scalar is not None and kwargs.get(d.dtype_from_scalar) is not None:
                return _dtype_str(kwargs[d.dtype_from_scalar])
            return d.dtype if d.dtype is not None else "unknown"
        if d.dtype is not None:
            return d.dtype
        return self._inferred_output_dtype(d, kwargs)

    @staticmethod
    def _entry(d, dtype, extra=()):
        entry = {"shape": None if isinstance(d, Scalar) else d.dim_names, "dtype": dtype}
        if d.optional:
            entry["optional"] = True
        for key, value in extra:
            entry[key] = value
        if d.description:
            entry["description"] = d.description
        return entry

    def _inputs_json(self, kwargs):
        return {k: self._entry(d, self._input_dtype(k, d, kwargs)) for k, d in self.inputs.items()}

    def _outputs_json(self, kwargs):
        out = {}
        for key, d in self.outputs.items():
            param = getattr(d, "param", None)
            extra = (("param", param),) if param is not None else ()
            out[key] = self._entry(d, self._output_dtype(d, kwargs), extra)
        return out

    def _rendered(self, fn, render):
        """render(fn), computed once per function (None when fn has no source)."""
        if id(fn) not in self._sources:
            try:
                self._sources[id(fn)] = render(fn)
            except (OSError, TypeError):
                self._sources[id(fn)] = None
        return self._sources[id(fn)]

    def _sources_json(self):
        snippets = (
            (
                "reference",
                self.reference,
                lambda f: _snippet(f, "_trace_reference_dependencies", False),
            ),
            ("check", self.check, inspect.getsource),
            ("init", self.init, lambda f: _snippet(f, "_trace_init_dependencies", True)),
        )
        out = {}
        for key, fn, render in snippets:
            text = self._rendered(fn, render) if fn is not None else None
            if text is not None:
                out[key] = text
        return out

    def definition(self, fi_api, kwargs, name=None):
        """The definition dict for API ``fi_api`` called with ``kwargs``."""
        values = self.axis_values(kwargs)
        result = {
            "name": name if name is not None else self.definition_name(values),
            "description": self.description,
            "op_type": self.op_type,
            "tags": [f"fi_api:{fi_api}"] + list(self.tags),
            "axes": self._axes_json(values),
        }
        if self.constraints:
            result["constraints"] = list(self.constraints)
        result["inputs"] = self._inputs_json(kwargs)
        result["outputs"] = self._outputs_json(kwargs)
        result.update(self._sources_json())
        return result

    def build_fi_trace_fn(self, fi_api):
        """The ``fi_trace(save_dir=None, name=None, **kwargs)`` callable for one API.

        Parameters
        ----------
        fi_api : str
            The API's qualified name, written as the ``fi_api:`` tag.

        Returns
        -------
        callable
            Returns the definition dict for the given API arguments. With ``save_dir``
            it always writes ``<save_dir>/<name>.json``; without, it writes to
            ``FLASHINFER_TRACE_DUMP_DIR`` (when set) once per definition name and
            process.
        """
        template = self

        def fi_trace(save_dir=None, name=None, **kwargs):
            definition = template.definition(fi_api, kwargs, name)
            _write_definition(definition, save_dir)
            return definition

        fi_trace.__doc__ = (
            f"flashinfer-bench definition of {fi_api} (op_type {self.op_type!r}) for the "
            "given arguments; see flashinfer.trace.TraceTemplate.build_fi_trace_fn."
        )
        return fi_trace


def _write_definition(definition, save_dir):
    """Writes ``<dir>/<name>.json``: always for an explicit ``save_dir``, once per name
    and process for ``FLASHINFER_TRACE_DUMP_DIR``."""
    auto = save_dir is None
    directory = _get_trace_dump_dir() if auto else save_dir
    name = definition["name"]
    if directory is None or (auto and name in _DUMPED_NAMES):
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(definition, indent=2))
    if auto:
        _DUMPED_NAMES.add(name)
