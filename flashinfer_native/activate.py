"""``import flashinfer_native.activate``: the native core serves an installed FlashInfer.

Import it before FlashInfer's first import; from then on every ``@flashinfer_api`` of
FlashInfer's package is a native wrapper, and ``FLASHINFER_LOGLEVEL`` and the other
``FLASHINFER_*`` variables act through the core. ``FLASHINFER_NATIVE_LOGGING=1`` does
the same at interpreter start-up, through the ``flashinfer_native_hook.pth`` file that
the ``flashinfer-native`` distribution installs. See ``flashinfer_native.hook``.
"""

from .hook import activate

ACTIVE = activate()
