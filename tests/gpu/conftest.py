"""GPU tests: skipped unless torch sees a CUDA device and flashinfer has CUDA kernels."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(config, items):
    from flashinfer import _kernels

    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA device"
    elif not _kernels.cuda_built:
        reason = "flashinfer was built without CUDA kernels"
    if reason is None:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))
