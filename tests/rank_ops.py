"""A decorated function that takes part in a collective: the multi-rank replay test's API."""

import torch.distributed as dist

from flashinfer.api_logging import flashinfer_api


@flashinfer_api
def all_reduce_sum(x):
    """The sum of ``x`` over all ranks (``x`` itself is left as it was)."""
    y = x.clone()
    dist.all_reduce(y)
    return y
