"""Decorated APIs for the flight recorder's tests (tests/test_ring*.py): a step that can
produce NaN, a call that raises, calls that crash the process, and the work of a pool
worker."""

import ctypes
import os
import signal
import sys

import torch

from flashinfer.api_logging import flashinfer_api


@flashinfer_api
def step(x, index, nan_at=-1):
    """``x * 2``, NaN everywhere from call ``nan_at`` on (``index`` counts calls)."""
    out = x * 2
    if 0 <= nan_at <= index:
        out.fill_(float("nan"))
    return out


@flashinfer_api
def fail(x):
    """Raises ValueError naming x's shape."""
    raise ValueError(f"refused {tuple(x.shape)}")


@flashinfer_api
def segfault(x):
    """Reads address 0 inside a decorated call: SIGSEGV."""
    return ctypes.string_at(0)


@flashinfer_api
def abort(x):
    """Ends the process with SIGABRT inside a decorated call."""
    os.kill(os.getpid(), signal.SIGABRT)
    return x


@flashinfer_api
def stack_overflow(x):
    """Exhausts the C stack inside a decorated call (the repr of a deeply nested list with
    no recursion limit): SIGSEGV on a stack that has no room left for a handler."""
    nested = []
    for _ in range(1_000_000):
        nested = [nested]
    sys.setrecursionlimit(1 << 30)
    return repr(nested)


@flashinfer_api
def checksum(x):
    """The sum of x: a call whose outputs are tiny whatever its inputs."""
    return x.sum()


def record_in_worker(first, n):
    """In a pool worker: step calls first .. first + n - 1, then a failing call; returns the
    worker's pid (tests/test_ring_stress.py)."""
    for i in range(first, first + n):
        step(torch.full((64,), i + 0.5), i)
    try:
        fail(torch.ones(1))
    except ValueError:
        pass
    return os.getpid()
