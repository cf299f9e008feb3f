"""The ``torchlens`` command, on traces ``tl.save`` wrote (also ``python -m torchlens``).

    torchlens summary saved/              # the module table, as trace.summary() prints it
    torchlens audit saved/                # replay and the invariant checks; exit 1 if one fails
    torchlens compare a/ b/               # align b with a op by op; exit 1 if they diverge
    torchlens view saved/ -o trace.html   # the interactive viewer (docs/viewer.md)

Loading needs no framework (values load as NumPy); ``audit`` replays, which
needs the trace's framework installed (without it, the checks that need none
run, and the command says what is missing, exit 2). Exit codes: 0 done and
passed, 1 a check failed or the traces diverge, 2 the command could not be
done (a folder that is not a trace, a framework missing).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import webbrowser

from torchlens_core.ir.errors import TorchLensError

PASSED, FAILED, NOT_DONE = 0, 1, 2


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="TorchLens on saved traces (the folders tl.save writes).")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="print the trace's module table")
    summary.add_argument("trace", help="the folder tl.save wrote")
    summary.add_argument("--depth", type=int, default=1, help="levels of modules shown (default 1; 0: all)")
    audit = commands.add_parser("audit", help="replay the trace and check its invariants (exit 1 if one fails)")
    audit.add_argument("trace", help="the folder tl.save wrote")
    audit.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance of replay parity")
    compare = commands.add_parser("compare", help="align two traces op by op and report the first divergence")
    compare.add_argument("a", help="the reference trace's folder")
    compare.add_argument("b", help="the folder of the trace compared with it")
    compare.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: per dtype)")
    compare.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: per dtype)")
    viewer = commands.add_parser("view", help="write the interactive viewer (one HTML file) of a saved trace")
    viewer.add_argument("trace", help="the folder tl.save wrote")
    viewer.add_argument("-o", "--output", help="the HTML file to write (default: the folder's name + .html)")
    viewer.add_argument("--open", action="store_true", help="open the file in a browser")
    viewer.add_argument("--no-values", action="store_true", help="leave the value pictures out (a smaller file)")
    viewer.add_argument(
        "--max-nodes",
        type=int,
        default=None,
        help="leave out layouts with more nodes than this (Graphviz is slow on huge graphs)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "torchlens") -> int:
    """Run one command; returns the exit code (0 passed, 1 failed or diverged, 2 not done)."""
    args = _parser(prog).parse_args(argv)
    try:
        return _run(args)
    except TorchLensError as error:
        print(f"{prog} {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return NOT_DONE


def _run(args: argparse.Namespace) -> int:
    from torchlens_core.store.saving import load

    if args.command == "summary":
        print(load(args.trace).summary(depth=args.depth or None))
        return PASSED
    if args.command == "audit":
        report = load(args.trace).audit(rtol=args.rtol)
        print(report)
        return PASSED if report else FAILED
    if args.command == "compare":
        from torchlens_core.compare.report import compare

        comparison = compare(load(args.a), load(args.b), rtol=args.rtol, atol=args.atol)
        print(comparison)
        return FAILED if comparison.first_divergence is not None else PASSED
    return _view(args)


def _view(args: argparse.Namespace) -> int:
    from torchlens_core.store.saving import load
    from torchlens_core.viewer import view
    from torchlens_core.viewer.layouts import MAX_LAYOUT_NODES

    folder = pathlib.Path(args.trace)
    output = pathlib.Path(args.output) if args.output else folder.resolve().parent / f"{folder.resolve().name}.html"
    path = view(load(folder), output, values=not args.no_values, max_nodes=args.max_nodes or MAX_LAYOUT_NODES)
    print(path)
    if args.open:
        webbrowser.open(pathlib.Path(path).resolve().as_uri())
    return PASSED
