"""Untrusted text on a terminal or in a log line: the one escaping function (docs/security.md).

A dump's names, messages and directory names are the sender's text. Printed raw, a
newline would start a line of the sender's choosing (a forged ``Summary: 1 passed``)
and an escape sequence would drive the reader's terminal (OSC 52 sets the clipboard).
Every string from a dump that the command line prints goes through :func:`escape`.
"""

import json
import sys

__all__ = ["brief", "escape"]

# Longest text shown for one value; the rest is counted, not printed.
MAX_SHOWN = 2000


def _escaped(char):
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text, limit=MAX_SHOWN):
    """``str(text)`` safe to print on one line of a terminal.

    Every character that is not printable (``str.isprintable``: control characters,
    C1 controls, line and paragraph separators, bidirectional and other format
    characters, unassigned code points) becomes ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN``; so a newline inside a name never starts a new line. Text longer
    than ``limit`` characters is cut, saying how much was left out.
    """
    text = str(text)
    cut = len(text) - limit if limit is not None and len(text) > limit else 0
    if cut:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escaped(c) for c in text)
    return text + (f"... ({cut} more characters)" if cut else "")


def brief(value, width=80, as_json=False):
    """A value as short text for a one-line message: a tensor as ``tensor(shape)``,
    anything else as its ``repr`` (``as_json``: data read from a record as JSON text,
    keys sorted), cut to ``width`` characters (ending ``...``).

    Not escaped: print the result through :func:`escape` when it holds a dump's text.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        text = f"tensor{tuple(value.shape)}"
    elif as_json:
        text = json.dumps(value, sort_keys=True)
    else:
        text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
