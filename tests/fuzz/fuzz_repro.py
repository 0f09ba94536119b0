"""fuzz_repro.py: coverage-guided fuzzing (atheris) of the ``repro`` exporter.

An input is a dump tree in the archive format of ``fuzz_dumptree.py``. Every dump in it
is exported the way ``flashinfer repro`` exports it (``repro.reproducer``: the script's
text, nothing written), with ``replay_helpers`` allowed besides ``flashinfer``.

What counts as a failure (besides a crash under the sanitizers):
- any exception other than ``OSError``, ``ValueError`` (``ReplayRefused`` is one) or
  ``LookupError`` (an API the installed package lacks), each a message naming the dump;
- a script that does not parse, or that holds a name that is not allowed: every import
  must be of an allowed module and name a registered ``@flashinfer_api`` or an enum class
  there (or a helper of the runtime module copied next to the script), every other name must be one the exporter's own templates use (learned from
  clean exports at start-up), a dtype of torch, or a registered method or enum member of
  what was imported;
- any side effect the dump-tree target forbids (an import, a process, code execution, a
  file written), except ``compile``: the exporter compiles the script it writes.

Run by ``make fuzz``; ``python tests/fuzz/fuzz_repro.py FILE...`` replays inputs.
"""

import ast
import enum
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import fuzz_dumptree as tree  # noqa: E402

ALLOW = ["replay_helpers"]
EXPECTED = (OSError, ValueError, LookupError)
STDLIB = {"argparse", "sys", "torch"}
DTYPES = {str(d).rpartition(".")[2] for d in vars(torch).values() if isinstance(d, torch.dtype)}


class BadScript(BaseException):
    """The exporter wrote a script with a name that is not allowed."""


def identifiers(node):
    """Every name a script binds, reads or imports (keyword argument names are not names:
    they bind nothing)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.alias):
            out.update(filter(None, [n.name, n.asname]))
        elif isinstance(n, ast.FunctionDef):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def _allowed_import(module, name, patterns):
    """The object ``from module import name`` binds, when it is a registered API or an
    enum class (or an API class) of an allowed module; else None."""
    from flashinfer_native import registry

    if not registry.module_allowed(module, patterns) or module not in sys.modules:
        return None
    obj = registry.home_of(module, name)[0]
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return obj
    if isinstance(obj, type):  # an API class: one with a registered method
        members = (v for klass in obj.__mro__ for v in vars(klass).values())
        return obj if any(registry._registered_in_chain(v, patterns) for v in members) else None
    return obj if registry._registered_in_chain(obj, patterns) else None


def _member_allowed(obj, attr, patterns):
    """``obj.attr`` is an enum member or a registered method of an imported class."""
    from flashinfer_native import registry

    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return attr in obj.__members__
    if isinstance(obj, type):
        raw, _ = registry._static_class_attr(obj, attr)
        return raw is not None and registry._registered_in_chain(raw, patterns)
    return False


def _runtime_helper(node, alias):
    """``from repro_runtime import NAME`` of a helper the runtime module exports (the
    exporter's fixed module, copied next to the script)."""
    from flashinfer_native.repro import RUNTIME_HELPERS, RUNTIME_MODULE

    return (
        node.module == RUNTIME_MODULE
        and node.level == 0
        and alias.asname is None
        and alias.name in RUNTIME_HELPERS
    )


def check_script(source, vocabulary, patterns):
    """Raise BadScript naming the first name of ``source`` that is not allowed."""
    try:
        script = ast.parse(source)
    except SyntaxError as exc:
        raise BadScript(f"the script does not parse: {exc}") from None
    imported = {}
    for node in ast.walk(script):
        if isinstance(node, ast.Import):
            for alias in node.names:
                from flashinfer_native import registry

                if alias.name not in STDLIB and not (
                    registry.module_allowed(alias.name, patterns) and alias.name in sys.modules
                ):
                    raise BadScript(f"import of module {alias.name!r}")
                imported[alias.asname or alias.name] = sys.modules.get(alias.name)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _runtime_helper(node, alias):
                    imported[alias.name] = alias.name
                    continue
                obj = _allowed_import(node.module, alias.name, patterns)
                if obj is None:
                    raise BadScript(f"from {node.module} import {alias.name}")
                imported[alias.asname or alias.name] = obj
    wrapper_classes = [o for o in imported.values() if isinstance(o, type)]
    for node in ast.walk(script):
        if isinstance(node, ast.Name) and node.id not in vocabulary and node.id not in imported:
            raise BadScript(f"name {node.id!r}")
        if not isinstance(node, ast.Attribute) or node.attr in vocabulary:
            continue
        base = node.value.id if isinstance(node.value, ast.Name) else None
        if base == "torch" and node.attr in DTYPES:
            continue
        if base in imported and _member_allowed(imported[base], node.attr, patterns):
            continue
        if base == "wrapper" and any(
            _member_allowed(c, node.attr, patterns) for c in wrapper_classes
        ):
            continue
        if base in imported and isinstance(imported[base], type(sys)):
            if _allowed_import(imported[base].__name__, node.attr, patterns) is not None:
                continue
        raise BadScript(f"attribute {node.attr!r} of {ast.unparse(node.value)!r}")


def learn_vocabulary(scratch):
    """The names of the exporter's templates: identifiers of scripts exported from a clean
    session of every kind of call (plain, enum/dtype/device arguments, tuple and dict
    results, a raised exception, a crashed call, a wrapper's chain)."""
    import replay_helpers as h

    from flashinfer_native.repro import reproducer

    writer = h.DumpWriter(os.path.join(scratch, "vocabulary"))
    writer.call(
        h.reduce_rows, torch.ones(2, 3), h.Reduction.MAX, torch.float64, torch.device("cpu")
    )
    writer.call(h.split_halves, torch.arange(4.0))
    writer.call(h.summarize, torch.ones(2, 2))
    writer.call(h.concat, [torch.ones(2), torch.zeros(1)])
    try:
        writer.call(h.check_positive, -torch.ones(2))
    except ValueError:
        pass
    writer.crash(h.scale_add, torch.ones(2), torch.ones(2))
    wrapper = writer.construct(h.SegmentSumWrapper, torch.zeros(4))
    writer.method(wrapper, "plan", torch.tensor([0, 1, 3]), 2.0)
    writer.method(wrapper, "run", torch.ones(3, 2), return_lse=True)
    names = set()
    for path in writer.dirs:
        names |= identifiers(ast.parse(reproducer(path, allow_modules=ALLOW)[2]))
    imported = {"h", "replay_helpers", "reduce_rows", "split_halves", "summarize", "concat"}
    return names - imported - {"check_positive", "scale_add", "SegmentSumWrapper", "Reduction"}


def export_tree(root, vocabulary, patterns):
    """Export every dump of the tree and check each script."""
    from flashinfer_native import dumpdir
    from flashinfer_native.repro import reproducer

    for path in dumpdir.find_dump_dirs(root):
        try:
            source = reproducer(path, allow_modules=ALLOW)[2]
        except EXPECTED:
            continue
        check_script(source, vocabulary, patterns)


def test_one_input(data, root, vocabulary, patterns):
    tree.import_consumers()
    shutil.rmtree(root, ignore_errors=True)
    os.mkdir(root)
    tree.unpack(data, root)
    tree._Guard.armed = True
    tree._Guard.allowed = {"compile"}
    try:
        export_tree(root, vocabulary, patterns)
    finally:
        tree._Guard.armed = False
        tree._Guard.allowed = set()


def main():
    import atheris

    with atheris.instrument_imports(include=["flashinfer_native", "flashinfer"]):
        import flashinfer  # noqa: F401

        tree.import_consumers()
    from flashinfer_native import registry

    scratch = tempfile.mkdtemp(prefix="fuzz_repro_")
    root = os.path.join(scratch, "tree")
    vocabulary = learn_vocabulary(scratch)
    patterns = registry.allowed_patterns(ALLOW)
    sys.addaudithook(tree._Guard.hook)
    atheris.Setup(
        sys.argv,
        lambda data: test_one_input(data, root, vocabulary, patterns),
        custom_mutator=tree.custom_mutator,
    )
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
