"""flashinfer.trace: trace templates, the schemas behind every traced API's ``fi_trace``.

``from flashinfer.trace import TraceTemplate, Var, Const, Tensor, Scalar`` describes an
operation; ``@flashinfer_api(trace=template)`` gives the decorated API a
``.fi_trace(save_dir=None, name=None, **kwargs)`` returning its flashinfer-bench
definition. See ``flashinfer.trace.template``.
"""

from .template import (
    _TRACE_DUMP_DIR,
    Const,
    Scalar,
    Tensor,
    TraceTemplate,
    Var,
    default_check,
    default_tolerances,
    standard_check,
)

__all__ = [
    "_TRACE_DUMP_DIR",
    "Const",
    "Scalar",
    "Tensor",
    "TraceTemplate",
    "Var",
    "default_check",
    "default_tolerances",
    "standard_check",
]
