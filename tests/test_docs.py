"""The manual holds to the code (docs/design.md#docs-that-cannot-rot).

Relative links and anchors resolve; the tables of environment variables in
docs/logging.md and docs/install.md list exactly the variables the code reads; every
command-line subcommand has a section naming its options, arguments and exit statuses;
the examples of README.md and docs/*.md run on the CPU. Each checker is a function over
a tree, and the tests at the end show that each one fails on a broken tree.
"""

import ast
import doctest
import glob
import os
import re
import subprocess
import sys
import textwrap

import click
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300


def manual_pages(root=REPO):
    """README.md and docs/*.md, relative to ``root``."""
    return ["README.md"] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md"))
    )


# ------------------------------------------------------------------ markdown reading

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
_MARKER = re.compile(r"^\s*<!--\s*(file|not run)\s*:\s*(.*?)\s*-->\s*$")


class Block:
    """A fenced code block: its language, body, first line number and the marker comment
    (``file: NAME`` / ``not run: REASON``) on the line right above its fence."""

    def __init__(self, lang, body, line, marker):
        self.lang, self.body, self.line, self.marker = lang, body, line, marker


def split_markdown(text):
    """(prose lines as (number, line), fenced blocks) of a Markdown text."""
    prose, blocks = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        above = lines[i - 1] if i else ""
        marker = _MARKER.match(above)
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        blocks.append(Block(lang, "\n".join(body) + "\n", start + 1, marker and marker.groups()))
    return prose, blocks


def headings(text):
    """(line number, level, text) of every ATX heading outside code blocks."""
    out = []
    for number, line in split_markdown(text)[0]:
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            out.append((number, len(m.group(1)), m.group(2)))
    return out


def slug(heading):
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped,
    lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor of a page, duplicates numbered as GitHub numbers them."""
    seen, out = {}, set()
    for _, _, heading in headings(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# --------------------------------------------------------------------------- links

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)")
_CODE_SPAN = re.compile(r"(`+).+?\1")


def link_problems(root, pages):
    """Relative links of ``pages`` (paths under ``root``) whose file or #anchor is missing."""
    problems = []
    for page in pages:
        text = _read(os.path.join(root, page))
        for number, line in split_markdown(text)[0]:
            line = _CODE_SPAN.sub("", line)
            targets = _LINK.findall(line) + [m.group(1) for m in [_REF_LINK.match(line)] if m]
            for target in targets:
                problem = _link_problem(root, page, text, target)
                if problem:
                    problems.append(f"{page}:{number}: link ({target}): {problem}")
    return problems


def _link_problem(root, page, text, target):
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None  # http:, https:, mailto:
    path, _, anchor = target.partition("#")
    if path:
        full = os.path.normpath(os.path.join(root, os.path.dirname(page), path))
        if not os.path.exists(full):
            return f"{os.path.relpath(full, root)} does not exist"
        if not anchor:
            return None
        if not full.endswith(".md"):
            return f"an #anchor into {os.path.relpath(full, root)}, which is not Markdown"
        text, where = _read(full), os.path.relpath(full, root)
    else:
        where = page
    if anchor not in anchors(text):
        return f"no heading of {where} has the anchor #{anchor} (anchors: {sorted(anchors(text))})"
    return None


def citation_problems(root, files):
    """Code and comments may cite only documents of the repository: no ``SPEC x.y``, no
    tracker issue numbers, and every ``docs/PAGE.md#anchor`` they cite resolves."""
    spec = re.compile(r"\bSPEC\b|\bseeds?/0\d\d_|\b[Ii]ssue #\d+")
    cited = re.compile(r"\bdocs/([\w.-]+\.md)(#[\w-]+)?")
    problems = []
    for rel in files:
        for number, line in enumerate(_read(os.path.join(root, rel)).splitlines(), 1):
            if spec.search(line):
                problems.append(
                    f"{rel}:{number}: cites a document outside the repository "
                    f"({spec.search(line).group(0)!r}): cite the docs/ page that states it"
                )
            for page, anchor in cited.findall(line):
                problem = _link_problem(root, "docs/x", "", f"{page}{anchor}")
                if problem:
                    problems.append(f"{rel}:{number}: cites docs/{page}{anchor}: {problem}")
    return problems


def repository_sources(root=REPO):
    """Every tracked-looking source and text file of the tree (no virtualenvs, builds)."""
    skip = {".git", ".venv", ".venv-flashinfer", "build", "node_modules", "corpus", "regressions"}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if d not in skip and not d.endswith(".egg-info") and not d.startswith(".venv")
        ]
        if os.path.islink(dirpath):
            continue
        for name in filenames:
            if name.endswith((".c", ".h", ".cu", ".cuh", ".py", ".md", ".toml", ".pth")) or (
                name == "Makefile"
            ):
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    out.append(os.path.relpath(path, root))
    return sorted(out)


# ----------------------------------------------------------- environment variables

# What the package reads at run time, and what its build reads.
RUNTIME_SOURCES = ("csrc", "kernels", "flashinfer", "flashinfer_native", "native/*.pth")
BUILD_SOURCES = ("native/build_extensions.py", "native/setup.py", "setup.py")

_C_ENV_CALL = re.compile(r"\b(\w*env\w*)\s*\(\s*\"([A-Za-z_][A-Za-z0-9_]*)\"")
_C_GETENV = re.compile(r"\bgetenv\s*\(\s*([^\s)][^)]*)\)")
_C_FUNCTION = re.compile(r"^[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;]*$")


def _files(root, specs, exts):
    out = []
    for spec in specs:
        path = os.path.join(root, spec)
        if os.path.isdir(path):
            for dirpath, _, names in os.walk(path):
                out += [os.path.join(dirpath, n) for n in names if n.endswith(exts)]
        else:
            out += [p for p in glob.glob(path) if p.endswith(exts)]
    return sorted(out)


def _strip_c_comments(text):
    """C text with comments blanked (line numbers kept)."""

    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)


def c_env_reads(path, rel):
    """{variable: [where]} read in a C file by getenv or a helper named *env*; a getenv
    whose argument is not a literal must sit in such a helper (its callers pass literals)."""
    reads, problems = {}, []
    function = None
    for number, line in enumerate(_strip_c_comments(_read(path)).splitlines(), 1):
        m = _C_FUNCTION.match(line)
        if m:
            function = m.group(1)
        for _, name in _C_ENV_CALL.findall(line):
            reads.setdefault(name, []).append(f"{rel}:{number}")
        for arg in _C_GETENV.findall(line):
            if not arg.startswith('"') and "env" not in (function or "").lower():
                problems.append(
                    f"{rel}:{number}: getenv({arg}) names no variable: pass a literal, or read "
                    "it in a helper whose name holds 'env' and pass the helper literals"
                )
    return reads, problems


class _PyEnvReads(ast.NodeVisitor):
    """Variables a Python module reads or sets through os.environ / os.getenv."""

    def __init__(self, rel):
        self.rel, self.reads, self.problems, self.loop_values = rel, {}, [], {}

    @staticmethod
    def _is_environ(node):
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "environ"
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        )

    def _add(self, node, where):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        elif isinstance(node, ast.Name) and node.id in self.loop_values:
            names = self.loop_values[node.id]
        else:
            self.problems.append(
                f"{self.rel}:{where.lineno}: an environment variable whose name is not a "
                "literal (write the name out, or loop over a literal tuple of names)"
            )
            return
        for name in names:
            self.reads.setdefault(name, []).append(f"{self.rel}:{where.lineno}")

    def _loop(self, target, iterable):
        if isinstance(target, ast.Name) and isinstance(iterable, (ast.Tuple, ast.List)):
            values = [e.value for e in iterable.elts if isinstance(e, ast.Constant)]
            if len(values) == len(iterable.elts):
                self.loop_values[target.id] = values

    def visit_comprehension(self, node):
        self._loop(node.target, node.iter)
        self.generic_visit(node)

    def visit_For(self, node):
        self._loop(node.target, node.iter)
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute):
            if self._is_environ(f.value) and f.attr in ("get", "pop", "setdefault") and node.args:
                self._add(node.args[0], node)
            elif isinstance(f.value, ast.Name) and f.value.id == "os" and f.attr == "getenv":
                self._add(node.args[0], node)
            elif self._is_environ(f.value) and f.attr == "update":
                for kw in node.keywords:
                    if kw.arg:
                        self.reads.setdefault(kw.arg, []).append(f"{self.rel}:{node.lineno}")
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if self._is_environ(node.value):
            self._add(node.slice, node)
        self.generic_visit(node)

    def visit_Compare(self, node):
        if any(self._is_environ(c) for c in node.comparators) and all(
            isinstance(op, (ast.In, ast.NotIn)) for op in node.ops
        ):
            self._add(node.left, node)
        self.generic_visit(node)


def py_env_reads(source, rel):
    visitor = _PyEnvReads(rel)
    tree = ast.parse(source, rel)
    # loops first, so that a name bound by a loop is known wherever it is used
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            visitor._loop(node.target, node.iter)
    visitor.visit(tree)
    return visitor.reads, visitor.problems


def env_reads(root, specs):
    """({variable: [where]}, problems) over the C and Python files of ``specs``."""
    reads, problems = {}, []

    def merge(found, found_problems):
        for name, where in found.items():
            reads.setdefault(name, []).extend(where)
        problems.extend(found_problems)

    for path in _files(root, specs, (".c", ".h", ".cu", ".cuh")):
        merge(*c_env_reads(path, os.path.relpath(path, root)))
    for path in _files(root, specs, (".py", ".pth")):
        rel = os.path.relpath(path, root)
        source = _read(path)
        if path.endswith(".pth"):  # site's rule: only lines starting with import run
            source = "\n".join(
                line if line.startswith("import") else "" for line in source.splitlines()
            )
        merge(*py_env_reads(source, rel))
    return reads, problems


def env_table(root, page):
    """{variable: line} of the one table of ``page`` whose first header cell is
    ``variable``; every backticked name in a row's first cell counts."""
    path = os.path.join(root, page)
    if not os.path.exists(path):
        return None
    rows, tables, in_table = {}, 0, False
    for number, line in split_markdown(_read(path))[0]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if "|" in line else []
        if cells and cells[0] == "variable":
            tables += 1
            in_table = True
        elif in_table and cells:
            for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0]):
                rows[name] = number
        else:
            in_table = False
    return rows if tables == 1 else None


def env_problems(root, specs, page, what):
    """Variables ``specs`` read that ``page``'s table lacks, and rows nothing reads."""
    reads, problems = env_reads(root, specs)
    table = env_table(root, page)
    if table is None:
        return problems + [
            f"{page} must hold exactly one table whose first column is headed 'variable' "
            f"(the {what} environment variables)"
        ]
    for name in sorted(set(reads) - set(table)):
        problems.append(
            f"{name} is read by {', '.join(reads[name][:3])} but {page} has no row for it: "
            f"add | `{name}` | default | meaning | to its table of {what} variables"
        )
    for name in sorted(set(table) - set(reads)):
        problems.append(
            f"{page}:{table[name]} documents {name}, which nothing in "
            f"{', '.join(specs)} reads: drop the row (or fix the code that should read it)"
        )
    return problems


# ------------------------------------------------------------------- command line

_CLI_PREFIXES = (
    "flashinfer-native",
    "flashinfer",
    "python -m flashinfer",
    "python -m flashinfer_native",
)


def cli_commands():
    """[(name, click command)] of every command line the project ships: the core's
    group and the mirror's ``flashinfer`` command, with their subcommands."""
    from flashinfer.__main__ import cli as mirror
    from flashinfer_native.cli import cli as native

    found = {}

    def walk(group, path):
        for name, command in sorted(group.commands.items()):
            found.setdefault(" ".join(path + [name]), command)
            if isinstance(command, click.Group):
                walk(command, path + [name])

    walk(native, [])
    walk(mirror, [])
    return sorted(found.items()), [native, mirror]


def _sections(root, pages):
    """{command name: (page, heading line, section text)} for every heading that starts
    with a code span holding a usage line of the command line."""
    out = {}
    for page in pages:
        text = _read(os.path.join(root, page))
        lines = text.splitlines()
        hs = headings(text)
        for i, (number, level, heading) in enumerate(hs):
            m = re.match(r"^`([^`]+)`", heading)
            if not m:
                continue
            usage = m.group(1)
            for prefix in sorted(_CLI_PREFIXES, key=len, reverse=True):
                if usage.startswith(prefix + " "):
                    name = usage[len(prefix) + 1 :].split(" ")[0]
                    end = next((n for n, lv, _ in hs[i + 1 :] if lv <= level), len(lines) + 1)
                    out.setdefault(name, (page, number, "\n".join(lines[number - 1 : end - 1])))
                    break
    return out


def _mentions(text, token):
    return re.search(r"(?<![\w-])" + re.escape(token) + r"(?![\w-])", text) is not None


def cli_problems(root, pages, commands, groups):
    """Subcommands without a section, options and arguments their section does not name,
    sections and --help texts that do not state the exit statuses."""
    sections = _sections(root, pages)
    everything = "\n".join(_read(os.path.join(root, p)) for p in pages)
    problems = []
    for name, command in commands:
        if name not in sections:
            problems.append(
                f"the subcommand {name!r} has no section in {', '.join(pages)}: add a heading "
                f"'## `flashinfer {name} ...`' (its usage) to the page of its topic, naming its "
                "options, arguments and exit statuses"
            )
            continue
        page, number, text = sections[name]
        for param in command.params:
            if isinstance(param, click.Option):
                tokens = [o for o in param.opts + param.secondary_opts if o not in ("--help",)]
            else:
                tokens = [param.human_readable_name]
            for token in tokens:
                if not _mentions(text, token):
                    problems.append(
                        f"{page}:{number}: the section of {name!r} does not name its "
                        f"{'option' if isinstance(param, click.Option) else 'argument'} "
                        f"{token}: add it (what it does, its default)"
                    )
        if not re.search(r"Exit\s+status", text):
            problems.append(f"{page}:{number}: the section of {name!r} states no 'Exit status'")
        if not re.search(r"Exit\s+status", command.help or ""):
            problems.append(
                f"the --help of {name!r} (its docstring) states no 'Exit status': add it"
            )
    for group in groups:
        for param in group.params:
            for token in param.opts:
                if not _mentions(everything, token):
                    problems.append(
                        f"the command's own option {token} is named on no page of "
                        f"{', '.join(pages)}: add it (docs/install.md names --version and --help)"
                    )
    return problems


# ------------------------------------------------------------------------ examples

RUNNABLE = ("python", "sh", "pycon", "console")
SHOWN = ("text", "json", "c", "diff", "toml", "yaml")


def example_env():
    """The environment examples run in: no FLASHINFER_* of the caller, this Python first
    on PATH (``python``, ``flashinfer``), the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _run(cmd, cwd, env, stdin=None):
    try:
        return subprocess.run(
            cmd, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -1, "", f"timed out after {TIMEOUT_S} s")


_DOCTEST_DRIVER = textwrap.dedent(
    """
    import doctest, sys
    text = sys.stdin.read()
    test = doctest.DocTestParser().get_doctest(text, {}, sys.argv[1], sys.argv[1], 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    sys.exit(1 if runner.failures else 0)
    """
)


def _console_steps(body):
    """[(command, expected output)] of a console block: ``$ `` lines (continued by a
    trailing backslash) and the lines after them."""
    steps = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        command = lines[i][2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + "\n" + lines[i]
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        steps.append((command, "\n".join(expected).rstrip() + "\n" if expected else ""))
    return steps


def example_problems(root, page, workdir, env):
    """Runs the examples of ``page`` in order in ``workdir``; one message per failure."""
    _, blocks = split_markdown(_read(os.path.join(root, page)))
    for name in ("benchmarks", "examples"):
        link = os.path.join(workdir, name)
        if os.path.isdir(os.path.join(root, name)) and not os.path.lexists(link):
            os.symlink(os.path.join(root, name), link)
    problems = []
    for n, block in enumerate(blocks):
        where = f"{page}:{block.line}"
        kind, arg = block.marker or (None, None)
        if not block.lang:
            problems.append(
                f"{where}: a fenced block without a language: say ```text (or json, c, ...) "
                f"for something shown, or one of {', '.join(RUNNABLE)} for an example that runs"
            )
            continue
        if block.lang not in RUNNABLE + SHOWN:
            problems.append(f"{where}: unknown block language {block.lang!r}")
            continue
        if kind == "file":
            with open(os.path.join(workdir, arg), "w", encoding="utf-8") as f:
                f.write(block.body)
            continue
        if kind == "not run":
            if len(arg) < 10:
                problems.append(f"{where}: '<!-- not run: REASON -->' needs a reason")
            continue
        if block.lang in SHOWN:
            continue
        problems += _run_block(block, where, n, workdir, env)
    return problems


def _run_block(block, where, n, workdir, env):
    if block.lang == "python":
        script = os.path.join(workdir, f"_example_{n}.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(block.body)
        r = _run([sys.executable, script], workdir, env)
    elif block.lang == "sh":
        r = _run(["bash", "-e", "-c", block.body], workdir, env)
    elif block.lang == "pycon":
        r = _run([sys.executable, "-c", _DOCTEST_DRIVER, where], workdir, env, block.body)
    else:
        problems = []
        checker = doctest.OutputChecker()
        for command, expected in _console_steps(block.body):
            r = _run(["bash", "-c", command + " 2>&1"], workdir, env)
            got = r.stdout.rstrip() + "\n" if r.stdout.strip() else ""
            if not checker.check_output(expected, got, doctest.ELLIPSIS):
                problems.append(
                    f"{where}: `$ {command}` printed\n{got}where the page shows\n{expected}"
                )
        return problems
    if r.returncode != 0:
        return [
            f"{where}: the {block.lang} example exited {r.returncode}:\n"
            f"{(r.stdout + r.stderr)[-3000:]}"
        ]
    return []


# --------------------------------------------------------------------------- tests


def test_readme_is_a_front_door_of_at_most_200_lines():
    text = _read(os.path.join(REPO, "README.md"))
    assert len(text.splitlines()) <= 200, "README.md: keep it a front door; move text to docs/"
    # the set-up commands, the ones .ci/run and a newcomer run
    assert "make demo" in text and "make test" in text
    assert "make test" in _read(os.path.join(REPO, ".ci", "run"))


def test_every_relative_link_and_anchor_resolves():
    problems = link_problems(REPO, manual_pages() + ["native/README.md", "tests/fuzz/README.md"])
    assert not problems, "\n".join(problems)


def test_code_cites_only_documents_of_the_repository():
    files = [f for f in repository_sources() if f != "tests/test_docs.py"]
    problems = citation_problems(REPO, files)
    assert not problems, "\n".join(problems)


def test_every_runtime_environment_variable_is_in_the_logging_table():
    problems = env_problems(REPO, RUNTIME_SOURCES, "docs/logging.md", "run-time")
    assert not problems, "\n".join(problems)


def test_every_build_environment_variable_is_in_the_install_table():
    problems = env_problems(REPO, BUILD_SOURCES, "docs/install.md", "build-time")
    assert not problems, "\n".join(problems)


def test_every_cli_subcommand_and_option_is_documented():
    commands, groups = cli_commands()
    problems = cli_problems(REPO, manual_pages(), commands, groups)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", manual_pages())
def test_examples_of_the_page_run(page, tmp_path):
    problems = example_problems(REPO, page, str(tmp_path), example_env())
    assert not problems, "\n\n".join(problems)


# --------------------------------------- the checkers fail on a broken tree (meta-tests)


def _tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(tmp_path)


def test_link_check_fails_on_a_missing_file_a_missing_anchor_and_a_bad_citation(tmp_path):
    root = _tree(
        tmp_path,
        {
            "README.md": "See [a](docs/a.md#the-end), [b](docs/b.md) and [c](#nowhere).\n",
            "docs/a.md": "# A\n\n## The start\n\nBack to [the top](../README.md).\n",
            "csrc/x.c": "/* the rule of SPEC 4.3, stated in docs/a.md#the-start and docs/a.md#gone */\n",
        },
    )
    problems = link_problems(root, ["README.md", "docs/a.md"])
    assert any("#the-end" in p and "no heading of docs/a.md" in p for p in problems)
    assert any("docs/b.md does not exist" in p for p in problems)
    assert any("#nowhere" in p for p in problems)
    assert len(problems) == 3, problems
    cites = citation_problems(root, ["csrc/x.c"])
    assert len(cites) == 2 and "'SPEC'" in cites[0] and "#gone" in cites[1], cites


def test_slugs_follow_github():
    assert slug("`flashinfer dumps --dir DIR [--json]`") == "flashinfer-dumps---dir-dir---json"
    assert slug("Against FlashInfer's decorator") == "against-flashinfers-decorator"
    assert slug("Quick start 1: logging levels") == "quick-start-1-logging-levels"


def test_env_check_fails_on_an_undocumented_and_on_an_unread_variable(tmp_path):
    root = _tree(
        tmp_path,
        {
            "csrc/core/config.c": """\
                static const char *env_or_null(const char *name)
                {
                    const char *v = getenv(name);
                    return v;
                }
                void f(void) { env_or_null("FLASHINFER_FROM_C"); }
                /* getenv("FLASHINFER_IN_A_COMMENT") is not a read */
                """,
            "csrc/core/bad.c": "void g(const char *n) { getenv(n); }\n",
            "flashinfer/x.py": """\
                import os
                A = os.environ.get("FLASHINFER_FROM_PY")
                B = [v for v in ("RANK", "WORLD_SIZE") if v not in os.environ]
                """,
            "docs/logging.md": """\
                | variable | default | meaning |
                |---|---|---|
                | `FLASHINFER_FROM_C` | | read |
                | `RANK`, `WORLD_SIZE` | | read |
                | `FLASHINFER_GONE` | | no longer read |
                """,
        },
    )
    problems = env_problems(root, ("csrc", "flashinfer"), "docs/logging.md", "run-time")
    assert any(p.startswith("FLASHINFER_FROM_PY is read by flashinfer/x.py:2") for p in problems)
    assert any("documents FLASHINFER_GONE" in p for p in problems)
    assert any("csrc/core/bad.c:1: getenv(n) names no variable" in p for p in problems)
    assert len(problems) == 3, problems


def test_cli_check_fails_on_an_undocumented_subcommand_option_and_exit_status(tmp_path):
    @click.group()
    def group():
        """A group."""

    @group.command()
    @click.argument("dump_dir")
    @click.option("--shiny", is_flag=True)
    def polish(dump_dir, shiny):
        """Polish a dump.

        Exit status: 0.
        """

    @group.command()
    def forgotten():
        """Not in the docs."""

    root = _tree(
        tmp_path,
        {"docs/triage.md": "# Triage\n\n## `flashinfer polish DUMP_DIR`\n\nPolishes.\n"},
    )
    commands = sorted(group.commands.items())
    problems = cli_problems(root, ["docs/triage.md"], commands, [group])
    assert any("'forgotten' has no section" in p for p in problems)
    assert any("does not name its option --shiny" in p for p in problems)
    assert any("section of 'polish' states no 'Exit status'" in p for p in problems)
    assert len(problems) == 3, problems


def test_example_check_fails_on_examples_that_do_not_run_or_print_otherwise(tmp_path):
    root = _tree(
        tmp_path,
        {
            "docs/page.md": """\
                <!-- file: hello.py -->
                ```python
                print("hello")
                ```

                ```sh
                python hello.py | grep -q hello
                ```

                ```console
                $ python hello.py
                hello
                $ python hello.py
                goodbye
                ```

                ```pycon
                >>> 1 + 1
                3
                ```

                ```python
                raise SystemExit(3)
                ```

                <!-- not run: -->
                ```sh
                make test
                ```

                ```
                untagged
                ```
                """
        },
    )
    work = tmp_path / "work"
    work.mkdir()
    problems = example_problems(root, "docs/page.md", str(work), example_env())
    assert (work / "hello.py").read_text() == 'print("hello")\n'
    assert any(
        "`$ python hello.py` printed\nhello\nwhere the page shows\ngoodbye" in p for p in problems
    )
    assert any("pycon example exited 1" in p and "Expected:\n    3" in p for p in problems)
    assert any("python example exited 3" in p for p in problems)
    assert any("needs a reason" in p for p in problems)
    assert any("without a language" in p for p in problems)
    assert len(problems) == 5, problems
