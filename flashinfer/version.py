"""The mirror's version: flashinfer-c's, which is flashinfer-native's (flashinfer_native/version.py)."""

from flashinfer_native.version import __version__

__all__ = ["__version__"]
