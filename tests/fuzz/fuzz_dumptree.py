"""fuzz_dumptree.py: coverage-guided fuzzing (atheris) of everything that reads a dump tree.

One input is a small archive of a dump tree: parts introduced by a line ``@@ NAME``,
where NAME is ``session.jsonl`` (the root's) or ``D/FILE`` with D one of ``a b c`` (three
dump directories) and FILE one of ``metadata.jsonl``, ``inputs.pt``,
``inputs.safetensors``, ``outputs.pt``, ``outputs.safetensors``. The tree is written to
a scratch directory and read the way ``flashinfer dumps``, ``replay_from_dump(...,
run=False)``, ``flashinfer diff``, ``flashinfer report`` and ``flashinfer repro`` read it:
session summary, call order, every dump's records, tensors and arguments (enums and
all), tensor differences and statistics, the report's page and each reproducer's text
(nothing is written).

What counts as a failure (besides a crash under the sanitizers):
- any exception other than the documented ``OSError`` / ``ValueError`` (a readable
  message naming the problem), e.g. a ``TypeError`` from a field of the wrong type;
- any side effect a reader must never have, seen through a ``sys.addaudithook`` hook:
  importing a module, running a process, compiling or executing code, unpickling,
  writing or deleting a file.

Run by ``make fuzz``; ``python tests/fuzz/fuzz_dumptree.py FILE...`` replays inputs.
"""

import json
import os
import random
import shutil
import sys
import tempfile

import torch  # noqa: F401 - imported before the readers, and never instrumented

FILES = ("metadata.jsonl", "inputs.pt", "inputs.safetensors", "outputs.pt", "outputs.safetensors")
DUMPS = {d: f"20250101_000000_00{i}_pid1_api{d}_call0001" for i, d in enumerate("abc")}
EXPECTED = (OSError, ValueError)
# Audit events of things a reader must never do (https://docs.python.org/3/library/audit_events.html).
FORBIDDEN_EVENTS = (
    "compile",
    "exec",
    "marshal.loads",
    "pickle.find_class",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "subprocess.Popen",
    "ctypes.dlopen",
    "socket.connect",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "shutil.rmtree",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SideEffect(BaseException):
    """A reader did something a reader must never do (BaseException: no ``except
    Exception`` in the code under test can swallow it)."""


class _Guard:
    """The audit hook: armed only while the readers run."""

    armed = False
    allowed = set()  # events a consumer needs (the exporter compiles its script)

    @classmethod
    def hook(cls, event, args):
        if not cls.armed or event in cls.allowed:
            return
        if event in FORBIDDEN_EVENTS:
            cls.fail(f"{event} {args!r:.200}")
        if event == "import" and args[0] not in sys.modules:
            cls.fail(f"import of {args[0]!r}")
        if event == "open" and _opens_for_writing(args):
            cls.fail(f"open for writing {args!r:.200}")

    @classmethod
    def fail(cls, what):
        cls.armed = False
        raise SideEffect(f"a dump reader had a side effect: {what}")


def _opens_for_writing(args):
    _, mode, flags = args
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and flags & _WRITE_FLAGS != 0


def unpack(data, root):
    """Write the archive ``data`` as a dump tree under ``root`` (an empty directory)."""
    for part in (b"\n" + data).split(b"\n@@ ")[1:]:
        name, _, content = part.partition(b"\n")
        name = name.decode("ascii", "replace").strip()
        if name == "session.jsonl":
            path = os.path.join(root, name)
        else:
            dump, _, file = name.partition("/")
            if dump not in DUMPS or file not in FILES:
                continue
            os.makedirs(os.path.join(root, DUMPS[dump]), exist_ok=True)
            path = os.path.join(root, DUMPS[dump], file)
        with open(path, "ab") as f:
            f.write(content)


# Values a structural mutation may put anywhere in a record: every JSON type, the
# encodings replay decodes, and names a hostile dump would use.
_REPLACEMENTS = (
    None,
    True,
    0,
    -1,
    2**70,
    1.5e308,
    "",
    "os.system",
    "flashinfer.fp4_quantization.SfLayout",
    "torch.float8_e4m3fn",
    "arg_4095",
    [],
    {},
    {"type": "enum", "class": "flashinfer.SfLayout", "name": "SfLayout.layout_8x4", "value": 1},
    {"type": "torch.dtype", "value": "torch.bfloat16"},
    {"type": "torch.device", "value": "cuda:0"},
    {"type": "tuple", "length": 1, "items": [{"type": "torch.Tensor", "tensor_key": "arg_0"}]},
    {"type": "dict", "length": 1, "items": [{"key": 1, "value": [2]}]},
)


def _nodes(value, out):
    """Every (container, key) of a parsed JSON value, for structural mutation."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in list(items):
        out.append((value, key))
        if isinstance(child, (dict, list)):
            _nodes(child, out)
    return out


def mutate_record(line, rng):
    """A JSON record with one value replaced, one key dropped or one value moved."""
    record = json.loads(line)
    nodes = _nodes(record, []) if isinstance(record, (dict, list)) else []
    if not nodes:
        return line
    container, key = rng.choice(nodes)
    action = rng.randrange(3)
    if action == 0 and isinstance(container, dict):
        del container[key]
    elif action == 1:
        other, other_key = rng.choice(nodes)
        container[key] = json.loads(json.dumps(other[other_key]))
    else:
        container[key] = json.loads(json.dumps(rng.choice(_REPLACEMENTS)))
    return json.dumps(record).encode()


def custom_mutator(data, max_size, seed):
    """Half the time a structural mutation of one JSON line, else libFuzzer's own."""
    import atheris

    rng = random.Random(seed)
    lines = data.split(b"\n")
    candidates = [i for i, line in enumerate(lines) if line.startswith(b"{")]
    if candidates and rng.randrange(2):
        i = rng.choice(candidates)
        try:
            lines[i] = mutate_record(lines[i], rng)
        except ValueError:
            pass
        else:
            mutated = b"\n".join(lines)
            if len(mutated) <= max_size:
                return mutated
    return atheris.Mutate(data, max_size)


def read_tree(root):
    """What the consumers of an untrusted dump tree do: ``dumps`` (the session summary),
    replay's loading, ``diff`` (the tree against itself), ``report`` (the page, not
    written) and the ``repro`` exporter (the script, not written); only OSError /
    ValueError (and LookupError from the exporter) may escape."""
    from flashinfer_native import calls, diff, dumpdir, replay, report, repro

    try:
        calls.summarize_session(root)
    except EXPECTED:
        pass
    for path, _ in dumpdir.ordered_dumps(root):
        try:
            result = replay.replay_from_dump(path, compare_outputs=True, device="cpu")
        except EXPECTED:
            continue
        replay.classify(result)
    try:
        for _ in diff.diff_sessions(root, root)[1]:
            pass
    except EXPECTED:
        pass
    try:
        report.render_report(root)
    except EXPECTED:
        pass
    _Guard.allowed = {"compile"}
    try:
        for path in dumpdir.find_dump_dirs(root):
            try:
                repro.reproducer(path, allow_modules=["replay_helpers"])
            except EXPECTED + (LookupError,):
                pass
    finally:
        _Guard.allowed = set()


def scratch_root():
    """A fresh, empty scratch directory (on tmpfs when there is one)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="fuzz_dumptree_", dir=base)


def import_consumers():
    """Import what the consumers need before the guard is armed (already done, under
    instrumentation, when atheris runs the target)."""
    import _strptime  # noqa: F401 - datetime.strptime imports it on first use (report)

    import flashinfer_native.diff  # noqa: F401
    import flashinfer_native.report  # noqa: F401
    import flashinfer_native.repro  # noqa: F401

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import replay_helpers  # noqa: F401 - the module the exporter is told to allow


def test_one_input(data, root):
    """Unpack ``data`` into ``root`` and read it with the guard armed."""
    import_consumers()
    shutil.rmtree(root, ignore_errors=True)
    os.mkdir(root)
    unpack(data, root)
    _Guard.armed = True
    try:
        read_tree(root)
    finally:
        _Guard.armed = False
        _Guard.allowed = set()


def main():
    import atheris

    # flashinfer (whose enums dumps may name) imports the readers: both are instrumented.
    with atheris.instrument_imports(include=["flashinfer_native", "flashinfer"]):
        import flashinfer  # noqa: F401

        import_consumers()

    root = scratch_root()
    sys.addaudithook(_Guard.hook)
    atheris.Setup(sys.argv, lambda data: test_one_input(data, root), custom_mutator=custom_mutator)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
