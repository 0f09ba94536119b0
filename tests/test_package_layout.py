"""What a wheel of this repository holds and the small helpers FlashInfer's tests import
from flashinfer.utils."""

import pathlib
import re

from flashinfer.utils import version_at_least

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_python_package_is_in_the_wheel():
    """setuptools packs only the packages listed: a subpackage left out works in the
    editable install and is missing from the wheel. flashinfer-c (pyproject.toml) ships
    the mirror, flashinfer-native (native/setup.py) the core (docs/install.md)."""
    table = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools]", 1)[1]
    packages = re.search(r"packages = \[(.*?)\]", table, re.S)[1]  # no tomllib on 3.10
    native = re.search(r"packages=\[(.*?)\]", (ROOT / "native" / "setup.py").read_text())[1]
    for listed, top in ((packages, "flashinfer"), (native, "flashinfer_native")):
        on_disk = {
            ".".join(init.parent.relative_to(ROOT).parts)
            for init in (ROOT / top).rglob("__init__.py")
        }
        assert on_disk == set(re.findall(r'"([\w.]+)"', listed)), top


def test_version_at_least_compares_as_pep_440():
    assert version_at_least("12.10", "12.9")  # not as strings
    assert not version_at_least("0.7.2", "0.7.2.post1")
    assert version_at_least("0.7.2.post1", "0.7.2")
    assert not version_at_least("2.13.0rc1", "2.13.0")
    assert version_at_least("9.14.0", "9.14")
