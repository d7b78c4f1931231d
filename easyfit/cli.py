"""The ``easyfit`` command: ``easyfit demo`` and ``easyfit info``.

Example:
    >>> from easyfit.cli import main
    >>> main(["info"])  # doctest: +ELLIPSIS
    easyfit           0.1.0
    python            ...
    backend           cpu
    ...
    0
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="easyfit",
        description="Keras-style training for Flax models, with NVIDIA DALI as the input pipeline.",
    )
    parser.add_argument("--version", action="version", version=f"easyfit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="train an MLP on the MNIST sample inside easyfit (no network needed)",
        description="Trains the MLP of the DALI + Flax MNIST tutorial (784-1024-1024-10) on "
        "6,000 MNIST images shipped with easyfit, read as PNG files and decoded by DALI, "
        "prints the validation accuracy on 1,000 others and saves the learning curves as "
        "learning_curves.png.",
    )
    demo.add_argument(
        "--out",
        default=".",
        metavar="DIR",
        help="folder for learning_curves.png (default: the current folder)",
    )
    demo.add_argument("--epochs", type=int, default=5, metavar="N", help="epochs (default 5)")
    commands.add_parser(
        "info",
        help="versions, backend and devices, and known bad combinations",
        description="Prints the versions of easyfit, JAX, Flax, Optax and DALI, JAX's backend "
        "and devices, and warns about combinations known not to work.",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``easyfit`` command line; returns the exit status.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        if args.epochs < 1:
            _parser().error(f"--epochs {args.epochs}: must be at least 1")
        run_demo(args.out, epochs=args.epochs)
        return 0
    from ._info import collect, report

    print(report(collect()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
