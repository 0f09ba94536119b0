"""Helpers for tests that switch FLASHINFER_LOGLEVEL inside one process."""

import importlib
import os
import re
import sys

TS_RE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]")
SEP = "=" * 80
DASH = "-" * 80


def reload_api_logging(monkeypatch, **env):
    """Re-execute flashinfer.api_logging with exactly the given FLASHINFER_* variables."""
    for key in list(os.environ):
        if key.startswith("FLASHINFER_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    sys.modules.pop("flashinfer.api_logging", None)
    return importlib.import_module("flashinfer.api_logging")


def restore_level_0():
    """Put back a level-0 api_logging so later tests see the default."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("FLASHINFER_")}
    sys.modules.pop("flashinfer.api_logging", None)
    importlib.import_module("flashinfer.api_logging")
    os.environ.update(saved)


def normalize(text):
    """Replace timestamps by [TS] so log text can be compared exactly."""
    return TS_RE.sub("[TS]", text)


def strip_header(text):
    """Drop the system-information header written once per import."""
    marker = "FlashInfer API Logging - System Information"
    if marker not in text:
        return text
    end = text.index(SEP + "\n\n", text.index(marker) + len(marker) + 82)
    return text[end + len(SEP) + 2 :]
