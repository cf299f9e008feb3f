"""The command line: ``python -m torchlens view saved_trace/ -o trace.html [--open]``.

``view`` reads a folder ``tl.save`` wrote (no framework needed: values load as
NumPy) and writes the interactive viewer (docs/viewer.md).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import webbrowser

from torchlens_core.ir.errors import TorchLensError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchlens", description="TorchLens on saved traces.")
    commands = parser.add_subparsers(dest="command", required=True)
    viewer = commands.add_parser("view", help="write the interactive viewer (one HTML file) of a saved trace")
    viewer.add_argument("trace", help="the folder tl.save wrote")
    viewer.add_argument("-o", "--output", help="the HTML file to write (default: the folder's name + .html)")
    viewer.add_argument("--open", action="store_true", help="open the file in a browser")
    viewer.add_argument("--no-values", action="store_true", help="leave the value pictures out (a smaller file)")
    viewer.add_argument("--max-nodes", type=int, default=None,
                        help="leave out layouts with more nodes than this (Graphviz is slow on huge graphs)")
    args = parser.parse_args(argv)

    from torchlens_core.store.saving import load
    from torchlens_core.viewer import view
    from torchlens_core.viewer.layouts import MAX_LAYOUT_NODES

    folder = pathlib.Path(args.trace)
    output = pathlib.Path(args.output) if args.output else folder.resolve().parent / f"{folder.resolve().name}.html"
    try:
        trace = load(folder)
        path = view(trace, output, values=not args.no_values, max_nodes=args.max_nodes or MAX_LAYOUT_NODES)
    except TorchLensError as error:
        print(f"python -m torchlens view: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(path)
    if args.open:
        webbrowser.open(pathlib.Path(path).resolve().as_uri())
    return 0


if __name__ == "__main__":
    sys.exit(main())
