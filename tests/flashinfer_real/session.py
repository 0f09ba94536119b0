"""A short FlashInfer session on CPU tensors: the same calls with either decorator.

- ``rmsnorm``: FlashInfer's kernel needs CUDA, so the call raises (AssertionError);
- ``shuffle_matrix_a``: pure PyTorch, runs on the CPU;
- ``BatchMLAPagedAttentionWrapper(workspace)``: a decorated ``__init__`` that runs on CPU.

Prints one JSON line: each call's outcome (``ok`` or the exception type).
"""

import json

import torch

import flashinfer
from flashinfer.quantization.fp4_quantization import shuffle_matrix_a

torch.manual_seed(0)
outcomes = {}


def call(name, fn):
    try:
        fn()
        outcomes[name] = "ok"
    except Exception as exc:  # the point: what the loggers do with a failing call
        outcomes[name] = type(exc).__name__


call("rmsnorm", lambda: flashinfer.norm.rmsnorm(torch.randn(4, 64), torch.ones(64), eps=1e-5))
call("shuffle_matrix_a", lambda: shuffle_matrix_a(torch.randn(64, 32), 128))
call(
    "BatchMLAPagedAttentionWrapper",
    lambda: flashinfer.BatchMLAPagedAttentionWrapper(torch.zeros(4096, dtype=torch.uint8)),
)
print(json.dumps(outcomes))
