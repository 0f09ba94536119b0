"""A script written for today's FlashInfer (0.7.2.post1) runs unchanged: every keyword our
APIs gained, with FlashInfer's values, at level 0 and at level 10, whose dumps then replay."""

import os
import subprocess
import sys

import pytest

from flashinfer.api_logging import replay_sequence
from flashinfer_native.replay import classify

SCRIPT = r"""
import torch
import flashinfer
from flashinfer import SfLayout

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
H, HKV, D, PAGE = 8, 2, 128, 16


def randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, device=device).to(dtype)


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=device)


# --- decode: o_data_type, block_tables/seq_lens, split hints, q_len_per_req, sinks
kv_cache = randn(12, 2, PAGE, HKV, D)
indptr, indices, last = i32([0, 5, 12]), i32(list(range(12))), i32([9, 16])
decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
    ws, "NHD", use_tensor_cores=True, backend="auto", jit_args=None
)
decode.plan(
    indptr, indices, last, H, HKV, D, PAGE,
    pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
    q_data_type=torch.float16, kv_data_type=torch.float16, o_data_type=torch.float16,
    sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
    block_tables=i32([[0, 1, 2, 3, 4, 0, 0], [5, 6, 7, 8, 9, 10, 11]]),
    seq_lens=i32([73, 112]), fixed_split_size=None, disable_split_kv=False,
    q_len_per_req=2, is_causal=None,
)
o = decode.run(
    randn(4, H, D), kv_cache, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
    return_lse=False, enable_pdl=None, window_left=None,
    sinks=torch.zeros(H, device=device), skip_softmax_threshold_scale_factor=None,
    kv_cache_sf=None,
)

# --- paged prefill: FlashInfer's scheduling inputs, lse base and layout, sinks
prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", variant_owns_mask=False)
qo_indptr = i32([0, 3, 7])
prefill.plan(
    qo_indptr, indptr, indices, last, H, HKV, D, PAGE, causal=True,
    q_data_type=torch.float16, kv_data_type=torch.float16, o_data_type=torch.float16,
    prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
    max_item_len_ptr=None, seq_lens=i32([73, 112]), seq_lens_q=i32([3, 4]),
    block_tables=None, max_token_per_sequence=4, max_sequence_kv=112,
    fixed_split_size=2, disable_split_kv=False, uniform_q_len=None,
)
o, lse = prefill.run(
    randn(7, H, D), kv_cache, return_lse=True, lse_base="ln", lse_layout="HN",
    enable_pdl=None, window_left=None, sinks=torch.randn(H, device=device),
    kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None,
    uses_spcompress=None,
)
assert lse.shape == (H, 7)

# --- ragged prefill: v_indptr/o_indptr, o_scale
ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
ragged.plan(
    qo_indptr, i32([0, 20, 50]), H, HKV, D, causal=True,
    q_data_type=torch.float16, kv_data_type=torch.float16,
    fixed_split_size=None, disable_split_kv=True, seq_lens=i32([20, 30]),
    seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None,
    v_indptr=i32([0, 20, 50]), o_indptr=qo_indptr, uniform_q_len=None,
)
ragged.run(randn(7, H, D), randn(50, HKV, D), randn(50, HKV, D), q_scale=1.0, k_scale=1.0,
           v_scale=1.0, o_scale=1.0, lse_base="log2", lse_layout="NH", kv_cache_sf=None)

# --- single prefill: k_scale / v_scale, NVFP4 KV with kv_cache_sf
q = randn(5, H, D)
flashinfer.single_prefill_with_kv_cache(
    q, randn(40, HKV, D), randn(40, HKV, D), causal=True, kv_cache_sf=None,
    k_scale=1.0, v_scale=1.0,
)
kv_fp4 = torch.randint(0, 256, (2, 40, HKV, D // 2), dtype=torch.uint8, device=device)
kv_sf = torch.rand(2, 40, HKV, D // 16, device=device).to(torch.float8_e4m3fn)
flashinfer.single_prefill_with_kv_cache(
    q, kv_fp4[0], kv_fp4[1], kv_cache_sf=(kv_sf[0], kv_sf[1]), k_scale=0.5, v_scale=2.0
)

# --- quantization and GEMMs: per-token NVFP4, backend checks and skip_check
x = randn(64, 256, dtype=torch.bfloat16)
x_fp4, x_sf, x_scale = flashinfer.nvfp4_quantize(
    x, 1.0 / (448 * 6), sfLayout=SfLayout.layout_128x4, do_shuffle=False, backend="cuda",
    per_token_activation=True, expanded_idx_to_permuted_idx=i32(list(range(64))),
    nvfp4_4over6=None,
)
flashinfer.nvfp4_quantize(x, 1.0 / (448 * 6), backend="cute-dsl", per_token_activation=True,
                          out_scale=torch.tensor([2.0], device=device))
gsf = torch.tensor(448 * 6 / x.float().abs().max().item(), device=device)
a_fp4, a_sf = flashinfer.nvfp4_quantize(x, gsf, sfLayout=SfLayout.layout_128x4)
w_fp4, w_sf = flashinfer.fp4_quantize(randn(32, 256, dtype=torch.bfloat16), gsf,
                                      nvfp4_4over6=None)
assert flashinfer.mm_fp4.is_backend_supported("cudnn")
flashinfer.mm_fp4(a_fp4, w_fp4.T, a_sf, w_sf.T, 1.0 / (gsf * gsf), torch.bfloat16,
                  block_size=16, use_8x4_sf_layout=False, backend="auto", use_nvfp4=True,
                  skip_check=False)
A = randn(1, 16, 64).to(torch.float8_e4m3fn)
B = randn(1, 32, 64).to(torch.float8_e4m3fn).transpose(-2, -1)
one = torch.tensor(1.0, device=device)
flashinfer.bmm_fp8(A, B, one, one, torch.bfloat16, backend="cudnn", skip_check=False)
w8 = randn(32, 128).to(torch.float8_e4m3fn)
flashinfer.mm_fp8(A[0, :, :].repeat(1, 2), flashinfer.prepare_low_latency_gemm_weights(w8, {}),
                  one, skip_check=True)
print("script ran")
"""

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, level):
    env = dict(os.environ, FLASHINFER_LOGLEVEL=str(level))
    env.update(
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"), FLASHINFER_DUMP_DIR=str(tmp_path / "d")
    )
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True
    )


def test_flashinfer_script_runs_unchanged(tmp_path):
    run = _run(tmp_path, 0)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "script ran" in run.stdout


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_flashinfer_script_recorded_at_level_10_replays(tmp_path):
    run = _run(tmp_path, 10)
    assert run.returncode == 0, run.stderr[-3000:]
    results = replay_sequence(str(tmp_path / "d"), device="cpu")
    names = {r["metadata"]["function_name"] for r in results}
    assert {"BatchDecodeWithPagedKVCacheWrapper.run", "nvfp4_quantize", "mm_fp4"} <= names
    outcomes = [(r["metadata"]["function_name"], classify(r)) for r in results]
    assert len(outcomes) == 19  # every call of the script
    assert [o for o in outcomes if o[1] != "passed"] == []
