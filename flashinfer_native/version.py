"""The version of flashinfer-c, in one place: the distributions ``flashinfer-native``
(native/setup.py) and ``flashinfer-c`` (setup.py, which pins ``flashinfer-native`` to it)
read it at build time through native/build_extensions.py, ``flashinfer_native`` and the
mirror's ``flashinfer.version`` export it (docs/install.md#the-two-distributions)."""

__version__ = "0.1.0"
