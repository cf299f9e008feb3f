"""The runner: build one side, compare, report.

    python -m bench.compare_menagerie --build-side torch --out DIR [--only bert gpt2] [--sample]
    python -m bench.compare_menagerie --build-side flax  --out DIR [--only ...] [--sample]
    python -m bench.compare_menagerie --compare --out DIR     # DIR/<pair>/results.json
    python -m bench.compare_menagerie --report --out DIR      # docs/compare-menagerie.md
    .nox/jax/bin/python -m bench.compare_menagerie --force --out DIR   # teacher forcing, in side b's virtualenv

Each ``--build-side`` runs in that side's virtualenv (``nox -s
compare-menagerie`` picks them: side a with the torch session's python, side b
with the jax session's); side a must be built first. ``--compare`` needs
TorchLens and NumPy only. ``--sample`` keeps the rows marked ``sample`` (four
small architectures: the nox session's quick run).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import time
from typing import Any

from bench.compare_menagerie.common import arch_dir, failure, read_json, write_json
from bench.compare_menagerie.pairs import DEFAULT_PAIR, PAIRS, FrameworkPair

REPO = pathlib.Path(__file__).resolve().parents[2]


def selected(pair: FrameworkPair, only: list[str] | None, sample: bool) -> list[Any]:
    archs = pair.architectures()
    if only:
        unknown = set(only) - {a.name for a in archs}
        if unknown:
            raise SystemExit(f"unknown architectures {sorted(unknown)}; known: {[a.name for a in archs]}")
        archs = [a for a in archs if a.name in only]
    if sample:
        archs = [a for a in archs if a.sample]
    return archs


def build_side(
    pair: FrameworkPair, side_name: str, out: pathlib.Path, archs: list[Any], record_run: bool = True
) -> int:
    """Build ``side_name`` of every architecture; one failure is recorded and the rest still run."""
    role, side = pair.side(side_name)
    build = side.build_function()
    log_path = out / pair.name / f"build-{side.name}.json"
    log = read_json(log_path) if log_path.exists() else {}
    begun = time.perf_counter()
    for arch in archs:
        folder = arch_dir(out, pair.name, arch.name)
        started = time.perf_counter()
        if role == "a":
            shutil.rmtree(folder, ignore_errors=True)  # side b's old variants must not outlive a new side a
            folder.mkdir(parents=True)
            try:
                record = build(arch, folder)
            except Exception as exc:  # noqa: BLE001 - the architecture's failure is a finding, the run goes on
                record = {"framework": side.name, **failure("build", exc)}
            write_json(folder / "a" / "meta.json", record)
        else:
            shutil.rmtree(folder / "b", ignore_errors=True)
            a_meta = folder / "a" / "meta.json"
            if not a_meta.exists() or read_json(a_meta).get("status") != "built":
                record = {"status": "skipped", "reason": f"side a ({pair.a.name}) was not built"}
            else:
                try:
                    record = build(arch, folder)
                except Exception as exc:  # noqa: BLE001
                    record = {"framework": side.name, **failure("build", exc)}
            write_json(folder / "b" / "summary.json", record)
        record["seconds"] = round(time.perf_counter() - started, 2)
        log[arch.name] = {k: v for k, v in record.items() if k not in ("modules", "traceback")}
        write_json(log_path, log)
        status = record.get("status")
        extra = record.get("error") or record.get("reason") or ""
        print(f"[{side.name}] {arch.name}: {status} {record['seconds']:.1f}s {extra}"[:300], flush=True)
    runs_path = out / pair.name / "runs.json"
    runs = read_json(runs_path) if runs_path.exists() else {}
    if record_run or side.name not in runs:  # an --only rebuild does not stand for a whole side's time
        runs[side.name] = {
            "seconds": round(time.perf_counter() - begun, 1),
            "architectures": len(archs),
            "python": sys.version.split()[0],
        }
        write_json(runs_path, runs)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare_menagerie",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pair", default=DEFAULT_PAIR, choices=sorted(PAIRS))
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--build-side", metavar="SIDE", help="build this side (torch or flax for hf-torch-flax)")
    action.add_argument("--compare", action="store_true", help="tl.compare every built pair: results.json")
    action.add_argument("--report", action="store_true", help="write the markdown report from results.json")
    action.add_argument(
        "--force", action="store_true", help="teacher forcing on every built variant (side b's virtualenv): forced.json"
    )
    parser.add_argument("--out", type=pathlib.Path, required=True, help="where the sides and results go")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these architectures")
    parser.add_argument("--sample", action="store_true", help="only the small CI sample (4 architectures)")
    parser.add_argument(
        "--doc", type=pathlib.Path, default=REPO / "docs" / "compare-menagerie.md", help="the report's path (--report)"
    )
    args = parser.parse_args(argv)
    pair = PAIRS[args.pair]
    archs = selected(pair, args.only, args.sample)
    if args.build_side:
        return build_side(pair, args.build_side, args.out, archs, record_run=not args.only)
    if args.compare:
        from bench.compare_menagerie.compare import compare_all

        return compare_all(pair, args.out, archs)
    if args.force:
        from bench.compare_menagerie.force import force_all

        return force_all(pair, args.out, archs)
    from bench.compare_menagerie.report import write_report

    return write_report(args.out, args.doc)


if __name__ == "__main__":
    sys.exit(main())
