"""make_seeds.py: regenerates the seed corpus in tests/fuzz/corpus from a real recording.

A child process records a small level-10 session (both tensor formats, enums, dtypes,
devices, nested lists/tuples/dicts, a stateful wrapper, a recorded exception, a crashed
call's inputs only); the seeds are its files, cut per fuzz target:
  pt/           .pt tensor files            pickle/   their data.pkl records
  safetensors/  .safetensors tensor files   json/     safetensors headers, metadata lines
  dumptree/     whole dump trees in the archive format of fuzz_dumptree.py
Usage: python tests/fuzz/make_seeds.py  (rewrites tests/fuzz/corpus)
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
CORPUS = os.path.join(HERE, "corpus")

SESSION = """
import torch, flashinfer
import replay_helpers as h

h.scale_add(torch.arange(6.0).reshape(2, 3).t(), torch.ones(3, 2), alpha=0.5)
h.reduce_rows(torch.ones(2, 3, dtype=torch.float16), h.Reduction.MAX, dtype=torch.float64,
              device=torch.device("cpu"))
h.concat([torch.zeros(2, dtype=torch.int8), torch.ones(3, dtype=torch.int8)], dim=0)
h.split_halves(torch.arange(4, dtype=torch.bfloat16))
h.summarize(torch.tensor([[True, False]]))
try:
    h.check_positive(-torch.ones(2))
except ValueError:
    pass
w = h.SegmentSumWrapper(torch.zeros(4, dtype=torch.uint8), "HND")
w.plan(torch.tensor([0, 1, 3]), 2.0)
w.run(torch.arange(6.0).reshape(3, 2), return_lse=True)
flashinfer.nvfp4_quantize(torch.ones(2, 16, dtype=torch.bfloat16), torch.tensor(1.0),
                          sfLayout=flashinfer.SfLayout.layout_linear)
h.fill_out(torch.ones(2).to(torch.float8_e4m3fn).float(), torch.empty(2))
"""


def record(root, safetensors):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(
        FLASHINFER_LOGLEVEL="10",
        FLASHINFER_LOGDEST=os.devnull,
        FLASHINFER_DUMP_DIR=root,
        FLASHINFER_DUMP_SAFETENSORS="1" if safetensors else "0",
        PYTHONPATH=os.pathsep.join([REPO, TESTS]),
    )
    subprocess.run([sys.executable, "-c", textwrap.dedent(SESSION)], env=env, check=True)


def save(target, data):
    """Store a seed under its content hash (stable names, no duplicates)."""
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def cut_tensor_file(path):
    data = read(path)
    if path.endswith(".pt"):
        save("pt", data)
        with zipfile.ZipFile(path) as z:
            save("pickle", z.read(next(n for n in z.namelist() if n.endswith("/data.pkl"))))
    else:
        save("safetensors", data)
        header_len = int.from_bytes(data[:8], "little")
        save("json", data[8 : 8 + header_len])


def archive(root, dumps):
    """The fuzz_dumptree.py archive of up to three dumps and their session.jsonl lines."""
    session = read(os.path.join(root, "session.jsonl")).splitlines(keepends=True)
    mine = [line for line in session if any(d.encode() in line for d in dumps)]
    parts = [b"@@ session.jsonl\n" + b"".join(mine)]
    for letter, dump in zip("abc", dumps):
        for name in sorted(os.listdir(os.path.join(root, dump))):
            parts.append(f"@@ {letter}/{name}\n".encode() + read(os.path.join(root, dump, name)))
    return b"\n".join(parts)


def cut_session(root):
    dumps = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for dump in dumps:
        for name in os.listdir(os.path.join(root, dump)):
            path = os.path.join(root, dump, name)
            if name.endswith((".pt", ".safetensors")):
                cut_tensor_file(path)
            else:
                for line in read(path).splitlines():
                    save("json", line)
        save("dumptree", archive(root, [dump]))
    # The wrapper's __init__, plan and run together, sharing one object.
    wrapper = [d for d in dumps if "SegmentSumWrapper" in d]
    save("dumptree", archive(root, wrapper))


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        for safetensors in (False, True):
            root = os.path.join(tmp, f"dumps{int(safetensors)}")
            record(root, safetensors)
            cut_session(root)
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        print(f"{target}: {len(files)} seeds, {size} bytes")


if __name__ == "__main__":
    main()
