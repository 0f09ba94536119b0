"""API logging, flight recorder and replay for flashinfer (``FLASHINFER_LOGLEVEL``).

Served by the native core ``flashinfer_native``: every execution of this module (first
import, or a re-import after removing it from ``sys.modules``) reads the
``FLASHINFER_*`` environment variables and starts a fresh logger. It defines
``flashinfer_api``, ``load_tensors``, ``flush_graph_dumps``, ``clear_graph_dumps``,
``replay_from_dump`` and ``replay_sequence``; see ``flashinfer_native.api_logging``.
"""

from flashinfer_native.api_logging import install as _install

from .version import __version__ as _version

_install(globals(), flashinfer_version=_version)
