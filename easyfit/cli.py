"""The ``easyfit`` command: ``easyfit demo``, ``easyfit info`` and ``easyfit check PATH``.

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
    check = commands.add_parser(
        "check",
        help="list every bad file or record of a data path, in one run",
        description="Runs fit's checks of each sample (readable, not empty, a whole image...) "
        "over every file or record of PATH, in parallel, and prints one line per problem and "
        "a count. Exits with status 1 when any is found.",
    )
    check.add_argument("path", metavar="PATH", help="what fit reads: a folder, a record file, s3://...")
    check.add_argument(
        "--workers", type=int, default=None, metavar="N", help="checker processes (default: half the cores)"
    )
    return parser


def _check(path: str, workers: int | None) -> int:
    """``easyfit check``: the problems, one a line, and a count; 1 when there are any."""
    from .data.find_bad import FIX, checked_sources

    count, unread = 0, []
    for checked in checked_sources(path, children=workers):
        if not checked.read:  # its one problem says why
            unread.append(checked.what)
        else:
            n = len(checked.problems)
            print(f"checked {checked.what}: {n or 'no'} problem{'' if n == 1 else 's'}", flush=True)
            count += n
        for problem in checked.problems:
            print(problem, flush=True)
    if unread:
        print(f"{', '.join(unread)}: not data fit can read; fix what is said above, then check again")
    if count:
        s = "" if count == 1 else "s"
        print(f"{count} bad file{s} or record{s} in {path}. {FIX}")
    elif not unread:
        print(f"{path}: every file and record passed fit's checks")
    return 1 if count or unread else 0


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
    if args.command == "check":
        if args.workers is not None and args.workers < 0:
            _parser().error(f"--workers {args.workers}: must be 0 or more")
        return _check(args.path, args.workers)
    from ._info import collect, report

    print(report(collect()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
