"""``--force``: teacher forcing on every built variant, run in side b's virtualenv; forced.json.

``tl.compare(a, b, teacher_forcing=True)`` runs each of side b's aligned groups
again on side a's values, with side b's framework. It must never stop a
comparison (a group that cannot run keeps ``pair.local`` None and a note), and
a located bug's first divergence should be ``introduced`` by its own group.
"""

from __future__ import annotations

import pathlib
import time
import traceback
from typing import Any

from bench.compare_menagerie.common import arch_dir, read_json, write_json
from bench.compare_menagerie.pairs import FrameworkPair


def force_all(pair: FrameworkPair, out: pathlib.Path, archs: list[Any]) -> int:
    import torchlens as tl

    found: dict[str, Any] = {}
    for arch in archs:
        folder = arch_dir(out, pair.name, arch.name)
        if not (folder / "a" / "trace").is_dir():
            continue
        a = tl.load(folder / "a" / "trace")
        for meta_path in sorted((folder / "b").glob("*/meta.json")):
            variant = meta_path.parent.name
            if not (meta_path.parent / "trace").is_dir():
                continue
            row: dict[str, Any] = {"status": read_json(meta_path).get("status")}
            started = time.perf_counter()
            try:
                cmp = tl.compare(a, tl.load(meta_path.parent / "trace"), teacher_forcing=True)
            except Exception as exc:  # noqa: BLE001 - a comparison that raises is the finding
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}", traceback=traceback.format_exc()[-2000:])
            else:
                first = cmp.first_divergence
                row.update(
                    pairs=len(cmp.pairs),
                    forced=sum(p.local is not None for p in cmp.pairs),
                    not_forced=[p.note for p in cmp.pairs if "could not force" in p.note][:3],
                    first=None if first is None else {"a": first.a, "b": first.b, "origin": first.origin},
                    roots=len(cmp.roots),
                )
            row["seconds"] = round(time.perf_counter() - started, 2)
            found[f"{arch.name}/{variant}"] = row
            print(
                f"{arch.name}/{variant}: {row.get('error') or row.get('first')} "
                f"forced {row.get('forced')}/{row.get('pairs')} [{row['seconds']}s]",
                flush=True,
            )
    path = out / pair.name / "forced.json"
    write_json(path, found)
    print(f"-> {path}")
    return 0


def summary(forced: dict[str, Any], results: dict[str, Any]) -> str:
    """One paragraph for the report: runs, errors, pairs forced, and the origin of each located bug."""
    runs = len(forced)
    errors = [name for name, row in forced.items() if "error" in row]
    pairs = sum(row.get("pairs", 0) for row in forced.values())
    done = sum(row.get("forced", 0) for row in forced.values())
    located = [
        f"{arch}/{variant}"
        for arch, entry in results["architectures"].items()
        for variant, row in entry["variants"].items()
        if (row.get("located") or {}).get("outcome", "").startswith("located")
    ]
    introduced = [
        name for name in located if ((forced.get(name) or {}).get("first") or {}).get("origin") == "introduced"
    ]
    text = (
        f"Teacher forcing (`tl.compare(a, b, teacher_forcing=True)`, run where side b's framework is "
        f"installed, `--force`): {runs} comparisons, {len(errors)} raised"
        + (f" ({', '.join(errors[:5])})" if errors else "")
        + f"; {done} of {pairs} pairs forced; the first "
        f"divergence of {len(introduced)} of {len(located)} located bugs is `introduced` by its own group"
    )
    shape = [name for name in located if name not in introduced]
    return text + (
        f" (the others, {', '.join(shape[:6])}, have no value to force: a shape divergence)." if shape else "."
    )
