"""The Python steps of tools/gpu_check.sh: CUDA-graph and ring checks, short benchmarks,
and the summary.

Each subcommand is one step of the check. It prints what it did, writes its figures (or
its findings) as JSON to the path given by ``--json``, and exits 0 when its check passed,
1 when it failed. ``summary`` reads the step table and the figures and prints the final
table. The steps that need a CUDA device are never started without one (the shell
script skips them); run by hand, they exit 1 with a message instead.

    python3 tools/gpu_check.py graph --json OUT.json
    python3 tools/gpu_check.py summary --steps STEPS.tsv --figures DIR --json SUMMARY.json
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# Each figure's target: (key in the step's JSON, comparison, target value, what it means).
# A figure without a target is reported as information.
TARGETS = {
    "attention": [
        ("bandwidth_vs_copy", ">=", 0.6, "decode attention bytes/s over a D2D copy's"),
        ("level1_share", "<=", 0.02, "level-1 cost as a share of the decode step"),
        ("level3_share", "<=", 0.05, "level-3 cost as a share of the decode step"),
        ("level5_ratio", "<=", 1.5, "level-5 step over the level-0 step"),
    ],
    "gemm": [
        ("bmm_fp8_vs_scaled_mm", ">=", 0.9, "bmm_fp8 cublas speed over torch._scaled_mm (worst)"),
        ("mm_fp8_vs_scaled_mm", ">=", 0.9, "mm_fp8 cublas speed over torch._scaled_mm (worst)"),
        (
            "mm_fp8_low_latency_vs_scaled_mm",
            None,
            None,
            "mm_fp8 on the prepared weight (own kernel)",
        ),
    ],
    "stats": [
        ("read_vs_copy", ">=", 0.5, "statistics kernel bytes/s over a D2D copy's (read+write)"),
    ],
    "level10": [
        ("ratio_vs_d2h_write", "<=", 1.5, "level-10 call over D2H copy plus file write"),
    ],
    "serving": [
        ("level5_ratio", "<=", 1.5, "level-5 step over level 0"),
        ("compact_level10_ratio", "<=", 2.0, "compact level-10 step over level 0"),
        ("ring_ratio", "<=", 2.0, "in-memory ring step over level 0"),
        (
            "compact_level10_copied_over_new",
            "<=",
            2.0,
            "compact level 10: bytes copied to the host per step over the new bytes",
        ),
        ("ring_copied_over_new", "<=", 2.0, "ring: bytes copied to the host over the new bytes"),
    ],
}


def fail(message):
    print(f"FAILED: {message}")
    return 1


def need_cuda():
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this step needs one", file=sys.stderr)
        sys.exit(1)
    return torch


def write_json(path, data):
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)


def child_env(**env):
    """The environment of a child process: no FLASHINFER_* of ours, the repo importable."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    out["PYTHONPATH"] = REPO + os.pathsep + out.get("PYTHONPATH", "")
    out.update({k: str(v) for k, v in env.items()})
    return out


def run_child(code, timeout=120, **env):
    """Run ``code`` in a fresh interpreter (api_logging reads its variables at import)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- CUDA graphs: level 5 and level 10 inside torch.cuda.graph, three replays ---------

GRAPH_CHILD = r"""
import os, torch
import flashinfer
q = torch.randn(32, 128, device="cuda", dtype=torch.float16)
k = torch.randn(512, 8, 128, device="cuda", dtype=torch.float16)
v = torch.randn(512, 8, 128, device="cuda", dtype=torch.float16)
flashinfer.single_decode_with_kv_cache(q, k, v)  # warm-up, outside the graph
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = flashinfer.single_decode_with_kv_cache(q, k, v)
expected = []
for i in range(3):
    q.copy_(torch.randn_like(q))
    g.replay()
    torch.cuda.synchronize()
    expected.append((q.cpu().clone(), out.cpu().clone()))
torch.save(expected, os.environ["EXPECTED"])
print("graph replays done")
"""


def step_graph(args):
    torch = need_cuda()
    findings, ok = {}, True
    with tempfile.TemporaryDirectory() as tmp:
        # level 5: the statistics of a captured call are printed by the device at replay
        log5 = os.path.join(tmp, "log5.txt")
        r = run_child(
            GRAPH_CHILD,
            FLASHINFER_LOGLEVEL=5,
            FLASHINFER_LOGDEST=log5,
            EXPECTED=os.path.join(tmp, "e5.pt"),
        )
        text = open(log5).read() if os.path.exists(log5) else ""
        deferred = text.count("[stats deferred to GPU kernel: id=")
        printed = r.stdout.count("[flashinfer stats] id=")
        findings["level5"] = {
            "exit": r.returncode,
            "deferred_markers": deferred,
            "device_printf_lines": printed,
        }
        print(f"level 5: exit {r.returncode}, {deferred} deferred markers, {printed} printf lines")
        if r.returncode != 0 or deferred == 0 or printed < 3 * deferred:
            ok = False
            print(r.stdout[-2000:], r.stderr[-3000:])
        # level 10: each replay leaves graph_flushes/flush_000N of the captured call
        dumps = os.path.join(tmp, "d10")
        r = run_child(
            GRAPH_CHILD,
            FLASHINFER_LOGLEVEL=10,
            FLASHINFER_LOGDEST=os.path.join(tmp, "log10.txt"),
            FLASHINFER_DUMP_DIR=dumps,
            EXPECTED=os.path.join(tmp, "e10.pt"),
        )
        findings["level10"] = {"exit": r.returncode}
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-3000:])
            return finish(args, findings, False)
        calls = sorted(glob.glob(os.path.join(dumps, "*single_decode*")))
        captured = calls[-1] if calls else None
        flushes = sorted(glob.glob(os.path.join(captured or tmp, "graph_flushes", "flush_*")))
        findings["level10"]["calls"] = len(calls)
        findings["level10"]["flushes"] = [os.path.basename(f) for f in flushes]
        expected = torch.load(os.path.join(tmp, "e10.pt"), weights_only=True)
        matched = 0
        for i, flush in enumerate(flushes[:3]):
            ins = torch.load(os.path.join(flush, "inputs.pt"), weights_only=True)
            outs = torch.load(os.path.join(flush, "outputs.pt"), weights_only=True)
            q_ok = torch.equal(ins["arg_0"], expected[i][0])
            o_ok = torch.equal(outs["result"], expected[i][1])
            matched += q_ok and o_ok
            print(f"{os.path.basename(flush)}: inputs {q_ok}, outputs {o_ok}")
        findings["level10"]["flushes_matching_replays"] = matched
        if len(flushes) == 4:  # the exit-time flush snapshots the last replay once more
            last = [
                torch.load(os.path.join(flushes[i], "outputs.pt"), weights_only=True)
                for i in (2, 3)
            ]
            findings["level10"]["exit_flush_repeats_last"] = torch.equal(
                last[0]["result"], last[1]["result"]
            )
        lines = [json.loads(x) for x in open(os.path.join(captured, "metadata.jsonl"))]
        findings["level10"]["metadata_statuses"] = [x.get("execution_status") for x in lines]
        print("level 10:", findings["level10"])
        ok = ok and matched == 3
        ok = ok and (len(flushes) == 3 or findings["level10"].get("exit_flush_repeats_last"))
        # the flushed snapshot replays like any dump
        ok = replay(dumps, findings["level10"]) and ok
    return finish(args, findings, ok)


def replay(dumps, findings):
    """Replays a dump directory in a child; its exit status and summary line go to findings."""
    r = subprocess.run(
        [sys.executable, "-m", "flashinfer", "replay", "--dir", dumps],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings["replay_exit"] = r.returncode
    findings["replay_summary"] = (r.stdout.strip().splitlines() or [""])[-1]
    print(r.stdout[-3000:], r.stderr[-2000:] if r.returncode else "")
    return r.returncode == 0


def finish(args, data, ok):
    data["passed"] = bool(ok)
    write_json(args.json, data)
    return 0 if ok else 1


# --- the in-memory ring with a NaN trigger on CUDA tensors ----------------------------

RING_CHILD = r"""
import torch
import flashinfer

torch.manual_seed(0)
k = torch.randn(256, 2, 64, device="cuda", dtype=torch.float16)
v = torch.randn(256, 2, 64, device="cuda", dtype=torch.float16)
q = torch.randn(8, 64, device="cuda", dtype=torch.float16)
for i in range(12):
    flashinfer.single_decode_with_kv_cache(q * (i + 1), k, v)
bad = v.clone()
bad[7, 1, 5] = float("nan")  # the trigger: the heads of KV head 1 give a NaN output
flashinfer.single_decode_with_kv_cache(q, k, bad)
for i in range(3):
    flashinfer.single_decode_with_kv_cache(q, k, v)
torch.cuda.synchronize()
print("ring calls done")
"""


def call_tensors(call_dir, stem):
    """A call's inputs or outputs in whichever layout the ring wrote (docs/dump-format.md)."""
    from flashinfer_native import dumpdir

    path = dumpdir.tensor_file(call_dir, stem, {})
    if path is None:
        raise FileNotFoundError(f"{call_dir}: no {stem} tensor file")
    return dumpdir.load_tensor_file(path)


def step_ring(args):
    torch = need_cuda()
    findings = {}
    with tempfile.TemporaryDirectory() as tmp:
        dumps = os.path.join(tmp, "ring")
        r = run_child(
            RING_CHILD,
            FLASHINFER_LOGLEVEL=10,
            FLASHINFER_LOGDEST=os.path.join(tmp, "log.txt"),
            FLASHINFER_DUMP_DIR=dumps,
            FLASHINFER_DUMP_RING=8,
            FLASHINFER_DUMP_ON="nan",
        )
        findings["exit"] = r.returncode
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-3000:])
            return finish(args, findings, False)
        # the calls' directories (the compact layout keeps its chunk store beside them)
        calls = sorted(glob.glob(os.path.join(dumps, "*", "metadata.jsonl")))
        session = [json.loads(x) for x in open(os.path.join(dumps, "session.jsonl"))]
        triggers = [x for x in session if x.get("record_type") == "trigger"]
        findings["calls_written"] = len(calls)
        findings["triggers"] = [x.get("trigger") for x in triggers]
        ok = len(calls) == 8 and findings["triggers"] == ["nan"]
        if triggers:
            trigger_dir = os.path.join(dumps, os.path.basename(str(triggers[0].get("dump_dir"))))
            v = call_tensors(trigger_dir, "inputs")["arg_2"]
            out = call_tensors(trigger_dir, "outputs")["result"]
            findings["trigger_call"] = os.path.basename(trigger_dir)
            findings["recorded_from"] = json.loads(
                open(os.path.join(trigger_dir, "metadata.jsonl")).readline()
            )["tensor_details"]["arg_0"]["device"]
            # the triggering call: its NaN value element and the NaN heads of its output
            nan_where = torch.isnan(v).nonzero().tolist()
            nan_heads = torch.isnan(out).any(dim=1).nonzero().flatten().tolist()
            findings["nan_in_v"], findings["nan_output_heads"] = nan_where, nan_heads
            ok = ok and nan_where == [[7, 1, 5]] and nan_heads == [4, 5, 6, 7]
            ok = ok and findings["recorded_from"] == "cuda:0"
        print("ring:", findings)
        ok = replay(dumps, findings) and ok
    return finish(args, findings, ok)


# --- benchmarks ------------------------------------------------------------------------


def step_bench_stats(args):
    need_cuda()
    return run_bench("bench_gpu_stats.py", "--json", args.json)


LEVEL10_CHILD = r"""
import os, sys, time, torch
from flashinfer.api_logging import flashinfer_api
@flashinfer_api
def add(a, b):
    return torch.add(a, b)
n = 16 << 20  # 64 MB of float32 each
a = torch.randn(n, device="cuda"); b = torch.randn(n, device="cuda")
add(a, b); torch.cuda.synchronize()
times = []
for _ in range(5):
    torch.cuda.synchronize(); t = time.perf_counter(); add(a, b); torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
print(min(times))
"""


def step_bench_level10(args):
    torch = need_cuda()
    with tempfile.TemporaryDirectory() as tmp:
        level = {}
        for lv in (0, 10):
            r = run_child(
                LEVEL10_CHILD,
                timeout=300,
                FLASHINFER_LOGLEVEL=lv,
                FLASHINFER_LOGDEST=os.devnull,
                FLASHINFER_DUMP_DIR=os.path.join(tmp, f"d{lv}"),
            )
            if r.returncode != 0:
                print(r.stderr[-3000:])
                return finish(args, {"error": f"level {lv} child failed"}, False)
            level[lv] = float(r.stdout.strip().splitlines()[-1])
        # the same bytes by hand: a, b and the result copied to the host and written out
        n = 16 << 20
        tensors = [torch.randn(n, device="cuda") for _ in range(3)]
        best = None
        for i in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for j, x in enumerate(tensors):
                host = x.cpu()
                with open(os.path.join(tmp, f"raw_{i}_{j}.bin"), "wb") as f:
                    f.write(host.numpy().tobytes())
            elapsed = time.perf_counter() - t
            best = elapsed if best is None else min(best, elapsed)
        cost = level[10] - level[0]
        data = {
            "level0_s": level[0],
            "level10_s": level[10],
            "d2h_write_s": best,
            "ratio_vs_d2h_write": cost / best,
        }
        print(
            f"level 10, 2 x 64 MB CUDA in + 64 MB out: {level[10] * 1e3:.1f} ms "
            f"(level 0 {level[0] * 1e3:.2f} ms); D2H + write {best * 1e3:.1f} ms; "
            f"ratio {cost / best:.2f}"
        )
    write_json(args.json, data)
    return 0


def run_bench(script, *argv):
    """Runs benchmarks/<script> with argv in a child and prints what it printed."""
    r = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", script), *argv],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    print(r.stdout, r.stderr[-3000:])
    return r.returncode


def step_bench_attention(args):
    need_cuda()
    return run_bench("bench_gpu_attention.py", "--json", args.json)


def step_bench_gemm(args):
    torch = need_cuda()
    rc = run_bench(
        "bench_gpu_gemm.py",
        "--short",
        "--warmup",
        "3",
        "--iters",
        "10",
        "--json",
        args.json + ".rows",
    )
    if rc != 0:
        return rc
    rows = json.load(open(args.json + ".rows"))["rows"]
    os.unlink(args.json + ".rows")

    def worst(op, key):
        vals = [row[key] for row in rows if row.get("op") == op and row.get(key)]
        return min(vals) if vals else None

    data = {
        "device": torch.cuda.get_device_name(),
        "rows": rows,
        "bmm_fp8_vs_scaled_mm": worst("bmm_fp8", "cublas_speed_vs_torch"),
        "mm_fp8_vs_scaled_mm": worst("mm_fp8", "cublas_speed_vs_torch"),
        "mm_fp8_low_latency_vs_scaled_mm": worst("mm_fp8", "speed_vs_torch"),
    }
    write_json(args.json, data)
    return 0


# --- the summary -------------------------------------------------------------------------


def compare(value, op, target):
    if value is None:
        return "no figure"
    if op is None:
        return "info"
    return "met" if (value >= target if op == ">=" else value <= target) else "NOT MET"


def serving_ratios(data):
    """bench_serving.py's medians per step as the ratios TARGETS holds (mode over level 0)."""
    modes = (data.get("results") or {}).get("this tree") or {}

    def median(mode):
        times = sorted((modes.get(mode) or {}).get("times") or [])
        return times[len(times) // 2] if times else None

    base = median("level0")
    ratios = {}
    for key, mode in (
        ("level5_ratio", "level5"),
        ("compact_level10_ratio", "level10-compact"),
        ("ring_ratio", "ring-memory"),
    ):
        t = median(mode)
        if base and t is not None:
            ratios[key] = t / base
    # the device path's copies to the host per step, over the step's new bytes
    for key, mode in (
        ("compact_level10_copied_over_new", "level10-compact"),
        ("ring_copied_over_new", "ring-memory"),
    ):
        m = modes.get(mode) or {}
        if m.get("new_bytes") and "device_copied_bytes" in m:
            ratios[key] = m["device_copied_bytes"] / m["new_bytes"]
    return ratios


def step_summary(args):
    steps = []
    with open(args.steps) as f:
        for line in f:
            name, status, seconds, note = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
            steps.append(
                {"step": name, "status": status, "seconds": float(seconds or 0), "note": note}
            )
    figures = {}
    for path in sorted(glob.glob(os.path.join(args.figures, "*.json"))):
        name = os.path.basename(path)[:-5]
        try:
            figures[name] = json.load(open(path))
        except (OSError, ValueError) as e:
            figures[name] = {"error": f"unreadable: {e}"}
    if isinstance(figures.get("serving"), dict):
        figures["serving"].update(serving_ratios(figures["serving"]))
    targets = []
    for name, rules in TARGETS.items():
        for key, op, target, meaning in rules:
            value = figures.get(name, {}).get(key)
            targets.append(
                {
                    "step": name,
                    "figure": key,
                    "value": value,
                    "target": f"{op} {target}" if op else "-",
                    "verdict": compare(value, op, target),
                    "meaning": meaning,
                }
            )
    summary = {
        "machine": args.machine,
        "steps": steps,
        "figures": figures,
        "targets": targets,
        "failed": [s["step"] for s in steps if s["status"] not in ("passed", "skipped")],
        "skipped": [s["step"] for s in steps if s["status"] == "skipped"],
    }
    write_json(args.json, summary)
    print("")
    print(f"== gpu_check on {args.machine}")
    for s in steps:
        print(f"{s['step']:<22} {s['status']:<8} {s['seconds']:7.1f} s  {s['note']}")
    shown = [t for t in targets if t["verdict"] != "no figure" or t["step"] in figures]
    if shown:
        print(f"{'figure':<34} {'value':>10}  target    verdict")
        for t in shown:
            v = t["value"]
            text = f"{v:10.3f}" if isinstance(v, (int, float)) else f"{'-':>10}"
            print(f"{t['step'] + '.' + t['figure']:<34} {text}  {t['target']:<9} {t['verdict']}")
    print(
        f"steps: {sum(s['status'] == 'passed' for s in steps)} passed, "
        f"{len(summary['failed'])} failed, {len(summary['skipped'])} skipped"
    )
    return 1 if summary["failed"] else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    for name in ("graph", "ring", "bench-stats", "bench-level10", "bench-attention", "bench-gemm"):
        s = sub.add_parser(name)
        s.add_argument("--json", help="write the step's findings or figures here")
    s = sub.add_parser("summary")
    s.add_argument("--steps", required=True, help="the step table (name, status, seconds, note)")
    s.add_argument("--figures", required=True, help="the folder of the steps' JSON files")
    s.add_argument("--machine", default="", help="the machine, in words")
    s.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    return {
        "graph": step_graph,
        "ring": step_ring,
        "bench-stats": step_bench_stats,
        "bench-level10": step_bench_level10,
        "bench-attention": step_bench_attention,
        "bench-gemm": step_bench_gemm,
        "summary": step_summary,
    }[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
