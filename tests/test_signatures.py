"""Every public signature we implement matches today's FlashInfer: parameter names, order,
kinds and defaults, transcribed from the release (flashinfer-python 0.7.2.post1), as
``inspect.signature`` prints them (level 0 returns the function itself; above it the
native wrapper keeps the signature)."""

import inspect
import json
import os
import subprocess
import sys

import pytest

import flashinfer
from flashinfer import decode, fp4_quantization, gemm, prefill

# FlashInfer 0.7.2.post1, without annotations. BatchDecodeWithPagedKVCacheWrapper.plan takes
# its optional arguments through **kwargs; their names and defaults are those of
# _plan_impl (keyword-only), FlashInfer's own helper with that contract.
RELEASE = {
    "fi_trace": ("func_or_method", "save_dir=None", "**kwargs"),
    "single_decode_with_kv_cache": (
        "q",
        "k",
        "v",
        "kv_layout='NHD'",
        "pos_encoding_mode='NONE'",
        "use_tensor_cores=False",
        "q_scale=None",
        "k_scale=None",
        "v_scale=None",
        "window_left=-1",
        "logits_soft_cap=None",
        "sm_scale=None",
        "rope_scale=None",
        "rope_theta=None",
        "return_lse=False",
    ),
    "BatchDecodeWithPagedKVCacheWrapper.__init__": (
        "self",
        "float_workspace_buffer",
        "kv_layout='NHD'",
        "use_cuda_graph=False",
        "use_tensor_cores=False",
        "paged_kv_indptr_buffer=None",
        "paged_kv_indices_buffer=None",
        "paged_kv_last_page_len_buffer=None",
        "backend='auto'",
        "jit_args=None",
    ),
    "BatchDecodeWithPagedKVCacheWrapper.plan": (
        "self",
        "indptr",
        "indices",
        "last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
        "*deprecated_positional_args",
        "**kwargs",
    ),
    "BatchDecodeWithPagedKVCacheWrapper._plan_impl": (
        "self",
        "indptr",
        "indices",
        "last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
        "*",
        "pos_encoding_mode='NONE'",
        "window_left=-1",
        "window_right=0",
        "logits_soft_cap=None",
        "q_data_type='float16'",
        "kv_data_type=None",
        "o_data_type=None",
        "data_type=None",
        "sm_scale=None",
        "rope_scale=None",
        "rope_theta=None",
        "non_blocking=True",
        "block_tables=None",
        "seq_lens=None",
        "fixed_split_size=None",
        "disable_split_kv=False",
        "q_len_per_req=1",
        "is_causal=None",
    ),
    "BatchDecodeWithPagedKVCacheWrapper.run": (
        "self",
        "q",
        "paged_kv_cache",
        "*args",
        "q_scale=None",
        "k_scale=None",
        "v_scale=None",
        "out=None",
        "lse=None",
        "return_lse=False",
        "enable_pdl=None",
        "window_left=None",
        "sinks=None",
        "q_len_per_req=None",
        "skip_softmax_threshold_scale_factor=None",
        "kv_cache_sf=None",
    ),
    "single_prefill_with_kv_cache": (
        "q",
        "k",
        "v",
        "scale_q=None",
        "scale_k=None",
        "scale_v=None",
        "o_dtype=None",
        "custom_mask=None",
        "packed_custom_mask=None",
        "causal=False",
        "kv_layout='NHD'",
        "pos_encoding_mode='NONE'",
        "use_fp16_qk_reduction=False",
        "sm_scale=None",
        "window_left=-1",
        "logits_soft_cap=None",
        "rope_scale=None",
        "rope_theta=None",
        "backend='auto'",
        "return_lse=False",
        "kv_cache_sf=None",
        "k_scale=None",
        "v_scale=None",
    ),
    "BatchPrefillWithPagedKVCacheWrapper.__init__": (
        "self",
        "float_workspace_buffer",
        "kv_layout='NHD'",
        "use_cuda_graph=False",
        "qo_indptr_buf=None",
        "paged_kv_indptr_buf=None",
        "paged_kv_indices_buf=None",
        "paged_kv_last_page_len_buf=None",
        "custom_mask_buf=None",
        "mask_indptr_buf=None",
        "backend='auto'",
        "jit_args=None",
        "jit_kwargs=None",
        "variant_owns_mask=False",
    ),
    "BatchPrefillWithPagedKVCacheWrapper.plan": (
        "self",
        "qo_indptr",
        "paged_kv_indptr",
        "paged_kv_indices",
        "paged_kv_last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "page_size",
        "head_dim_vo=None",
        "custom_mask=None",
        "packed_custom_mask=None",
        "causal=False",
        "pos_encoding_mode='NONE'",
        "use_fp16_qk_reduction=False",
        "sm_scale=None",
        "window_left=-1",
        "logits_soft_cap=None",
        "rope_scale=None",
        "rope_theta=None",
        "q_data_type='float16'",
        "kv_data_type=None",
        "o_data_type=None",
        "non_blocking=True",
        "prefix_len_ptr=None",
        "token_pos_in_items_ptr=None",
        "token_pos_in_items_len=0",
        "max_item_len_ptr=None",
        "seq_lens=None",
        "seq_lens_q=None",
        "block_tables=None",
        "max_token_per_sequence=None",
        "max_sequence_kv=None",
        "fixed_split_size=None",
        "disable_split_kv=False",
        "uniform_q_len=None",
    ),
    "BatchPrefillWithPagedKVCacheWrapper.run": (
        "self",
        "q",
        "paged_kv_cache",
        "*args",
        "q_scale=None",
        "k_scale=None",
        "v_scale=None",
        "out=None",
        "lse=None",
        "return_lse=False",
        "lse_base='log2'",
        "lse_layout='NH'",
        "enable_pdl=None",
        "window_left=None",
        "sinks=None",
        "kv_cache_sf=None",
        "skip_softmax_threshold_scale_factor=None",
        "use_fp16_softmax=None",
        "uses_spcompress=None",
    ),
    "BatchPrefillWithRaggedKVCacheWrapper.__init__": (
        "self",
        "float_workspace_buffer",
        "kv_layout='NHD'",
        "use_cuda_graph=False",
        "qo_indptr_buf=None",
        "kv_indptr_buf=None",
        "custom_mask_buf=None",
        "mask_indptr_buf=None",
        "backend='auto'",
        "jit_args=None",
        "jit_kwargs=None",
        "variant_owns_mask=False",
    ),
    "BatchPrefillWithRaggedKVCacheWrapper.plan": (
        "self",
        "qo_indptr",
        "kv_indptr",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "head_dim_vo=None",
        "custom_mask=None",
        "packed_custom_mask=None",
        "causal=False",
        "pos_encoding_mode='NONE'",
        "use_fp16_qk_reduction=False",
        "window_left=-1",
        "logits_soft_cap=None",
        "sm_scale=None",
        "rope_scale=None",
        "rope_theta=None",
        "q_data_type='float16'",
        "kv_data_type=None",
        "o_data_type=None",
        "non_blocking=True",
        "prefix_len_ptr=None",
        "token_pos_in_items_ptr=None",
        "token_pos_in_items_len=0",
        "max_item_len_ptr=None",
        "fixed_split_size=None",
        "disable_split_kv=False",
        "seq_lens=None",
        "seq_lens_q=None",
        "max_token_per_sequence=None",
        "max_sequence_kv=None",
        "v_indptr=None",
        "o_indptr=None",
        "uniform_q_len=None",
    ),
    "BatchPrefillWithRaggedKVCacheWrapper.run": (
        "self",
        "q",
        "k",
        "v",
        "*args",
        "q_scale=None",
        "k_scale=None",
        "v_scale=None",
        "o_scale=None",
        "out=None",
        "lse=None",
        "return_lse=False",
        "lse_base='log2'",
        "lse_layout='NH'",
        "enable_pdl=None",
        "kv_cache_sf=None",
    ),
    "bmm_fp8": (
        "A",
        "B",
        "A_scale",
        "B_scale",
        "dtype",
        "out=None",
        "backend='cublas'",
    ),
    "mm_fp8": (
        "a",
        "b",
        "alpha=None",
        "out_dtype=torch.bfloat16",
        "out=None",
        "backend='trtllm_low_latency'",
    ),
    "mm_fp4": (
        "a",
        "b",
        "a_descale",
        "b_descale",
        "alpha=None",
        "out_dtype=torch.bfloat16",
        "out=None",
        "block_size=16",
        "use_8x4_sf_layout=False",
        "backend='auto'",
        "use_nvfp4=True",
        "enable_pdl=True",
    ),
    "fp4_quantize": (
        "input",
        "global_scale=None",
        "sf_vec_size=16",
        "sf_use_ue8m0=False",
        "is_sf_swizzled_layout=True",
        "is_sf_8x4_layout=False",
        "is_global_scale_inversed=False",
        "enable_pdl=None",
        "backend='cuda'",
        "nvfp4_4over6=<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>",
    ),
    "nvfp4_quantize": (
        "a",
        "a_global_sf",
        "sfLayout=<SfLayout.layout_128x4: 0>",
        "do_shuffle=False",
        "sf_vec_size=16",
        "enable_pdl=None",
        "backend='cuda'",
        "per_token_activation=False",
        "expanded_idx_to_permuted_idx=None",
        "out_scale=None",
        "nvfp4_4over6=<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>",
    ),
    "prepare_low_latency_gemm_weights": (
        "w",
        "permutation_indices_cache",
    ),
}


def _partial_with_return_lse(params):
    """The signature functools.partial(f, return_lse=True) shows: that parameter and the
    ones after it become keyword-only."""
    i = params.index("return_lse=False")
    return params[:i] + ("*", "return_lse=True") + params[i + 1 :]


# Names added after the release, transcribed from FlashInfer main (without annotations).
RELEASE.update(
    {
        "CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__": (
            "self",
            "workspace_buffer",
            "indptr_buffer",
            "indices_buffer",
            "last_page_len_buffer",
            "kv_layout='NHD'",
            "use_tensor_cores=False",
        ),
        "fast_decode_plan": (
            "self",
            "indptr",
            "indices",
            "last_page_len",
            "num_qo_heads",
            "num_kv_heads",
            "head_dim",
            "page_size",
            "pos_encoding_mode='NONE'",
            "window_left=-1",
            "logits_soft_cap=None",
            "q_data_type=None",
            "kv_data_type=None",
            "data_type=None",
            "sm_scale=None",
            "rope_scale=None",
            "rope_theta=None",
            "non_blocking=True",
            "fixed_split_size=None",
            "disable_split_kv=False",
            "q_len_per_req=1",
            "global_override_indptr_cpu=None",
        ),
        # functools.partial(single_prefill_with_kv_cache, return_lse=True)
        "single_prefill_with_kv_cache_return_lse": _partial_with_return_lse(
            RELEASE["single_prefill_with_kv_cache"]
        ),
        "silu_and_mul": ("input", "out=None", "enable_pdl=None"),
        "gelu_and_mul": ("input", "out=None", "enable_pdl=None"),
        "gelu_tanh_and_mul": ("input", "out=None", "enable_pdl=None"),
        "mxfp4_quantize": (
            "a",
            "backend='cuda'",
            "enable_pdl=None",
            "sfLayout=<SfLayout.layout_128x4: 0>",
        ),
        "mxfp4_dequantize": ("a_fp4", "a_sf", "sfLayout=<SfLayout.layout_128x4: 0>"),
        "mxfp4_dequantize_host": ("weight", "scale", "group_size=32"),
        "block_scale_interleave": ("unswizzled_sf",),
        "nvfp4_block_scale_interleave": ("unswizzled_sf",),
        "e2m1_and_ufp8sf_scale_to_float": (
            "e2m1_tensor",
            "ufp8_scale_tensor",
            "global_scale_tensor=None",
            "sf_vec_size=16",
            "ufp8_type=1",
            "is_sf_swizzled_layout=True",
            "is_sf_8x4_layout=False",
        ),
        "nvfp4_batched_quantize": ("a", "a_global_sf", "sf_vec_size=16"),
        "scaled_fp4_grouped_quantize": (
            "a",
            "mask",
            "a_global_sf",
            "nvfp4_4over6=<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>",
        ),
        "silu_and_mul_scaled_nvfp4_experts_quantize": (
            "a",
            "mask",
            "a_global_sf",
            "nvfp4_4over6=<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>",
        ),
        "silu_and_mul_nvfp4_quantize": (
            "input",
            "global_scale",
            "sf_vec_size=16",
            "is_sf_swizzled_layout=True",
            "is_sf_8x4_layout=False",
            "enable_pdl=None",
            "nvfp4_4over6=<nvfp4_4over6 unset: read FLASHINFER_NVFP4_4OVER6*>",
        ),
        "nvfp4_kv_quantize": ("input", "global_scale"),
        "nvfp4_kv_dequantize": (
            "fp4_data",
            "block_scales",
            "global_scale",
            "output_dtype=torch.bfloat16",
        ),
    }
)

# Our documented supersets: docs/kernels.md keeps the one-argument prepare_low_latency_gemm_weights(w).
SUPERSETS = {
    "prepare_low_latency_gemm_weights": {
        "permutation_indices_cache": "permutation_indices_cache=None",
    },
}


def _ours(qualname):
    owner = flashinfer
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


@pytest.mark.parametrize("qualname", sorted(RELEASE))
def test_signature_matches_the_release(qualname):
    want = list(RELEASE[qualname])
    for i, param in enumerate(want):
        name = param.lstrip("*").split("=")[0]
        want[i] = SUPERSETS.get(qualname, {}).get(name, param)
    got = [str(p) for p in inspect.signature(_ours(qualname)).parameters.values()]
    kinds = [p.kind for p in inspect.signature(_ours(qualname)).parameters.values()]
    if inspect.Parameter.KEYWORD_ONLY in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds:
        got.insert(kinds.index(inspect.Parameter.KEYWORD_ONLY), "*")
    assert got == want


def test_every_api_we_export_is_in_the_table():
    names = {q.split(".")[0] for q in RELEASE}
    exported = {n for n in flashinfer.__all__ if n not in ("__version__", "autotune", "SfLayout")}
    assert exported == names


def test_modules_export_the_same_objects():
    assert decode.single_decode_with_kv_cache is flashinfer.single_decode_with_kv_cache
    assert prefill.single_prefill_with_kv_cache is flashinfer.single_prefill_with_kv_cache
    assert gemm.mm_fp4 is flashinfer.mm_fp4
    assert fp4_quantization.nvfp4_quantize is flashinfer.nvfp4_quantize


def test_signatures_are_the_same_above_level_0(tmp_path):
    script = (
        "import inspect, json, sys, flashinfer\n"
        "def ours(q):\n"
        "    o = flashinfer\n"
        "    for part in q.split('.'):\n"
        "        o = getattr(o, part)\n"
        "    return o\n"
        "print(json.dumps({q: str(inspect.signature(ours(q))) for q in sys.argv[1:]}))\n"
    )
    env = dict(os.environ, FLASHINFER_LOGLEVEL="3", FLASHINFER_LOGDEST=str(tmp_path / "log"))
    run = subprocess.run(
        [sys.executable, "-c", script, *sorted(RELEASE)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    at_level_3 = json.loads(run.stdout)
    for qualname, text in at_level_3.items():
        assert text == str(inspect.signature(_ours(qualname))), qualname
