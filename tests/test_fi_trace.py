"""fi_trace: the flashinfer-bench definitions of our APIs equal FlashInfer's, key by key
(tests/fi_trace_expected.py), the FLASHINFER_TRACE_DUMP auto-dump, and the embedded
reference/init/check sources run on their own."""

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from fi_trace_expected import (
    BMM_FP8,
    GEMM_FP4,
    GEMM_FP8,
    NVFP4_QUANTIZE,
    PAGED_DECODE_PLAN,
    PAGED_PREFILL,
    RAGGED_PREFILL,
    SINGLE_DECODE,
    SINGLE_PREFILL,
    SOURCE_KEYS,
    fp4_quantize,
    paged_decode,
)
from logging_utils import reload_api_logging, restore_level_0

import flashinfer
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.fi_trace import fi_trace
from flashinfer.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.trace import Const, Scalar, Tensor, TraceTemplate, Var

BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn


def meta(*shape, dtype=BF16):
    """A tensor with a shape and dtype but no memory: all fi_trace reads."""
    return torch.empty(shape, dtype=dtype, device="meta")


def assert_definition(actual, expected):
    """Every key of FlashInfer's definition, one by one, in FlashInfer's order; sources last."""
    assert list(actual) == list(expected) + list(SOURCE_KEYS)
    for key, value in expected.items():
        assert actual[key] == value, key
    for key in SOURCE_KEYS:
        assert isinstance(actual[key], str) and actual[key], key


# The calls of FlashInfer's tests/trace/example.py that produced its fi_trace_out files.
CASES = {
    "single_decode": (
        lambda: flashinfer.single_decode_with_kv_cache.fi_trace(
            q=meta(32, 128), k=meta(256, 8, 128), v=meta(256, 8, 128)
        ),
        SINGLE_DECODE,
    ),
    "single_prefill": (
        lambda: flashinfer.single_prefill_with_kv_cache.fi_trace(
            q=meta(128, 32, 128), k=meta(256, 8, 128), v=meta(256, 8, 128), causal=True
        ),
        SINGLE_PREFILL,
    ),
    "paged_decode_ps16": (
        lambda: BatchDecodeWithPagedKVCacheWrapper.run.fi_trace(
            q=meta(32, 32, 128), paged_kv_cache=(meta(4096, 16, 8, 128), meta(4096, 16, 8, 128))
        ),
        paged_decode(16),
    ),
    "paged_decode_ps64": (
        lambda: BatchDecodeWithPagedKVCacheWrapper.run.fi_trace(
            q=meta(32, 32, 128), paged_kv_cache=(meta(1024, 64, 8, 128), meta(1024, 64, 8, 128))
        ),
        paged_decode(64),
    ),
    "paged_prefill": (
        lambda: BatchPrefillWithPagedKVCacheWrapper.run.fi_trace(
            q=meta(512, 32, 128), paged_kv_cache=(meta(128, 16, 8, 128), meta(128, 16, 8, 128))
        ),
        PAGED_PREFILL,
    ),
    "ragged_prefill": (
        lambda: BatchPrefillWithRaggedKVCacheWrapper.run.fi_trace(
            q=meta(256, 32, 128), k=meta(512, 8, 128), v=meta(512, 8, 128)
        ),
        RAGGED_PREFILL,
    ),
    "mm_fp8": (
        lambda: flashinfer.mm_fp8.fi_trace(
            a=meta(128, 7168, dtype=E4M3),
            b=meta(56, 1536, 128, dtype=E4M3),
            alpha=meta(dtype=torch.float32),
        ),
        GEMM_FP8,
    ),
    "mm_fp4": (
        lambda: flashinfer.mm_fp4.fi_trace(
            a=meta(128, 7168, dtype=torch.uint8),
            b=meta(7168, 2048, dtype=torch.uint8),
            a_descale=meta(128, 448, dtype=E4M3),
            b_descale=meta(7168, 128, dtype=E4M3),
            block_size=16,
        ),
        GEMM_FP4,
    ),
    "nvfp4_quantize": (
        lambda: flashinfer.nvfp4_quantize.fi_trace(
            a=meta(128, 4096), a_global_sf=meta(1, dtype=torch.float32)
        ),
        NVFP4_QUANTIZE,
    ),
    "fp4_quantize_k4096": (
        lambda: flashinfer.fp4_quantize.fi_trace(
            input=meta(128, 4096), global_scale=meta(1, dtype=torch.float32), sf_vec_size=16
        ),
        fp4_quantize(4096),
    ),
    "fp4_quantize_k7168": (
        lambda: flashinfer.fp4_quantize.fi_trace(
            input=meta(16, 7168), global_scale=meta(1, dtype=torch.float32)
        ),
        fp4_quantize(7168),
    ),
    "bmm_fp8": (
        lambda: flashinfer.bmm_fp8.fi_trace(
            A=meta(4, 64, 128, dtype=E4M3),
            B=meta(4, 128, 64, dtype=E4M3),
            A_scale=meta(1, dtype=torch.float32),
            B_scale=meta(1, dtype=torch.float32),
            dtype=BF16,
        ),
        BMM_FP8,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_definition_equals_flashinfers(case):
    make, expected = CASES[case]
    assert_definition(make(), expected)


def test_plan_definition_equals_flashinfers():
    defn = BatchDecodeWithPagedKVCacheWrapper.plan.fi_trace(
        indptr=meta(33, dtype=torch.int32),
        indices=meta(4096, dtype=torch.int32),
        last_page_len=meta(32, dtype=torch.int32),
        num_qo_heads=32,
        num_kv_heads=8,
        head_dim=128,
        page_size=16,
    )
    assert list(defn) == list(PAGED_DECODE_PLAN) + ["check"]
    for key, value in PAGED_DECODE_PLAN.items():
        assert defn[key] == value, key


def test_plan_definition_reads_arguments_collected_by_kwargs():
    defn = BatchDecodeWithPagedKVCacheWrapper.plan.fi_trace(
        indptr=meta(3, dtype=torch.int32), kwargs={"num_qo_heads": 4, "page_size": 8}
    )
    assert defn["axes"]["num_qo_heads"]["value"] == 4
    assert defn["axes"]["page_size"]["value"] == 8


def test_single_paged_kv_tensor_leaves_cache_axes_unknown():
    defn = BatchDecodeWithPagedKVCacheWrapper.run.fi_trace(
        q=meta(4, 32, 128), paged_kv_cache=meta(8, 2, 16, 8, 128)
    )
    assert defn["name"] == "gqa_paged_decode_h32_d128"  # kv heads and page size: from k_cache
    assert defn["inputs"]["k_cache"]["dtype"] == "unknown"
    assert "value" not in defn["axes"]["page_size"]


def test_explicit_name_replaces_the_generated_one():
    defn = flashinfer.nvfp4_quantize.fi_trace(name="mine", a=meta(4, 64), a_global_sf=meta(1))
    assert defn["name"] == "mine"


# ------------------------------------------------------------------ files and helpers


def test_save_dir_writes_the_definition_as_json(tmp_path):
    out = tmp_path / "a" / "b"
    defn = flashinfer.nvfp4_quantize.fi_trace(save_dir=out, a=meta(4, 64), a_global_sf=meta(1))
    path = out / "nvfp4_quantize_k64.json"
    assert json.loads(path.read_text()) == defn
    assert path.read_text() == json.dumps(defn, indent=2)


def test_save_dir_rewrites_every_time(tmp_path):
    kwargs = {"a": meta(4, 64), "a_global_sf": meta(1)}
    flashinfer.nvfp4_quantize.fi_trace(save_dir=tmp_path, **kwargs)
    (tmp_path / "nvfp4_quantize_k64.json").unlink()
    flashinfer.nvfp4_quantize.fi_trace(save_dir=tmp_path, **kwargs)
    assert (tmp_path / "nvfp4_quantize_k64.json").exists()


def test_trace_dump_dir_is_read_at_each_call(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_TRACE_DUMP_DIR", str(tmp_path))
    defn = flashinfer.fp4_quantize.fi_trace(input=meta(4, 96))
    assert json.loads((tmp_path / "fp4_quantize_k96.json").read_text()) == defn


def test_fi_trace_helper_takes_functions_and_methods():
    q, cache = meta(32, 32, 128), (meta(64, 16, 8, 128), meta(64, 16, 8, 128))
    unbound = fi_trace(BatchDecodeWithPagedKVCacheWrapper.run, q=q, paged_kv_cache=cache)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(16))
    bound = fi_trace(wrapper.run, q=q, paged_kv_cache=cache)
    assert unbound == bound
    assert unbound["name"] == "gqa_paged_decode_h32_kv8_d128_ps16"
    assert flashinfer.fi_trace is fi_trace


def test_fi_trace_helper_passes_the_bound_object_as_self():
    seen = []

    def choose(save_dir=None, name=None, **kwargs):
        seen.append(kwargs.get("self"))
        return TraceTemplate("probe", {}, {}, {})

    class Holder:
        @flashinfer.api_logging.flashinfer_api(trace=choose)
        def run(self, x):
            return x

    holder = Holder()
    fi_trace(holder.run, x=1, self="ignored")
    assert seen == [holder]


def test_fi_trace_helper_rejects_apis_without_a_template():
    with pytest.raises(ValueError, match="No fi_trace spec is registered for "):
        fi_trace(BatchDecodeWithPagedKVCacheWrapper.__init__)
    with pytest.raises(ValueError, match="'len'"):
        fi_trace(len)


def test_every_traced_api_is_registered_once():
    from flashinfer.api_logging import _TRACE_REGISTRY

    labels = {label for _, _, label in _TRACE_REGISTRY}
    assert {
        "single_decode",
        "single_prefill",
        "gqa_paged_decode",
        "gqa_paged_decode_plan",
        "gqa_paged_prefill",
        "gqa_ragged",
        "bmm_fp8",
        "gemm_fp8",
        "gemm_fp4",
        "fp4_quantize",
        "nvfp4_quantize",
    } <= labels
    assert all(t.check is not None for _, t, _ in _TRACE_REGISTRY)


def test_fi_init_is_there_where_the_template_has_an_init():
    assert hasattr(flashinfer.mm_fp4, "fi_init")
    assert hasattr(BatchDecodeWithPagedKVCacheWrapper.run, "fi_init")
    assert not hasattr(BatchDecodeWithPagedKVCacheWrapper.plan, "fi_init")
    assert not hasattr(flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan, "fi_trace")


def test_prepare_low_latency_gemm_weights_is_traced_with_a_reference():
    # A superset of FlashInfer, which does not trace it: replay --against reference
    # checks every mirror API that returns something (docs/replay.md).
    w = torch.randn(8, 256).to(torch.float8_e4m3fn)
    d = flashinfer.prepare_low_latency_gemm_weights.fi_trace(w=w)
    assert d["name"] == "prepare_low_latency_gemm_weights_k256"
    assert (
        d["tags"][0] == "fi_api:flashinfer.trtllm_low_latency_gemm.prepare_low_latency_gemm_weights"
    )
    template = flashinfer.trace.attach.API_TEMPLATES["prepare_low_latency_gemm_weights"][0]
    expected = flashinfer.prepare_low_latency_gemm_weights(w)
    assert torch.equal(template.reference(w).view(torch.uint8), expected.view(torch.uint8))


# ------------------------------------------------------- decorator, levels, auto-dump


@pytest.fixture
def logmod(monkeypatch):
    yield lambda **env: reload_api_logging(monkeypatch, **env)
    restore_level_0()


TOY = TraceTemplate(
    op_type="toy",
    axes={"n": Var(), "d": Const(abbrev="d")},
    inputs={"x": Tensor(["n", "d"]), "eps": Scalar("float32")},
    outputs={"y": Tensor(["n", "d"], dtype_from="x")},
)


def test_level_0_without_trace_dump_returns_the_function_itself(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="0")

    def toy(x, eps=1e-6):
        return x

    assert m.flashinfer_api(trace=TOY)(toy) is toy
    assert toy.fi_trace(x=meta(3, 8))["name"] == "toy_d8"
    assert toy.fi_trace(x=meta(3, 8))["tags"] == [f"fi_api:{__name__}.{toy.__qualname__}"]


@pytest.mark.parametrize("level", ["0", "3"])
def test_trace_dump_wraps_and_writes_before_the_call(logmod, tmp_path, level):
    m = logmod(
        FLASHINFER_LOGLEVEL=level,
        FLASHINFER_LOGDEST=str(tmp_path / "log"),
        FLASHINFER_TRACE_DUMP="1",
        FLASHINFER_TRACE_DUMP_DIR=str(tmp_path / "defs"),
    )
    seen = []

    def toy(x, eps=1e-6):
        seen.append(sorted(p.name for p in (tmp_path / "defs").iterdir()))
        return x

    traced = m.flashinfer_api(trace=TOY)(toy)
    assert traced is not toy and traced.fi_trace is not None
    width = 10 + int(level)  # one definition name per test: names are written once per process
    traced(torch.zeros(2, width))
    assert seen == [[f"toy_d{width}.json"]]


def test_definition_template_errors_warn_once_and_the_call_runs(logmod, tmp_path):
    m = logmod(FLASHINFER_TRACE_DUMP="1", FLASHINFER_TRACE_DUMP_DIR=str(tmp_path))

    def choose(**kwargs):
        raise KeyError("no template")

    traced = m.flashinfer_api(trace=choose)(lambda x: x + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert traced(1) == 2 and traced(2) == 3
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1
    assert messages[0].startswith("[flashinfer] fi_trace auto-dump failed for '")
    assert "KeyError: 'no template'" in messages[0]


def test_an_unattachable_template_warns_and_leaves_the_function(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="0")
    with pytest.warns(UserWarning, match="Failed to attach fi_trace to 'max'"):
        assert m.flashinfer_api(trace=TOY)(max) is max


def test_register_fi_trace_gives_later_decorations_a_template(logmod, monkeypatch):
    def registered_toy(x, eps=0.0):
        return x

    registry = importlib.import_module("flashinfer.fi_trace")._REGISTRY
    monkeypatch.setitem(registry, registered_toy.__qualname__, TOY)
    m = logmod(FLASHINFER_LOGLEVEL="0")
    m.flashinfer_api(registered_toy)
    assert registered_toy.fi_trace(x=meta(1, 6))["name"] == "toy_d6"


def test_selector_templates_are_chosen_per_call(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST="stderr")
    other = TraceTemplate("other", {"n": Const()}, {"x": Tensor(["n"])}, {})

    def choose(save_dir=None, name=None, **kwargs):
        return TOY if kwargs["x"].dim() == 2 else other

    choose.templates = [TOY, other]
    traced = m.flashinfer_api(trace=choose)(lambda x, eps=0.0: x)
    assert traced.fi_trace(x=meta(2, 4))["name"] == "toy_d4"
    assert traced.fi_trace(x=meta(5))["name"] == "other_n5"
    assert not hasattr(traced, "fi_init")  # none of its templates has an init


def test_selector_without_a_template_list_gets_a_checking_fi_init(logmod):
    m = logmod(FLASHINFER_LOGLEVEL="0")
    traced = m.flashinfer_api(trace=lambda **kwargs: TOY)(lambda x: x)
    with pytest.raises(RuntimeError, match="No init function available for the resolved"):
        traced.fi_init(x=1)


AUTO_DUMP_SCRIPT = """
import torch, flashinfer
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
q = torch.randn(32, 128, dtype=torch.bfloat16)
k = torch.randn(40, 8, 128, dtype=torch.bfloat16)
flashinfer.single_decode_with_kv_cache(q, k, k)
flashinfer.single_decode_with_kv_cache(q, k[:20], k[:20])  # same definition: no new file
try:
    flashinfer.single_decode_with_kv_cache(q[:16], k, k[:, :, :64])  # the kernel refuses it
except ValueError:
    pass
w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(16), "NHD")
indptr = torch.tensor([0, 2, 4], dtype=torch.int32)
w.plan(indptr, torch.arange(4, dtype=torch.int32), torch.full((2,), 16, dtype=torch.int32),
       32, 8, 128, 16, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
cache = torch.randn(4, 16, 8, 128, dtype=torch.bfloat16)
w.run(torch.randn(2, 32, 128, dtype=torch.bfloat16), (cache, cache))
x = torch.randn(128, 4096, dtype=torch.bfloat16)
flashinfer.nvfp4_quantize(x, torch.tensor([1.0]))
flashinfer.fp4_quantize(x, torch.tensor([1.0]), sf_vec_size=16)
print("ok")
"""


def clean_env(**env):
    """This process's environment without FLASHINFER_* variables, plus env."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    return {**base, **env}


@pytest.mark.parametrize("level", ["0", "1", "10"])
def test_trace_dump_of_a_real_session(tmp_path, level):
    env = clean_env(
        FLASHINFER_LOGLEVEL=level,
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
        FLASHINFER_DUMP_DIR=str(tmp_path / "dumps"),
        FLASHINFER_TRACE_DUMP="1",
        FLASHINFER_TRACE_DUMP_DIR=str(tmp_path / "defs"),
    )
    r = subprocess.run(
        [sys.executable, "-c", AUTO_DUMP_SCRIPT], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    defs = {p.name: json.loads(p.read_text()) for p in (tmp_path / "defs").iterdir()}
    assert sorted(defs) == [
        "fp4_quantize_k4096.json",
        "gqa_paged_decode_h32_kv8_d128_ps16.json",
        "gqa_paged_decode_plan_h32_kv8_d128_ps16.json",
        "nvfp4_quantize_k4096.json",
        "single_decode_h16_kv8_d128.json",
        "single_decode_h32_kv8_d128.json",
    ]
    assert_definition(defs["single_decode_h32_kv8_d128.json"], SINGLE_DECODE)
    assert_definition(defs["gqa_paged_decode_h32_kv8_d128_ps16.json"], paged_decode(16))
    assert_definition(defs["nvfp4_quantize_k4096.json"], NVFP4_QUANTIZE)
    assert_definition(defs["fp4_quantize_k4096.json"], fp4_quantize(4096))
    plan = defs["gqa_paged_decode_plan_h32_kv8_d128_ps16.json"]
    assert {k: plan[k] for k in PAGED_DECODE_PLAN} == PAGED_DECODE_PLAN
    if level == "10":  # the methods wrapped for the trace dump keep their name and object
        session = (tmp_path / "dumps" / "session.jsonl").read_text().splitlines()
        records = {json.loads(x)["function_name"]: json.loads(x) for x in session}
        plan = records["BatchDecodeWithPagedKVCacheWrapper.plan"]
        run = records["BatchDecodeWithPagedKVCacheWrapper.run"]
        assert plan["self_id"] == run["self_id"]


def test_trace_dump_without_a_directory_writes_nothing(tmp_path):
    env = clean_env(FLASHINFER_TRACE_DUMP="1")
    script = (
        "import torch, flashinfer\n"
        "flashinfer.nvfp4_quantize(torch.randn(4, 64), torch.tensor([1.0]))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- the embedded sources


def snippet(api, key, **kwargs):
    """The function defined last by the definition's ``key`` source, run on its own."""
    source = api.fi_trace(**kwargs)[key]
    namespace = {}
    exec(compile(source, f"<{key}>", "exec"), namespace)
    return namespace[re.findall(r"^def (\w+)", source, re.M)[-1]]


def test_reference_of_single_decode_matches_the_kernel():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, 64, generator=g).half()
    k = torch.randn(33, 2, 64, generator=g).half()
    v = torch.randn(33, 2, 64, generator=g).half()
    ref = snippet(flashinfer.single_decode_with_kv_cache, "reference", q=q, k=k, v=v)
    torch.testing.assert_close(
        ref(q, k, v), flashinfer.single_decode_with_kv_cache(q, k, v), rtol=2e-3, atol=2e-3
    )


def test_reference_of_single_prefill_matches_the_kernel_causal():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 4, 64, generator=g).half()
    k = torch.randn(9, 2, 64, generator=g).half()
    v = torch.randn(9, 2, 64, generator=g).half()
    ref = snippet(flashinfer.single_prefill_with_kv_cache, "reference", q=q, k=k, v=v)
    out = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    torch.testing.assert_close(ref(q, k, v, causal=True), out, rtol=2e-3, atol=2e-3)


def test_reference_of_paged_decode_matches_the_wrapper():
    init = BatchDecodeWithPagedKVCacheWrapper.run.fi_init(
        batch_size=3, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, device="cpu"
    )
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(16))
    w.plan(**init["plan"])
    out, lse = w.run(**init["run"], return_lse=True)
    k, v = init["run"]["paged_kv_cache"]
    ref = snippet(BatchDecodeWithPagedKVCacheWrapper.run, "reference", **init["run"])
    ref_out, ref_lse = ref(
        init["run"]["q"], k, v, init["plan"]["indptr"], init["plan"]["indices"], None
    )
    torch.testing.assert_close(ref_out, out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ref_lse, lse, rtol=1e-3, atol=1e-3)


def test_reference_of_paged_prefill_matches_the_wrapper():
    init = BatchPrefillWithPagedKVCacheWrapper.run.fi_init(
        total_q=10, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, device="cpu"
    )
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(16))
    w.plan(**init["plan"])
    out, lse = w.run(**init["run"], return_lse=True)
    p = init["plan"]
    k, v = init["run"]["paged_kv_cache"]
    ref = snippet(BatchPrefillWithPagedKVCacheWrapper.run, "reference", **init["run"])
    ref_out, ref_lse = ref(
        init["run"]["q"], k, v, p["qo_indptr"], p["paged_kv_indptr"], p["paged_kv_indices"]
    )
    torch.testing.assert_close(ref_out, out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ref_lse, lse, rtol=1e-3, atol=1e-3)


def test_reference_of_ragged_prefill_matches_the_wrapper():
    init = BatchPrefillWithRaggedKVCacheWrapper.run.fi_init(
        total_q=9, total_kv=21, num_qo_heads=4, num_kv_heads=1, head_dim=64, device="cpu"
    )
    w = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(16))
    w.plan(**init["plan"])
    out = w.run(**init["run"])
    r, p = init["run"], init["plan"]
    ref = snippet(BatchPrefillWithRaggedKVCacheWrapper.run, "reference", **r)
    ref_out, _ = ref(r["q"], r["k"], r["v"], p["qo_indptr"], p["kv_indptr"])
    torch.testing.assert_close(ref_out, out, rtol=2e-2, atol=2e-2)


def test_reference_of_bmm_fp8_matches_the_kernel():
    args = flashinfer.bmm_fp8.fi_init(batch_size=2, M=8, N=16, K=32, device="cpu")
    ref = snippet(flashinfer.bmm_fp8, "reference", **args)
    torch.testing.assert_close(ref(**args), flashinfer.bmm_fp8(**args), rtol=1e-2, atol=1e-2)


def test_reference_of_mm_fp8_matches_the_kernel():
    args = flashinfer.mm_fp8.fi_init(M=4, N=64, K=256, device="cpu")
    ref = snippet(flashinfer.mm_fp8, "reference", **args)
    torch.testing.assert_close(
        ref(args["a"], args["b"], args["alpha"]), flashinfer.mm_fp8(**args), rtol=1e-2, atol=1e-2
    )


def test_reference_of_mm_fp4_matches_the_kernel():
    args = flashinfer.mm_fp4.fi_init(M=5, N=32, K=64, device="cpu")
    ref = snippet(flashinfer.mm_fp4, "reference", **args)
    expected = ref(args["a"], args["b"], args["a_descale"], args["b_descale"], 16, args["alpha"])
    torch.testing.assert_close(expected, flashinfer.mm_fp4(**args), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("sf_vec_size, ue8m0", [(16, False), (32, True)])
@pytest.mark.parametrize("swizzled, eight_by_four", [(False, False), (True, False), (True, True)])
def test_reference_of_fp4_quantize_is_bit_exact(sf_vec_size, ue8m0, swizzled, eight_by_four):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 64, generator=g) * 7
    x[2, :32] = 0
    gsf = torch.tensor([3.5])
    ref = snippet(flashinfer.fp4_quantize, "reference", input=x)
    layout = dict(is_sf_swizzled_layout=swizzled, is_sf_8x4_layout=eight_by_four)
    want = ref(x, gsf, sf_vec_size, ue8m0, **layout)
    got = flashinfer.fp4_quantize(x, gsf, sf_vec_size, sf_use_ue8m0=ue8m0, **layout)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.mark.parametrize("layout", list(flashinfer.SfLayout))
def test_reference_of_nvfp4_quantize_is_bit_exact(layout):
    args = flashinfer.nvfp4_quantize.fi_init(M=130, K=48, device="cpu")
    ref = snippet(flashinfer.nvfp4_quantize, "reference", **args)
    got = flashinfer.nvfp4_quantize(**args, sfLayout=layout)
    want = ref(**args, sfLayout=layout)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


INIT_CASES = {
    "single_decode": (flashinfer.single_decode_with_kv_cache, {"kv_len": 7}),
    "single_prefill": (flashinfer.single_prefill_with_kv_cache, {"qo_len": 3, "kv_len": 8}),
    "bmm_fp8": (flashinfer.bmm_fp8, {"batch_size": 2}),
    "mm_fp8": (flashinfer.mm_fp8, {"M": 2, "N": 128, "K": 256}),
    "mm_fp4": (flashinfer.mm_fp4, {"M": 2, "N": 64, "K": 128}),
    "fp4_quantize": (flashinfer.fp4_quantize, {"M": 3, "K": 64}),
    "nvfp4_quantize": (flashinfer.nvfp4_quantize, {"M": 3, "K": 64}),
}


@pytest.mark.parametrize("case", sorted(INIT_CASES))
def test_init_source_runs_alone_and_its_arguments_run_the_api(case):
    api, axes = INIT_CASES[case]
    sample = api.fi_init(**axes, device="cpu")
    init = snippet(api, "init", **sample)
    args = init(**axes, device="cpu")
    assert args.keys() == sample.keys()
    api(**args)


@pytest.mark.parametrize(
    "wrapper, axes",
    [
        (BatchDecodeWithPagedKVCacheWrapper, {"batch_size": 2, "head_dim": 64}),
        (BatchPrefillWithPagedKVCacheWrapper, {"total_q": 5, "head_dim": 64}),
        (BatchPrefillWithRaggedKVCacheWrapper, {"total_q": 5, "total_kv": 12, "head_dim": 64}),
    ],
)
def test_wrapper_init_source_plans_and_runs(wrapper, axes):
    init = snippet(wrapper.run, "init", q=meta(1, 32, 64))
    args = init(**axes, device="cpu")
    w = wrapper(torch.empty(16))
    w.plan(**args["plan"])
    w.run(**args["run"])


def test_check_sources_pass_close_outputs_and_fail_far_ones():
    for api in (flashinfer.single_decode_with_kv_cache, flashinfer.mm_fp4, flashinfer.fp4_quantize):
        check = snippet(api, "check", q=meta(4, 8))
        ref = torch.linspace(-1, 1, 64)
        assert check([ref], [ref + 1e-6])
        assert not check([ref], [-ref])


def test_default_check_semantics():
    from flashinfer.trace import default_check, default_tolerances

    assert default_tolerances(torch.bfloat16) == (1e-2, 1e-2)
    assert default_tolerances("float8_e4m3fn") == (0.1, 0.1)
    ref = torch.tensor([1.0, 2.0, 3.0])
    assert default_check({"o": ref}, {"o": ref + 1e-6})
    assert not default_check({"o": ref}, {"p": ref})
    assert not default_check([ref], [ref, ref])
    ints = torch.tensor([1, 2, 3])
    assert default_check([ints], [torch.tensor([1, 2, 0])], max_mismatch_pct=34.0)
    assert not default_check([ints], [torch.tensor([1, 2, 0])])


def test_sources_are_rendered_once_per_template():
    kwargs = {"a": meta(4, 64), "a_global_sf": meta(1)}
    first = flashinfer.nvfp4_quantize.fi_trace(**kwargs)
    second = flashinfer.nvfp4_quantize.fi_trace(**kwargs)
    assert first["reference"] is second["reference"]


def test_trace_package_exports_flashinfers_names():
    import flashinfer.trace as trace

    names = textwrap.dedent(
        """Const Scalar Tensor TraceTemplate Var default_check default_tolerances
        standard_check _TRACE_DUMP_DIR"""
    ).split()
    assert all(hasattr(trace, n) for n in names)
