"""``python -m flashinfer_native`` (and ``flashinfer-native``): the core's command line.

``run`` (a script with native logging switched on), ``replay``, ``dumps``, ``info``,
``repro``, ``diff``, ``report``. The core serves an installed FlashInfer first, so that
a replay resolves FlashInfer's APIs through the core's own decorator.
"""

from .hook import enable


def main():
    """Entry point: serve FlashInfer with the core, then run the click group (messages
    name the program as it was run: ``flashinfer-native``, ``python -m flashinfer_native``)."""
    enable()
    from .cli import cli

    cli()


if __name__ == "__main__":
    main()
