"""flashinfer_native._C.json_dumps writes exactly what json.dumps writes."""

import json
import math
import os
import random
import struct
import subprocess
import sys

import pytest

from flashinfer_native import _C

TRICKY = [
    "plain",
    'quote " backslash \\ slash /',
    '"escapes at both ends\\',
    "\n\r\t\b\f\x00\x01\x1f\x7f",
    "caf\u00e9 \u2028 \uffff",
    "astral \U0001f600 \U0010ffff",
    "lone \ud800 surrogate \udfff",
    float("nan"),
    float("inf"),
    -float("inf"),
    -0.0,
    0.0,
    1e16,
    1e15,
    0.1,
    1 / 3,
    5e-324,
    1.7976931348623157e308,
    1e-7,
    123456789.0,
    2**64,
    -(2**100),
    0,
    -1,
    True,
    False,
    None,
    [],
    {},
    (),
    [1, (2, 3), {"a": [None, {"b": ()}]}],
    {"k": {2: 2, 1.5: 3, True: 4, None: 5, float("nan"): 6, "\u00e9": 7}},
]


@pytest.mark.parametrize("value", TRICKY, ids=[repr(v)[:30] for v in TRICKY])
def test_json_dumps_matches_python_json(value):
    assert _C.json_dumps(value) == json.dumps(value)


def test_strings_escape_every_special_byte_at_every_place_in_a_word():
    # the writer takes plain ASCII eight bytes at a time: each byte that needs an escape
    # (and the printable ones around the limits) at each offset of strings 1..19 long
    for special in ['"', "\\", "\x00", "\x1f", " ", "~", "\x7f", "!", "[", "]", "\u00e9"]:
        for n in range(1, 20):
            for at in range(n):
                s = "a" * at + special + "b" * (n - at - 1)
                assert _C.json_dumps(s) == json.dumps(s), (special, n, at)
                assert _C.json_dumps({s: s}) == json.dumps({s: s}), (special, n, at)


def test_json_dumps_int_and_float_subclasses_use_base_repr():
    class MyInt(int):
        def __repr__(self):
            return "nope"

    class MyFloat(float):
        def __repr__(self):
            return "nope"

    value = [MyInt(7), MyFloat(2.5)]
    assert _C.json_dumps(value) == json.dumps(value) == "[7, 2.5]"


def test_json_dumps_rejects_unknown_type():
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        _C.json_dumps({"a": {1, 2}})


def test_json_dumps_rejects_bad_key():
    with pytest.raises(TypeError, match="keys must be str, int, float, bool or None, not tuple"):
        _C.json_dumps({(1, 2): 3})


def test_json_dumps_deep_nesting_raises_recursion_error():
    value = []
    for _ in range(100000):
        value = [value]
    with pytest.raises(RecursionError):
        _C.json_dumps(value)


def test_json_loads_round_trips_tricky_strings():
    for s in TRICKY[:6]:
        assert _C.json_loads(json.dumps(s)) == s


@pytest.mark.parametrize(
    "text", ['{"a": 1', "[1, 2,]", '"abc', "01", "nul", "[1] x", '{"a" 1}', '"\\q"', "-"]
)
def test_json_loads_rejects_malformed_text(text):
    with pytest.raises(ValueError, match="invalid JSON at byte"):
        _C.json_loads(text)


def test_json_loads_rejects_nesting_deeper_than_64():
    with pytest.raises(ValueError, match="nesting deeper than 64"):
        _C.json_loads("[" * 65 + "]" * 65)


def float_cases():
    """Random bit patterns (every exponent, subnormals), random decimals of every size,
    float32 values, and the edges: powers of 2 and 10 and their neighbours (where the
    gap below a double is half the gap above), the smallest and largest doubles, and
    the points where repr switches to scientific notation."""
    rng = random.Random(2018)
    bits = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(100000)]
    f32 = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(30000)]
    decimals = [rng.random() * 10 ** rng.randint(-30, 30) for _ in range(30000)]
    edges = [2.0**e for e in range(-1074, 1024)] + [10.0**e for e in range(-323, 309)]
    edges += [math.nextafter(v, d) for v in edges for d in (0.0, math.inf)]
    edges += [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 9999999999999998.0]
    edges += [1e16, 1e15, 1e-05, 0.0001, 0.1, 0.2, 0.3, 2.0**53 + 2, 0.0, -0.0]
    values = bits + f32 + decimals + edges + [-v for v in edges]
    return [v for v in values if math.isfinite(v)] + [math.inf, -math.inf, math.nan]


def test_floats_are_written_with_pythons_shortest_repr():
    # the C writer's own shortest round-trip digits (float_repr.c), never Python's dtoa
    values = float_cases()
    ours = _C.json_dumps(values)[1:-1].split(", ")
    theirs = json.dumps(values)[1:-1].split(", ")
    assert len(ours) == len(values)
    assert [(v, a) for v, a, b in zip(values, ours, theirs) if a != b] == []


def test_the_power_of_5_table_is_what_its_generator_writes():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, os.path.join(root, "tools", "gen_float_repr_table.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with open(os.path.join(root, "csrc", "tensorfile", "float_repr_table.h")) as f:
        assert f.read() == out
