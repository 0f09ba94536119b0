"""API logging, flight recorder and replay for flashinfer (``FLASHINFER_LOGLEVEL``).

Served by the native core ``flashinfer_native``: every execution of this module (first
import, or a re-import after removing it from ``sys.modules``) reads the
``FLASHINFER_*`` environment variables and starts a fresh logger. It defines
``flashinfer_api``, ``load_tensors``, ``flush_graph_dumps``, ``clear_graph_dumps``,
``replay_from_dump`` and ``replay_sequence``; see ``flashinfer_native.api_logging``.
Decorated APIs get their trace templates (``fi_trace``) from ``flashinfer.trace.attach``.
"""

from flashinfer_native.api_logging import install as _install

from .trace.attach import TRACE_REGISTRY as _TRACE_REGISTRY  # noqa: F401  (FlashInfer's name)
from .trace.attach import attach_trace as _attach_trace
from .version import __version__ as _version

_install(globals(), flashinfer_version=_version, attach_trace=_attach_trace)
