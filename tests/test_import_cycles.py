"""No import circles in the Python packages (docs/design.md#rules-the-tree-keeps).

Every ``import`` and ``from ... import`` of ``flashinfer_native`` and ``flashinfer``, at
module level or inside a function (an import that runs late is still a dependency), is
an edge of a graph of modules; a strongly connected component of more than one module
is a circle. ``from package import name`` depends on ``package.name`` when that is a
module, else on the package (whose ``__init__`` defines the name).

Exempt: functions of the fi_trace templates (``flashinfer/trace/templates/`` and
``standard_check``). Their source is exported as standalone text that flashinfer-bench
runs with ``exec`` (docs/fi-trace.md), so each imports what it calls, the APIs included,
and those imports are part of the text they export.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("flashinfer_native", "flashinfer")
EXTENSIONS = {"flashinfer_native._C", "flashinfer._kernels"}


def _snippet_function(module, name):
    return module.startswith("flashinfer.trace.templates.") or (module, name) == (
        "flashinfer.trace.template",
        "standard_check",
    )


def modules_of(root, packages):
    """{dotted module name: file} of every .py file of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _absolute(module, is_package, level, name):
    if not level:
        return name
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - level + 1]
    return ".".join(parts + ([name] if name else []))


def import_graph(root, packages, extensions=EXTENSIONS, exempt=_snippet_function):
    """{module: set of modules of ``packages`` it imports} over the source files."""
    modules = modules_of(root, packages)
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        skipped = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and exempt(module, fn.name):
                skipped.update(id(n) for n in ast.walk(fn))
        is_package = path.endswith("__init__.py")
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module)
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules or sub in extensions else base)
            else:
                continue
            for target in targets:
                if target in extensions:
                    continue
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def circles(graph):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph, component):
    members = set(component)
    return ", ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a] & members))


def test_the_python_packages_have_no_import_circles():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 40 and graph["flashinfer_native.replay"]
    assert [describe(graph, c) for c in circles(graph)] == []


def write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/utils.py": "def lib_dir():\n    from .gemm import _lib_dir\n    return _lib_dir()\n",
            "pkg/gemm.py": "from . import utils\n\ndef _lib_dir():\n    return ''\n",
            "pkg/leaf.py": "import pkg.utils\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"], extensions=set())
    assert circles(graph) == [["pkg.gemm", "pkg.utils"]]
    assert (
        describe(graph, ["pkg.gemm", "pkg.utils"]) == "pkg.gemm -> pkg.utils, pkg.utils -> pkg.gemm"
    )


def test_a_name_imported_from_a_package_depends_on_its_init(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from .api import run\n",
            "pkg/api.py": "from . import _ext\n\ndef run():\n    from pkg import helper\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"], extensions={"pkg._ext"})
    assert graph == {"pkg": {"pkg.api"}, "pkg.api": {"pkg"}}
    assert circles(graph) == [["pkg", "pkg.api"]]
