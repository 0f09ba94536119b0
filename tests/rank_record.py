"""Run under torchrun (gloo): each rank calls a decorated all_reduce twice at level 10."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
from rank_ops import all_reduce_sum  # noqa: E402  (the api_logging level is read here)

x = torch.arange(4, dtype=torch.float32) + 10 * dist.get_rank()
all_reduce_sum(x)
all_reduce_sum(x * 2)
dist.destroy_process_group()
