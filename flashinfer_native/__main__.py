"""``python -m flashinfer_native``: the core's command line (replay, dumps, info)."""

from .cli import cli

if __name__ == "__main__":
    cli(prog_name="flashinfer_native")
