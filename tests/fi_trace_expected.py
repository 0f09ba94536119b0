"""The flashinfer-bench definitions FlashInfer writes for our APIs (its
tests/trace/fi_trace_out/*.json for the calls of its tests/trace/example.py),
transcribed as test data. Description texts are our own: ``TEXT`` stands for "a
non-empty description here"; the sources (reference/check/init) are checked by running
them, not by text."""


class _Text:
    """Equal to any non-empty string (where FlashInfer writes a description)."""

    def __eq__(self, other):
        return isinstance(other, str) and other != ""

    def __repr__(self):
        return "TEXT"


TEXT = _Text()

SOURCE_KEYS = ("reference", "check", "init")


def _const(value, described=False):
    entry = {"type": "const", "value": value}
    if described:
        entry["description"] = TEXT
    return entry


def _var(described=True):
    return {"type": "var", "description": TEXT} if described else {"type": "var"}


def _tensor(shape, dtype, optional=False, described=False):
    entry = {"shape": shape, "dtype": dtype}
    if optional:
        entry["optional"] = True
    if described:
        entry["description"] = TEXT
    return entry


def _scalar(dtype, optional=True, described=True):
    return _tensor(None, dtype, optional, described)


HEADS = {"num_qo_heads": _const(32), "num_kv_heads": _const(8), "head_dim": _const(128)}
PAGED_CACHE = ["num_pages", "page_size", "num_kv_heads", "head_dim"]

SINGLE_DECODE = {
    "name": "single_decode_h32_kv8_d128",
    "description": TEXT,
    "op_type": "single_decode",
    "tags": [
        "fi_api:flashinfer.decode.single_decode_with_kv_cache",
        "status:verified",
        "stage:decode",
    ],
    "axes": {**HEADS, "kv_len": _var()},
    "inputs": {
        "q": _tensor(["num_qo_heads", "head_dim"], "bfloat16"),
        "k": _tensor(["kv_len", "num_kv_heads", "head_dim"], "bfloat16", described=True),
        "v": _tensor(["kv_len", "num_kv_heads", "head_dim"], "bfloat16", described=True),
    },
    "outputs": {"output": _tensor(["num_qo_heads", "head_dim"], "bfloat16")},
}

SINGLE_PREFILL = {
    "name": "single_prefill_h32_kv8_d128",
    "description": TEXT,
    "op_type": "single_prefill",
    "tags": [
        "fi_api:flashinfer.prefill.single_prefill_with_kv_cache",
        "status:verified",
        "stage:prefill",
    ],
    "axes": {**HEADS, "qo_len": _var(), "kv_len": _var()},
    "inputs": {
        "q": _tensor(["qo_len", "num_qo_heads", "head_dim"], "bfloat16"),
        "k": _tensor(["kv_len", "num_kv_heads", "head_dim"], "bfloat16"),
        "v": _tensor(["kv_len", "num_kv_heads", "head_dim"], "bfloat16"),
    },
    "outputs": {"output": _tensor(["qo_len", "num_qo_heads", "head_dim"], "bfloat16")},
}

RUN_SCALARS = {"sm_scale": _scalar("float32"), "return_lse": _scalar("int32")}


def paged_decode(page_size):
    return {
        "name": f"gqa_paged_decode_h32_kv8_d128_ps{page_size}",
        "description": TEXT,
        "op_type": "gqa_paged",
        "tags": [
            "fi_api:flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run",
            "stage:decode",
            "status:verified",
        ],
        "axes": {
            "batch_size": _var(),
            **HEADS,
            "num_pages": _var(described=False),
            "page_size": _const(page_size),
            "len_indptr": _var(),
            "num_kv_indices": _var(),
        },
        "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
        "inputs": {
            "q": _tensor(["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
            "k_cache": _tensor(PAGED_CACHE, "bfloat16"),
            "v_cache": _tensor(PAGED_CACHE, "bfloat16"),
            "kv_indptr": _tensor(["len_indptr"], "unknown", optional=True, described=True),
            "kv_indices": _tensor(["num_kv_indices"], "unknown", optional=True, described=True),
            **RUN_SCALARS,
        },
        "outputs": {
            "output": _tensor(["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
            "lse": _tensor(["batch_size", "num_qo_heads"], "float32", True, True),
        },
    }


PAGED_PREFILL = {
    "name": "gqa_paged_prefill_h32_kv8_d128_ps16",
    "description": TEXT,
    "op_type": "gqa_paged",
    "tags": [
        "fi_api:flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run",
        "stage:prefill",
        "status:verified",
    ],
    "axes": {
        **HEADS,
        "page_size": _const(16),
        "len_indptr": _var(),
        "total_q": _var(),
        "num_kv_indices": _var(),
        "num_pages": _var(described=False),
    },
    "constraints": ["total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"],
    "inputs": {
        "q": _tensor(["total_q", "num_qo_heads", "head_dim"], "bfloat16"),
        "k_cache": _tensor(PAGED_CACHE, "bfloat16"),
        "v_cache": _tensor(PAGED_CACHE, "bfloat16"),
        "qo_indptr": _tensor(["len_indptr"], "unknown", optional=True, described=True),
        "kv_indptr": _tensor(["len_indptr"], "unknown", optional=True, described=True),
        "kv_indices": _tensor(["num_kv_indices"], "unknown", optional=True, described=True),
        **RUN_SCALARS,
    },
    "outputs": {
        "output": _tensor(["total_q", "num_qo_heads", "head_dim"], "bfloat16"),
        "lse": _tensor(["total_q", "num_qo_heads"], "float32", True, True),
    },
}

RAGGED_PREFILL = {
    "name": "gqa_ragged_h32_kv8_d128",
    "description": TEXT,
    "op_type": "gqa_ragged",
    "tags": [
        "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run",
        "stage:prefill",
        "status:verified",
    ],
    "axes": {**HEADS, "len_indptr": _var(), "total_q": _var(), "total_kv": _var()},
    "constraints": ["total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"],
    "inputs": {
        "q": _tensor(["total_q", "num_qo_heads", "head_dim"], "bfloat16"),
        "k": _tensor(["total_kv", "num_kv_heads", "head_dim"], "bfloat16"),
        "v": _tensor(["total_kv", "num_kv_heads", "head_dim"], "bfloat16"),
        "qo_indptr": _tensor(["len_indptr"], "unknown", optional=True, described=True),
        "kv_indptr": _tensor(["len_indptr"], "unknown", optional=True, described=True),
        **RUN_SCALARS,
    },
    "outputs": {
        "output": _tensor(["total_q", "num_qo_heads", "head_dim"], "bfloat16", described=True),
        "lse": _tensor(["total_q", "num_qo_heads"], "float32", True, True),
    },
}

GEMM_FP8 = {
    "name": "gemm_fp8_N1536_K7168",
    "description": TEXT,
    "op_type": "gemm_fp8",
    "tags": [
        "fi_api:flashinfer.gemm.gemm_base.mm_fp8",
        "status:verified",
        "quantization:float8_e4m3fn",
    ],
    "axes": {"M": _var(described=False), "N": _const(1536), "K": _const(7168)},
    "inputs": {
        "A": _tensor(["M", "K"], "float8_e4m3fn"),
        "B": _tensor(["K_div_block_size", "N", "block_size"], "float8_e4m3fn", described=True),
    },
    "outputs": {"C": _tensor(["M", "N"], "bfloat16")},
}

GEMM_FP4 = {
    "name": "gemm_fp4_N2048_K7168_block_size16",
    "description": TEXT,
    "op_type": "gemm_fp4",
    "tags": ["fi_api:flashinfer.gemm.gemm_base.mm_fp4", "status:verified", "quantization:fp4"],
    "axes": {
        "M": _var(described=False),
        "N": _const(2048),
        "K": _const(7168),
        "block_size": _const(16, described=True),
    },
    "inputs": {
        "A": _tensor(["M", "K"], "uint8", described=True),
        "B": _tensor(["K", "N"], "uint8", described=True),
        "a_descale": _tensor(["M", "K_div_block_size"], "float8_e4m3fn", described=True),
        "b_descale": _tensor(["K", "N_div_block_size"], "float8_e4m3fn", described=True),
        "block_size": _scalar("int32", optional=False),
    },
    "outputs": {"C": _tensor(["M", "N"], "bfloat16")},
}


def _fp4_axes(k):
    return {
        "M": _var(),
        "K": _const(k, described=True),
        "K_packed": _var(),
        "num_scale_elems": _var(),
        "one": _var(),
    }


FP4_OUTPUTS = {
    "quantized": _tensor(["M", "K_packed"], "uint8", described=True),
    "scales": _tensor(["num_scale_elems"], "uint8", described=True),
}


def fp4_quantize(k):
    return {
        "name": f"fp4_quantize_k{k}",
        "description": TEXT,
        "op_type": "quantization",
        "tags": [
            "fi_api:flashinfer.quantization.fp4_quantization.fp4_quantize",
            "status:verified",
            "quantization:fp4",
        ],
        "axes": _fp4_axes(k),
        "constraints": ["K_packed == K // 2"],
        "inputs": {
            "input": _tensor(["M", "K"], "bfloat16", described=True),
            "global_scale": _tensor(["one"], "float32", optional=True, described=True),
            "sf_vec_size": _scalar("int32"),
        },
        "outputs": FP4_OUTPUTS,
    }


NVFP4_QUANTIZE = {
    "name": "nvfp4_quantize_k4096",
    "description": TEXT,
    "op_type": "quantization",
    "tags": [
        "fi_api:flashinfer.quantization.fp4_quantization.nvfp4_quantize",
        "status:verified",
        "quantization:nvfp4",
    ],
    "axes": _fp4_axes(4096),
    "constraints": ["K_packed == K // 2"],
    "inputs": {
        "a": _tensor(["M", "K"], "bfloat16", described=True),
        "a_global_sf": _tensor(["one"], "float32", described=True),
        "sf_vec_size": _scalar("int32"),
    },
    "outputs": FP4_OUTPUTS,
}

# No FlashInfer output file exists for these two; the expectations follow FlashInfer's
# bmm_fp8 and batch-decode plan templates.
BMM_FP8 = {
    "name": "bmm_fp8_N64_K128",
    "description": TEXT,
    "op_type": "bmm_fp8",
    "tags": [
        "fi_api:flashinfer.gemm.gemm_base.bmm_fp8",
        "status:verified",
        "quantization:float8_e4m3fn",
    ],
    "axes": {
        "batch_size": _var(described=False),
        "M": _var(described=False),
        "N": _const(64),
        "K": _const(128),
        "scalar": _var(),
    },
    "inputs": {
        "A": _tensor(["batch_size", "M", "K"], "float8_e4m3fn"),
        "B": _tensor(["batch_size", "K", "N"], "float8_e4m3fn"),
        "A_scale": _tensor(["scalar"], "float32", described=True),
        "B_scale": _tensor(["scalar"], "float32", described=True),
        "dtype": _scalar("int32", optional=False),
    },
    "outputs": {"C": _tensor(["batch_size", "M", "N"], "bfloat16")},
}


def _plan_scalars():
    out = {
        "num_qo_heads": _scalar("int32", optional=False, described=False),
        "num_kv_heads": _scalar("int32", optional=False, described=False),
        "head_dim": _scalar("int32", optional=False, described=False),
        "page_size": _scalar("int32", optional=False, described=False),
        "q_len_per_req": _scalar("int32"),
        "is_causal": _scalar("bool"),
    }
    plain = [
        ("pos_encoding_mode", "string"),
        ("window_left", "int32"),
        ("window_right", "int32"),
        ("logits_soft_cap", "float32"),
        ("q_data_type", "dtype"),
        ("kv_data_type", "dtype"),
        ("o_data_type", "dtype"),
        ("data_type", "dtype"),
        ("sm_scale", "float32"),
        ("rope_scale", "float32"),
        ("rope_theta", "float32"),
        ("non_blocking", "bool"),
        ("fixed_split_size", "int32"),
        ("disable_split_kv", "bool"),
    ]
    out.update({name: _scalar(dtype, described=False) for name, dtype in plain})
    return out


PAGED_DECODE_PLAN = {
    "name": "gqa_paged_decode_plan_h32_kv8_d128_ps16",
    "description": TEXT,
    "op_type": "gqa_paged_plan",
    "tags": [
        "fi_api:flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan",
        "stage:decode",
        "phase:plan",
        "status:experimental",
    ],
    "axes": {
        "batch_size": _var(),
        **HEADS,
        "page_size": _const(16),
        "len_indptr": _var(),
        "num_kv_indices": _var(),
        "max_num_blocks_per_seq": _var(),
    },
    "constraints": ["len_indptr == batch_size + 1", "num_qo_heads % num_kv_heads == 0"],
    "inputs": {
        "indptr": _tensor(["len_indptr"], "int32"),
        "indices": _tensor(["num_kv_indices"], "int32"),
        "last_page_len": _tensor(["batch_size"], "int32"),
        **_plan_scalars(),
        "seq_lens": _tensor(["batch_size"], "int32", optional=True),
        "block_tables": _tensor(["batch_size", "max_num_blocks_per_seq"], "int32", optional=True),
    },
    "outputs": {},
}
