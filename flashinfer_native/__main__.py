"""``python -m flashinfer_native``: the core's command line (replay, dumps, info, repro, diff, report)."""

from .cli import cli

if __name__ == "__main__":
    cli(prog_name="flashinfer_native")
