"""tools/c_cycles.py, the dependency-cycle check of `make lint`, on small C trees."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "c_cycles.py")


def run(*dirs):
    return subprocess.run(
        [sys.executable, TOOL, *map(str, dirs)], capture_output=True, text=True, cwd=ROOT
    )


def write(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_two_files_using_each_other_are_a_cycle(tmp_path):
    write(
        tmp_path,
        {
            "a.c": "int fa(void) { return fb(); }\n",
            "b.c": "int fb(void) { return 1; }\nint fb2(void) { return fa(); }\n",
        },
    )
    r = run(tmp_path)
    assert r.returncode == 1
    assert "a.c uses fb from" in r.stdout and "b.c uses fa from" in r.stdout
    assert "1 cycles among 2 C units" in r.stdout


def test_a_ring_of_three_files_is_one_cycle(tmp_path):
    write(
        tmp_path,
        {
            "x.c": "int fx(void) { return fy(); }\n",
            "y.c": "int fy(void) { return fz(); }\n",
            "z.cu": 'extern "C" int fz(void) { return fx(); }\n',
        },
    )
    r = run(tmp_path)
    assert r.returncode == 1 and "1 cycles among 3 C units" in r.stdout


def test_internal_names_and_declarations_are_not_dependencies(tmp_path):
    write(
        tmp_path,
        {
            "a.c": "#define HIDDEN static inline\n"
            "int fa(void) { return fb(); }\n"
            "static int helper(void) { return 1; }\n"
            "HIDDEN int quiet(void) { return 0; }\n",
            "b.c": "typedef void (*fn_ptr)(int a, int b,\n    int c);\n"
            "static int helper(void) { return 2; } /* fa() in a comment */\n"
            'static const char *s = "fa()";\n'
            "int fb(void) { return helper() + quiet(); }\n",
            "c.cu": "namespace {\n__device__ int fa(int x) { return x; }\n}\n"
            'extern "C" int fc(void) { return fb(); }\n',
        },
    )
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout
    assert "0 cycles among 3 C units" in r.stdout


def test_the_sources_have_no_cycles():
    r = run("csrc", "kernels")
    assert r.returncode == 0, r.stdout
