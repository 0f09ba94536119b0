"""benchmarks/flashinfer_benchmark.py: the seed's command line, every routine, repro commands."""

import csv
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import flashinfer_benchmark as fb  # noqa: E402

import flashinfer  # noqa: E402
from flashinfer.fp4_quantization import SfLayout  # noqa: E402

SEED = (
    "python3 benchmarks/flashinfer_benchmark.py --routine mm_fp4 --m 4 --n 1024 --k 7168 "
    "--out_dtype bfloat16 --backends cudnn --use_128x4_sf_layout --use_nvfp4 --refcheck -vv "
    "--generate_repro_command --use_cupti --no_cuda_graph --num_iters 5"
)
SEED_REPRO = (
    "python3 benchmarks/flashinfer_benchmark.py --routine mm_fp4 --m 4 --n 1024 --k 7168 "
    "--out_dtype bfloat16 --use_128x4_sf_layout --use_nvfp4 --backends cudnn --refcheck "
    "--use_cupti --no_cuda_graph --num_iters 5 --dry_run_iters 5 --random_seed 42 -vv"
)
PERF = re.compile(
    r"\[PERF\] (\S+) +:: median time [\d.]+ ms; std [\d.]+ ms; "
    r"achieved tflops [\d.e+-]+ TFLOPs/sec; achieved tb_per_sec [\d.e+-]+ TB/sec"
)


def shell(command, cwd=REPO, **env_extra):
    """Run a command line as a user would type it, in the repo root, python3 = this python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    argv = shlex.split(command)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def seed_run():
    return shell(SEED)


def test_seed_command_runs_verbatim_and_passes_refcheck(seed_run):
    assert seed_run.returncode == 0, seed_run.stdout + seed_run.stderr
    lines = seed_run.stdout.splitlines()
    assert PERF.fullmatch(next(x for x in lines if x.startswith("[PERF]"))).group(1) == "cudnn"
    assert any(
        x.startswith("[REFCHECK] cudnn: PASSED against dequantize-then-matmul") for x in lines
    )
    assert (
        "[VVERBOSE] a.shape = [4, 3584], dtype = torch.uint8, stride = [3584, 1], device = cpu"
        in lines
    )


def test_seed_command_reports_ignored_flags_in_one_line(seed_run):
    ignored = [x for x in seed_run.stdout.splitlines() if "Ignored" in x]
    if torch.cuda.is_available():
        assert ignored == [
            "[INFO] Ignored on cuda: --use_cupti (timing uses CUDA events); "
            "--no_cuda_graph (CUDA graphs are not used by this driver)"
        ]
    else:
        assert ignored == [
            "[INFO] Ignored on cpu: --use_cupti (no CUDA device); --no_cuda_graph (CUDA graphs "
            "need a CUDA device); --backends cudnn (every backend runs the same CPU kernel; "
            "the name is passed to the API)"
        ]


def test_seed_command_prints_repro_command_with_effective_flags(seed_run):
    assert seed_run.stdout.splitlines()[0] == (
        "[INFO] To reproduce this test case, run the following command: " + SEED_REPRO
    )


def test_repro_command_rerun_reproduces_itself_and_the_check():
    first = shell(
        "python3 benchmarks/flashinfer_benchmark.py --routine bmm_fp8 --batch_size 2 --m 16 "
        "--n 32 --k 64 --refcheck --generate_repro_command --num_iters 2 --dry_run_iters 0"
    )
    assert first.returncode == 0, first.stderr
    prefix = "[INFO] To reproduce this test case, run the following command: "
    repro = first.stdout.splitlines()[0][len(prefix) :]
    assert repro.startswith("python3 benchmarks/flashinfer_benchmark.py --routine bmm_fp8 ")
    second = shell(repro + " --generate_repro_command")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[0] == prefix + repro
    assert "[REFCHECK] cublas: PASSED" in second.stdout


def test_seed_command_at_level_10_replays_every_call(tmp_path):
    dumps = tmp_path / "my_dumps"
    r = shell(
        SEED,
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_DUMP_DIR=str(dumps),
        FLASHINFER_LOGDEST=str(tmp_path / "log.txt"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    replay = shell(f"python -m flashinfer replay --dir {dumps}", FLASHINFER_LOGLEVEL="0")
    assert replay.returncode == 0, replay.stdout
    calls = [x for x in replay.stdout.splitlines() if x.startswith("[")]
    names = [re.match(r"\[\d+\] (\S+) ", x).group(1) for x in calls]
    # two quantizations, then the refcheck call, 5 warm-up and 5 timed calls
    assert names == ["nvfp4_quantize"] * 2 + ["mm_fp4"] * 11
    assert all(x.endswith("✅ Passed") for x in calls)
    assert replay.stdout.splitlines()[-1] == "Summary: 13 passed, 0 failed/mismatch"


SMALL = {
    "mm_fp4": "--m 40 --n 64 --k 256 --use_nvfp4 --use_128x4_sf_layout",
    "bmm_fp8": "--batch_size 2 --m 16 --n 32 --k 64 --input_dtype fp8_e5m2",
    "mm_fp8": "--m 8 --n 32 --k 256 --out_dtype float16",
    "single_decode_with_kv_cache": "--s_kv 70 --num_qo_heads 4 --num_kv_heads 2 --head_dim_qk 64",
    "single_prefill_with_kv_cache": "--s_qo 9 --s_kv 20 --num_qo_heads 4 --num_kv_heads 1 "
    "--head_dim_qk 64 --causal --q_dtype float16",
    "BatchDecodeWithPagedKVCacheWrapper": "--batch_size 3 --s_kv 37 --page_size 8 "
    "--num_qo_heads 4 --num_kv_heads 4 --head_dim_qk 64 --random_actual_seq_len",
    "BatchPrefillWithPagedKVCacheWrapper": "--batch_size 2 --s_qo 5 --s_kv 19 --page_size 4 "
    "--num_qo_heads 4 --num_kv_heads 2 --head_dim_qk 64 --causal",
}


@pytest.mark.parametrize("routine", fb.ROUTINES)
def test_each_routine_runs_and_matches_reference(routine, capsys):
    argv = ["--routine", routine, *SMALL[routine].split(), "--refcheck", "--num_iters", "2"]
    assert fb.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    perf = [x for x in lines if x.startswith("[PERF]")]
    assert len(perf) == 1 and PERF.fullmatch(perf[0])
    assert len([x for x in lines if x.startswith("[REFCHECK]") and ": PASSED against" in x]) == 1


def test_mxfp4_mm_fp4_matches_reference(capsys):
    argv = "--routine mm_fp4 --m 8 --n 64 --k 256 --use_128x4_sf_layout --refcheck --num_iters 1"
    assert fb.main(argv.split()) == 0
    assert "[REFCHECK] cudnn: PASSED against dequantize-then-matmul" in capsys.readouterr().out


def test_each_backend_gets_its_own_perf_line(capsys):
    argv = "--routine bmm_fp8 --m 8 --n 16 --k 32 --backends cudnn cublas cutlass --num_iters 1"
    assert fb.main(argv.split()) == 0
    perf = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[PERF]")]
    assert [PERF.fullmatch(x).group(1) for x in perf] == ["cudnn", "cublas", "cutlass"]


def test_refcheck_failure_exits_1_unless_mismatch_allowed(monkeypatch, capsys):
    real = fb.setup_bmm_fp8

    def broken(args, device):
        case = real(args, device)
        good = case.call
        case.call = lambda backend: good(backend) * 1.5
        return case

    monkeypatch.setitem(fb.SETUP, "bmm_fp8", broken)
    argv = "--routine bmm_fp8 --m 8 --n 16 --k 32 --refcheck --num_iters 1".split()
    assert fb.main(argv) == 1
    out = capsys.readouterr().out
    assert "[REFCHECK] cublas: FAILED" in out
    assert "[ERROR] Output tensor mismatch between backend cublas and the reference" in out
    assert fb.main(argv + ["--allow_output_mismatch"]) == 0


def test_unknown_backend_is_rejected_with_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        fb.main("--routine mm_fp4 --backends cublas".split())
    assert e.value.code == 2
    assert "--backends: 'cublas' is not a backend of mm_fp4" in capsys.readouterr().err


def test_unknown_dtype_is_rejected_with_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        fb.main("--routine single_decode_with_kv_cache --q_dtype int4".split())
    assert e.value.code == 2
    assert "--q_dtype: 'int4' is not a dtype" in capsys.readouterr().err


def test_flags_the_routine_does_not_use_are_reported(capsys):
    argv = "--routine bmm_fp8 --m 8 --n 16 --k 32 --page_size 4 --causal --num_iters 1"
    assert fb.main(argv.split()) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "Ignored" in x)
    assert line.endswith("--causal (not used by bmm_fp8); --page_size (not used by bmm_fp8)")


def test_output_path_appends_csv_rows(tmp_path, capsys):
    path = tmp_path / "results.csv"
    argv = f"--routine mm_fp8 --m 4 --n 16 --k 128 --num_iters 1 --output_path {path}"
    assert fb.main(argv.split() + ["--case_tag", "t1"]) == 0
    assert fb.main(argv.split() + ["--case_tag", "t2", "--refcheck"]) == 0
    rows = list(csv.DictReader(open(path)))
    assert [(r["routine"], r["case_tag"], r["refcheck"]) for r in rows] == [
        ("mm_fp8", "t1", "skipped"),
        ("mm_fp8", "t2", "passed"),
    ]


@pytest.mark.parametrize("layout", [SfLayout.layout_128x4, SfLayout.layout_8x4])
def test_reference_scale_unswizzle_matches_linear_quantization(layout):
    x = torch.randn(40, 512, dtype=torch.bfloat16)
    g = torch.tensor(100.0)
    _, linear = flashinfer.fp4_quantize(x, g, 16, False, False)
    _, swizzled = flashinfer.fp4_quantize(x, g, 16, False, True, layout == SfLayout.layout_8x4)
    index = fb.scale_index(40, 32, layout)
    assert torch.equal(swizzled.reshape(-1)[index], linear.reshape(40, 32))
