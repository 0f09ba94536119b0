"""Autotuning switch, kept for FlashInfer compatibility.

The CPU kernels have one configuration each, so there is nothing to tune: ``autotune``
only records whether tuning was requested while its block runs.
"""

import contextlib

_state = {"enabled": False}


def is_tuning_enabled():
    """Return whether an ``autotune(True)`` block is active."""
    return _state["enabled"]


@contextlib.contextmanager
def autotune(enabled=True):
    """Context manager that turns kernel autotuning on (or off) inside its block.

    Parameters
    ----------
    enabled : bool, optional
        Whether tuning is requested inside the block. Defaults to True.

    Yields
    ------
    None
    """
    previous = _state["enabled"]
    _state["enabled"] = bool(enabled)
    try:
        yield
    finally:
        _state["enabled"] = previous
