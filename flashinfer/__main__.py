"""``flashinfer`` command line (``python -m flashinfer``): the core's click group."""

from flashinfer_native.cli import cli

__all__ = ["cli"]

if __name__ == "__main__":
    cli()
