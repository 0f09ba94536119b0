"""
Reproducer script: Replay BatchDecodeWithPagedKVCacheWrapper calls.
Usage:
python batch_decode_reproducer.py
"""

from pathlib import Path

import torch

from flashinfer.api_logging import replay_sequence

device = "cuda" if torch.cuda.is_available() else "cpu"

DUMP_DIR = "./batch_decode_dumps"
# replay_sequence handles stateful objects automatically via object_registry
# It will:
# 1. Replay __init__ to create the wrapper instance
# 2. Replay plan() on the same instance
# 3. Replay run() on the same instance and compare outputs
results = replay_sequence(DUMP_DIR, device=device)
# Print summary
passed = 0
failed = 0
for i, res in enumerate(results):
    func_name = res.get("metadata", {}).get("function_name", "unknown")
    dump_dir = Path(res.get("dump_dir", "")).name
    if "error" in res:
        print(f"[{i + 1}] {func_name} ({dump_dir}): ❌ Error: {res['error']}")
        failed += 1
    elif res.get("comparison_match", True):
        print(f"[{i + 1}] {func_name} ({dump_dir}): ✅ Passed")
        passed += 1
    else:
        print(f"[{i + 1}] {func_name} ({dump_dir}): ❌ Mismatch")
        failed += 1
print(f"\nSummary: {passed} passed, {failed} failed")
# For manual inspection, you can also access individual results
# Find the 'run' call result (usually the last non-init, non-plan call)
for res in results:
    func_name = res.get("metadata", {}).get("function_name", "")
    if "run" in func_name and "execution_result" in res:
        output = res["execution_result"]
        if isinstance(output, tuple):
            output_tensor, lse = output
            print("\nReplayed output[0, :3, :3]:")
            print(output_tensor[0, :3, :3])
            print("Replayed LSE[0, :5]:", lse[0, :5])
            break
