"""A compact session, exported, replays under FlashInfer's own replay_sequence.

session.py runs under the real FlashInfer served by the core at level 10 with
``FLASHINFER_DUMP_LAYOUT=compact`` (manifests and a chunk pack, docs/dump-format.md#compact-layout);
``flashinfer dumps --export`` (the repository's .venv) turns it into FlashInfer's layout,
and ``flashinfer.api_logging.replay_sequence`` of flashinfer-python 0.7.2.post1, with the
core switched off, reads every call and reproduces the ones that run on a CPU.
"""

import glob
import json
import os
import subprocess

from conftest import run_json, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIRROR_PYTHON = os.environ.get("MIRROR_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))

REPLAY = """
import json, sys
from flashinfer.api_logging import replay_sequence
results = replay_sequence(sys.argv[1], device="cpu")
print(json.dumps([[r["metadata"]["function_name"], r.get("comparison_match"), "error" in r]
                  for r in results] + [replay_sequence.__module__]))
"""


def test_an_exported_compact_session_replays_under_flashinfers_replay_sequence(tmp_path):
    outcomes, _ = run_json(
        "session.py",
        tmp_path,
        native=True,
        level=10,
        extra_env={"FLASHINFER_DUMP_LAYOUT": "compact"},
    )
    assert outcomes["shuffle_matrix_a"] == "ok"
    dumps = tmp_path / "dumps"
    (shuffle,) = glob.glob(str(dumps / "*shuffle_matrix_a*"))
    assert sorted(os.listdir(shuffle)) == [
        "inputs.chunks.json",
        "metadata.jsonl",
        "outputs.chunks.json",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = ROOT
    out = tmp_path / "exported"
    proc = subprocess.run(
        [MIRROR_PYTHON, "-m", "flashinfer", "dumps", "--export", str(dumps), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = REPLAY.replace("sys.argv[1]", repr(str(out)))
    proc = run_python(code, tmp_path, native=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *results, replayed_by = json.loads(proc.stdout.splitlines()[-1])
    # FlashInfer's own replay, not the core's (the start-up hook may still be imported: it
    # only lends FlashInfer's api_logging load_tensors, docs/serving-flashinfer.md)
    assert replayed_by == "flashinfer.api_logging"
    by_name = {name: (match, error) for name, match, error in results}
    assert by_name["shuffle_matrix_a"] == (True, False)
    assert by_name["BatchMLAPagedAttentionWrapper.__init__"][1] is False
