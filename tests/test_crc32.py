"""CRC-32 paths (PCLMULQDQ folding, system zlib, slicing-by-8 tables) against zlib.crc32."""

import os
import subprocess
import sys
import zipfile
import zlib

import pytest

from flashinfer_native import _C

IMPLS = _C._crc32_impls()
DATA = bytes((i * 131 + (i >> 7) * 17) & 0xFF for i in range(1 << 16))


def test_the_tables_are_always_there():
    assert "table" in IMPLS


def test_the_cpus_fastest_path_is_the_default():
    """x86-64 with PCLMULQDQ (this machine, CI) folds; elsewhere zlib, then the tables."""
    with open("/proc/cpuinfo") as f:
        pclmul = " pclmulqdq " in f.read().replace("\n", " ")
    assert IMPLS[0] == ("pclmul" if pclmul else "zlib" if "zlib" in IMPLS else "table")


@pytest.mark.parametrize("impl", IMPLS)
def test_every_length_below_300_at_every_alignment_matches_zlib(impl):
    bad = [
        (start, n)
        for start in range(16)
        for n in range(300)
        if _C._crc32(DATA[start : start + n], 0, impl) != zlib.crc32(DATA[start : start + n])
    ]
    assert bad == []


@pytest.mark.parametrize("impl", IMPLS)
def test_large_misaligned_buffers_match_zlib(impl):
    big = os.urandom((8 << 20) + 77)
    view = memoryview(big)
    for start, stop in ((0, len(big)), (3, len(big)), (13, len(big) - 5), (64, 64 + (1 << 20))):
        assert _C._crc32(view[start:stop], 0, impl) == zlib.crc32(view[start:stop])


@pytest.mark.parametrize("impl", IMPLS)
def test_chained_updates_equal_one_pass(impl):
    cuts = [0, 1, 7, 64, 65, 200, 4096, 4099, 30000, len(DATA)]
    crc = 0
    for a, b in zip(cuts, cuts[1:]):
        crc = _C._crc32(DATA[a:b], crc, impl)
    assert crc == zlib.crc32(DATA)


@pytest.mark.parametrize("impl", IMPLS)
def test_continuing_a_foreign_value_matches_zlib(impl):
    assert _C._crc32(DATA, 0xDEADBEEF, impl) == zlib.crc32(DATA, 0xDEADBEEF)


def test_an_unknown_path_is_refused_by_name():
    with pytest.raises(ValueError, match="impl 'sse9' is not available"):
        _C._crc32(b"x", 0, "sse9")


@pytest.mark.parametrize("forced", ["table", "zlib", "pclmul"])
def test_flashinfer_crc32_forces_the_path_of_saved_files(tmp_path, forced):
    """FLASHINFER_CRC32 picks the path the writers use; zip's own check accepts each."""
    if forced not in IMPLS:
        pytest.skip(f"this CPU/system has no {forced} path")
    script = (
        "import sys, torch, flashinfer_native._C as C\n"
        "t = torch.arange(100003, dtype=torch.int32)[3:]\n"
        "C.save_tensors(sys.argv[1], {'a': t, 'b': t[::7]})\n"
        "print(C._crc32_impls()[0])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["FLASHINFER_CRC32"] = forced
    path = tmp_path / "x.pt"
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, check=True, capture_output=True
    )
    assert out.stdout.decode().strip() == forced
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None


def test_without_zlib_the_default_is_never_zlib():
    script = "import flashinfer_native._C as C; print(','.join(C._crc32_impls()))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env.update(FLASHINFER_NO_ZLIB_CRC="1", FLASHINFER_CRC32="zlib")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True)
    assert "zlib" not in out.stdout.decode().split(",")


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 64, 4095, 65536, 1 << 20, 3 * (1 << 20) + 5])
@pytest.mark.parametrize("start", [0, 0xCBF43926, 0xFFFFFFFF])
def test_a_zero_run_is_zlibs_crc_of_the_zeros(n, start):
    """The sparse tensor files' CRCs cover their holes this way, without reading zeros."""
    assert _C._crc32_zeros(start, n) == zlib.crc32(bytes(n), start)


def test_a_gigabyte_of_zeros_costs_no_gigabyte():
    """O(log n): the CRC of 2^40 zero bytes equals that of 2^10 runs of 2^30 zeros."""
    tera = _C._crc32_zeros(0x1234, 1 << 40)
    step = 0x1234
    for _ in range(1 << 10):
        step = _C._crc32_zeros(step, 1 << 30)
    assert tera == step
    assert step == zlib.crc32(bytes(1 << 20), _C._crc32_zeros(0x1234, (1 << 40) - (1 << 20)))


@pytest.mark.parametrize("split", [0, 1, 17, 4096, len(DATA)])
def test_combine_is_zlibs_crc_of_the_concatenation(split):
    a, b = DATA[:split], DATA[split:] + bytes(1000)
    assert _C._crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
