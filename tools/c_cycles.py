#!/usr/bin/env python3
"""c_cycles.py: finds dependency cycles between the C/CUDA translation units under the
given folders (default: csrc kernels), for `make lint`. Exits 1 when there is one.

Unit A depends on unit B when A names a function or variable that B defines with
external linkage and A does not define that name itself. Definitions are read at file
scope, after comments, strings, character literals and preprocessor lines are blanked:
a `{` after `name(...)` opens a function body; `static` (or a macro that expands to it),
`typedef` and an anonymous namespace make a definition internal. Headers define nothing
(static inline helpers there belong to no unit). Every strongly connected group of two
or more units is a cycle, however long.
"""

import os
import re
import sys

SOURCES = (".c", ".cu")
IDENT = re.compile(r"[A-Za-z_]\w*")
# a comment, a string or a character literal: blanked, keeping newlines
LEXEMES = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([^\n]*)", re.M)
# keywords and attributes that can follow a function's parameter list or precede its name
NOT_NAMES = {"__attribute__", "__launch_bounds__", "__declspec", "noexcept", "throw", "const"}


def strip(src):
    """Source with comments, literals and preprocessor lines blanked ('""' for strings)."""

    def blank(m):
        s = m.group(0)
        return '""' if s[0] == '"' else "\n" * s.count("\n") or " "

    return DIRECTIVE.sub("", LEXEMES.sub(blank, src))


def static_macros(src):
    """Object-like macros whose expansion says static (e.g. ALWAYS_INLINE)."""
    return {m.group(1) for m in DEFINE.finditer(src) if re.search(r"\bstatic\b", m.group(2))}


def function_name(decl):
    """The name a declaration ending in `name(...)` declares, else None."""
    decl = decl.rstrip()
    while decl.endswith(")"):
        depth, i = 0, len(decl) - 1
        for i in range(len(decl) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(decl[i], 0)
            if depth == 0:
                break
        m = re.search(r"([A-Za-z_]\w*)\s*$", decl[:i])
        if not m:
            return None
        if m.group(1) not in NOT_NAMES:
            return m.group(1)
        decl = decl[: m.start()].rstrip()
    m = re.search(r"\bconst\s*$", decl)
    return function_name(decl[: m.start()]) if m else None


def variable_name(decl):
    """The name a file-scope object definition `type name[...] = ...` defines, else None."""
    head = decl.split("=", 1)[0]
    if "(" in head or re.match(r"\s*(typedef|extern|struct|union|enum)\b", head):
        return None
    names = IDENT.findall(re.sub(r"\[[^\]]*\]", "", head))
    return names[-1] if len(names) >= 2 else None


def definitions(src):
    """(external, internal): the names src defines at file scope."""
    internal_words = {"static", "typedef"} | static_macros(src)
    text = strip(src)
    external, internal = set(), set()
    decl, i, anonymous = "", 0, []  # anonymous: namespace levels, True when unnamed
    while i < len(text):
        c = text[i]
        if c == "{":
            name = function_name(decl)
            words = set(IDENT.findall(decl))
            opener = re.match(r"\s*(namespace\b\s*(\w*)|extern\s*\"\")\s*$", decl)
            if opener:  # transparent scopes: their contents are at file scope
                anonymous.append(opener.group(1).startswith("namespace") and not opener.group(2))
                decl, i = "", i + 1
                continue
            end = matching_brace(text, i)
            if name and "=" not in decl:
                hidden = words & internal_words or any(anonymous)
                (internal if hidden else external).add(name)
                decl = ""
            else:  # struct/enum body or an initializer: part of the declaration
                decl += " {} "
            i = end + 1
            continue
        if c == "}" and anonymous:
            anonymous.pop()
            decl, i = "", i + 1
            continue
        if c == ";":
            name = None if function_name(decl) else variable_name(decl)  # not prototypes
            if name:
                hidden = set(IDENT.findall(decl)) & internal_words or any(anonymous)
                (internal if hidden else external).add(name)
            decl, i = "", i + 1
            continue
        decl += c
        i += 1
    return external, internal


def matching_brace(text, i):
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j
    return len(text) - 1


def units(dirs):
    found = {}
    for d in dirs:
        for root, _, files in os.walk(d):
            for f in sorted(files):
                if f.endswith(SOURCES):
                    path = os.path.join(root, f)
                    with open(path, errors="replace") as fh:
                        found[path] = fh.read()
    return found


def strongly_connected(graph):
    """Tarjan's algorithm: the groups of nodes that reach each other."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def main():
    dirs = sys.argv[1:] or ["csrc", "kernels"]
    files = units(dirs)
    owner, own = {}, {}
    for path, src in files.items():
        external, internal = definitions(src)
        own[path] = external | internal
        for name in external:
            owner.setdefault(name, path)
    uses = {}  # (user, owner) -> names
    for path, src in files.items():
        for name in set(IDENT.findall(strip(src))) - own[path]:
            if name in owner:
                uses.setdefault((path, owner[name]), []).append(name)
    graph = {p: {b for (a, b) in uses if a == p} for p in files}
    cycles = [g for g in strongly_connected(graph) if len(g) > 1]
    for group in cycles:
        print("cycle: " + ", ".join(os.path.relpath(p) for p in group) + " depend on each other")
        for a in group:
            for b in group:
                if (a, b) in uses:
                    names = ", ".join(sorted(uses[a, b]))
                    print(f"  {os.path.relpath(a)} uses {names} from {os.path.relpath(b)}")
    print(f"{len(cycles)} cycles among {len(files)} C units")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
