"""FlashInfer's backend surface on the GEMM and quantization APIs (flashinfer.utils):
is_backend_supported / is_compute_capability_supported / suitable_auto_backends /
skip_check, answered for this build, and kept through @flashinfer_api at every level."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from logging_utils import reload_api_logging, restore_level_0

from flashinfer import _kernels, utils
from flashinfer.fp4_quantization import fp4_quantize, nvfp4_quantize
from flashinfer.gemm import bmm_fp8, mm_fp4, mm_fp8
from flashinfer.utils import (
    BackendSupportedError,
    backend_requirement,
    cuda_kernel_capabilities,
    get_compute_capability,
    supported_compute_capability,
)

E4M3 = torch.float8_e4m3fn
ONE = torch.tensor(1.0)
APIS = [bmm_fp8, mm_fp8, mm_fp4, fp4_quantize, nvfp4_quantize]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bmm_operands():
    A = torch.randn(1, 8, 32).to(E4M3)
    B = torch.randn(1, 16, 32).to(E4M3).transpose(1, 2)
    return A, B


@pytest.mark.parametrize("api", APIS, ids=lambda f: f.__name__)
def test_every_api_has_the_backend_surface(api):
    for attr in ("is_backend_supported", "is_compute_capability_supported", "has_backend"):
        assert callable(getattr(api, attr))
    assert api.has_backend_choices()
    assert api.experimental_backends == frozenset()


@pytest.mark.parametrize(
    "api, names",
    [
        (bmm_fp8, ["cudnn", "cublas", "cutlass", "cute-dsl", "cublaslt", "cpu"]),
        (mm_fp8, ["trtllm_low_latency", "cutedsl_low_latency", "cublas", "cudnn", "cutlass"]),
        (mm_fp4, ["cudnn", "trtllm", "cutlass", "cute-dsl", "cutedsl_low_latency", "b12x", "cake"]),
        (fp4_quantize, ["cuda", "cute-dsl", "cpu"]),
        (nvfp4_quantize, ["cuda", "cute-dsl", "cake", "cpu"]),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_flashinfer_backend_names_exist_without_a_capability(api, names):
    assert all(api.is_backend_supported(b) for b in names)
    assert not api.is_backend_supported("tensorrt")


def test_cpu_backend_runs_cpu_tensors_only():
    assert mm_fp4.is_backend_supported("cpu")
    assert not mm_fp4.is_backend_supported("cpu", 90)


@pytest.mark.parametrize("cc", [75, 80, 86, 89, 90, 100, 120])
def test_cuda_kernel_backends_answer_for_this_build(cc):
    built = cc in cuda_kernel_capabilities()
    assert mm_fp4.is_backend_supported("cudnn", cc) is built
    assert bmm_fp8.is_backend_supported("cutlass", cc) is built
    assert nvfp4_quantize.is_backend_supported("cuda", cc) is built
    assert mm_fp4.is_compute_capability_supported(cc) is built


def test_capability_may_be_given_by_keyword():
    assert mm_fp4.is_backend_supported("cpu", compute_capability=None)
    assert not mm_fp4.is_backend_supported("cpu", compute_capability=90)


def test_cublas_needs_ada_or_newer_and_the_library():
    assert not bmm_fp8.is_backend_supported("cublas", 80)
    assert not bmm_fp8.is_backend_supported("cublas", 86)
    if utils.cublaslt_available():
        assert bmm_fp8.is_backend_supported("cublas", 90)
    else:
        assert not bmm_fp8.is_backend_supported("cublas", 90)


@pytest.mark.parametrize(
    "arch, cc, runs",
    [("80", 80, True), ("80", 86, True), ("86", 80, False), ("80", 90, False)]
    + [("90", 90, True), ("90", 100, False), ("90a", 90, True), ("90a", 100, False)],
)
def test_sass_runs_on_same_major_and_not_lower_minor(arch, cc, runs):
    assert utils._runs_sass(arch, cc) is runs


def test_cuda_kernel_capabilities_come_from_the_build():
    caps = cuda_kernel_capabilities()
    if not _kernels.cuda_built:
        assert caps == ()
    else:
        for arch in _kernels.cuda_archs.split(";"):
            assert int(arch.rstrip("a")) in caps


def test_get_compute_capability_refuses_a_cpu_device():
    with pytest.raises(ValueError, match="device must be a cuda device, got cpu"):
        get_compute_capability(torch.device("cpu"))


def test_auto_on_cpu_tensors_picks_cpu():
    A, B = _bmm_operands()
    out = bmm_fp8(A, B, ONE, ONE, torch.bfloat16, backend="auto")
    assert bmm_fp8.suitable_auto_backends == ["cpu"]
    assert torch.equal(out, bmm_fp8(A, B, ONE, ONE, torch.bfloat16, backend="cpu"))


def test_skip_check_is_accepted_and_skips_the_backend_check():
    A, B = _bmm_operands()
    bmm_fp8(A, B, ONE, ONE, torch.bfloat16, skip_check=False)
    with pytest.raises(BackendSupportedError, match="'nope'"):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16, backend="nope")
    with pytest.raises(ValueError, match=r"backend: 'nope' is not accepted"):
        bmm_fp8(A, B, ONE, ONE, torch.bfloat16, backend="nope", skip_check=True)


def test_mm_fp8_unprocessed_weight_backends_match_the_prepared_path():
    a = torch.randn(6, 256).to(E4M3)
    w = torch.randn(24, 256).to(E4M3)
    alpha = torch.tensor([0.5])
    from flashinfer.gemm import prepare_low_latency_gemm_weights

    want = mm_fp8(a, prepare_low_latency_gemm_weights(w), alpha)
    for backend in ("cublas", "cudnn", "cutlass", "cutedsl_low_latency", "auto", "cpu"):
        got = mm_fp8(a, w, alpha, backend=backend)
        torch.testing.assert_close(got.float(), want.float(), atol=0.0, rtol=1e-2)
    assert mm_fp8.suitable_auto_backends == ["cpu"]


def _decorated(method=False):
    """A backend_requirement API (a method when asked) with a CPU and a GPU-only backend."""

    @supported_compute_capability([None])
    def on_cpu(**kwargs):
        return True

    @supported_compute_capability([90])
    def on_hopper(**kwargs):
        return kwargs["x"].numel() < 100

    def api(x, backend="auto"):
        return backend

    def method_api(self, x, backend="auto"):
        return backend

    return backend_requirement(
        {"cpu": on_cpu, "hopper": on_hopper}, heuristic_func=lambda s, **kw: list(reversed(s))
    )(method_api if method else api)


def test_capability_of_the_call_decides(monkeypatch):
    api = _decorated()
    monkeypatch.setattr(utils, "_capability_of", lambda args, kwargs: 90)
    assert api(torch.zeros(3), backend="hopper") == "hopper"
    with pytest.raises(BackendSupportedError, match=r"'cpu' with capability 90; .*\['hopper'\]"):
        api(torch.zeros(3), backend="cpu")
    with pytest.raises(ValueError, match="Problem size is not supported for api"):
        api(torch.zeros(200), backend="hopper")
    api(torch.zeros(3))
    assert api.suitable_auto_backends == ["hopper"]
    monkeypatch.setattr(utils, "_capability_of", lambda args, kwargs: 80)
    with pytest.raises(BackendSupportedError, match="No suitable auto backends found for api"):
        api(torch.zeros(3))


def test_suitable_auto_backends_is_one_list_updated_in_place():
    api = _decorated()
    first = api.suitable_auto_backends
    api(torch.zeros(3))
    assert api.suitable_auto_backends is first and first == ["cpu"]


@pytest.mark.parametrize("level", [0, 3])
def test_surface_survives_flashinfer_api_above_backend_requirement(monkeypatch, level):
    mod = reload_api_logging(monkeypatch, FLASHINFER_LOGLEVEL=level, FLASHINFER_LOGDEST=os.devnull)
    try:
        api = mod.flashinfer_api(_decorated())

        class Holder:
            method = mod.flashinfer_api(_decorated(method=True))

        for view in (api, Holder.method, Holder().method):
            assert view.is_backend_supported("cpu") and not view.is_backend_supported("x")
            assert view.is_compute_capability_supported(90)
        assert api(torch.zeros(3)) == "auto"
        assert api.suitable_auto_backends == ["cpu"]
        assert Holder().method(torch.zeros(3), backend="cpu", skip_check=True) == "cpu"
    finally:
        restore_level_0()


@pytest.mark.parametrize("level", ["0", "1", "3", "10"])
def test_our_apis_keep_the_surface_at_every_level(tmp_path, level):
    script = textwrap.dedent(
        """
        import torch, flashinfer
        from flashinfer import mm_fp4, nvfp4_quantize, bmm_fp8

        class Owner:
            run = staticmethod(mm_fp4)

        for api in (mm_fp4, Owner.run, Owner().run, bmm_fp8, nvfp4_quantize):
            assert api.is_backend_supported("cudnn" if api is not nvfp4_quantize else "cuda")
            assert api.is_backend_supported("cpu") and not api.is_backend_supported("cpu", 90)
        x = torch.randn(8, 64)
        a, a_sf = nvfp4_quantize(x, torch.tensor(1.0), skip_check=False)
        out = mm_fp4(a, a.T, a_sf, a_sf.T, skip_check=False)
        assert mm_fp4.suitable_auto_backends == ["cpu"], mm_fp4.suitable_auto_backends
        print("ok", out.shape)
        """
    )
    env = dict(os.environ, FLASHINFER_LOGLEVEL=level, FLASHINFER_DUMP_DIR=str(tmp_path))
    env["FLASHINFER_LOGDEST"] = str(tmp_path / "log.txt")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "ok torch.Size([8, 8])" in run.stdout
    if level != "0":
        assert "FlashInfer API Call: mm_fp4" in (tmp_path / "log.txt").read_text()


def test_unknown_backend_error_is_also_a_value_error():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="does not support backend 'bogus'"):
        fp4_quantize(x, torch.tensor([1.0]), backend="bogus")
