"""
Manual replay: Load tensors directly from .pt files.
"""

import json
from pathlib import Path

import torch

from flashinfer import bmm_fp8  # noqa: F401

device = "cuda" if torch.cuda.is_available() else "cpu"

# The latest bmm_fp8 dump under ./bmm_fp8_dumps (run bmm_fp8_producer.py first).
dump_dir = sorted(
    d for d in Path("./bmm_fp8_dumps").iterdir() if d.is_dir() and "bmm_fp8" in d.name
)[-1]
# Load metadata from JSONL (read last line for most complete state)
with open(dump_dir / "metadata.jsonl") as f:
    lines = [line.strip() for line in f if line.strip()]
metadata = json.loads(lines[-1])  # Last line has completed state
print(f"Function: {metadata['function_name']}")
print(f"Module: {metadata['module']}")
print(f"Status: {metadata['execution_status']}")
print(f"Input tensors: {metadata['tensor_info']['input_tensor_keys']}")
# Load input tensors
inputs = torch.load(dump_dir / "inputs.pt", map_location=device)
# Load expected outputs (if execution completed successfully)
outputs_path = dump_dir / "outputs.pt"
if outputs_path.exists():
    expected = torch.load(outputs_path, map_location=device)
    print(f"Output tensors: {list(expected.keys())}")
# Tensors are ready to use - reconstruct the call as needed
for key, tensor in inputs.items():
    print(f"  {key}: shape={tensor.shape}, dtype={tensor.dtype}")
