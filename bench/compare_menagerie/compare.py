"""``--compare``: load both sides' saved traces and run ``tl.compare`` on every built variant; results.json.

Runs where no framework is installed (``tl.load`` needs none). A bug is
*located* when the first divergence's b op lies in the module where the bug was
injected (paths normalized, :mod:`.paths`) and every pair before it agrees; the
sites come from the injection (side b's meta.json), never from TorchLens.
"""

from __future__ import annotations

import pathlib
import subprocess
import time
import traceback
from typing import Any

from bench.compare_menagerie.common import arch_dir, read_json, write_json
from bench.compare_menagerie.pairs import FrameworkPair
from bench.compare_menagerie.paths import tokens, within


def _module(trace: Any, label: str) -> str:
    """The innermost module an op ran in, without its pass number ("" for the root)."""
    modules = list(getattr(trace[label], "modules", None) or [])
    return str(modules[-1]).split(":")[0] if modules else ""


def _plain(value: Any) -> Any:
    """A JSON-able form of whatever ``coverage`` turns out to be (numbers, dicts, small records of numbers)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    fields = {k: getattr(value, k) for k in dir(value) if not k.startswith("_")}
    numbers = {k: v for k, v in fields.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return {**numbers, "repr": str(value)[:200]} if numbers else str(value)[:200]


def summarize(cmp: Any) -> dict[str, Any]:
    """Ops per side, pairs, unmatched, coverage (where the Comparison has it) and the first divergence."""
    first = cmp.first_divergence
    record: dict[str, Any] = {
        "ops_a": cmp.a.num_ops,
        "ops_b": cmp.b.num_ops,
        "pairs": len(cmp.pairs),
        "unmatched_a": len(cmp.unmatched_a),
        "unmatched_b": len(cmp.unmatched_b),
        "verdicts": {},
        "coverage": _plain(getattr(cmp, "coverage", None)),
    }
    for p in cmp.pairs:
        record["verdicts"][p.verdict] = record["verdicts"].get(p.verdict, 0) + 1
    if first is None:
        record["first_divergence"] = None
        return record
    index = next(i for i, p in enumerate(cmp.pairs) if p is first)
    record["first_divergence"] = {
        "a": first.a,
        "b": first.b,
        "module": first.module,
        "verdict": first.verdict,
        "max_abs": None if first.agreement is None else float(first.agreement.max_abs),
        "a_module": _module(cmp.a, first.a),
        "b_module": _module(cmp.b, first.b),
        "index": index,
        "before_all_agree": all(p.verdict == "agrees" for p in cmp.pairs[:index]),
        "before_verdicts": sorted({p.verdict for p in cmp.pairs[:index]}),
        "note": first.note or None,
        "b_has_modules": len(cmp.b.modules) > 1,
    }
    return record


# An exclusive site's own helper modules (Flax GPT-2's embedding dropout is `dropout` where torch's is `drop`):
# side b modules with no side a counterpart, found under the site, count as the site.
def _in_site(path: str, site: dict[str, Any], known: list[str]) -> bool:
    if not site.get("exclusive"):
        return within(path, site["b"])
    p, s = tokens(path), tokens(site["b"])
    if p[: len(s)] != s:
        return False
    return not any(len(k) > len(s) and p[: len(k)] == k for k in map(tokens, known))


def locate(record: dict[str, Any], injection: dict[str, Any]) -> dict[str, Any]:
    """Whether the first divergence is at the injected bug: ``located``, ``located at site k of n`` (a config-wide
    bug whose earlier sites stay within tolerance), or ``missed`` with where it landed instead."""
    sites = injection["sites"]
    first = record["first_divergence"]
    if not sites:
        return {"outcome": "no site", "why": "the injection found no site on side a (no such module ran)"}
    if first is None:
        return {"outcome": "missed", "landed": "no divergence reported"}
    known = injection.get("b_modules") or []
    hit = next((k for k, s in enumerate(sites) if _in_site(first["b_module"], s, known)), None)
    a_hit = next((k for k, s in enumerate(sites) if within(first["a_module"], s["a"])), None)
    landed = f"{first['b']} in {first['b_module'] or '(root)'} (a: {first['a']} in {first['a_module'] or '(root)'})"
    if hit is None and a_hit is not None and not first.get("b_has_modules", True):
        hit = a_hit  # side b recorded no module at all (Keras layers on torch and JAX): side a's module says where
    if hit is None or not first["before_all_agree"]:
        why = "earlier pairs do not all agree" if hit is not None else "outside the injected module"
        return {"outcome": "missed", "landed": landed, "why": why, "a_side_in_site": a_hit is not None}
    outcome = "located" if hit == 0 else f"located at site {hit + 1} of {len(sites)}"
    return {"outcome": outcome, "landed": landed, "a_side_in_site": a_hit is not None}


def compare_all(pair: FrameworkPair, out: pathlib.Path, archs: list[Any]) -> int:
    import torchlens as tl

    results: dict[str, Any] = {
        "pair": pair.name,
        "a": pair.a.label,
        "b": pair.b.label,
        "sides": f"{pair.a.name}/{pair.b.name}",
        "torchlens": provenance(),
        "architectures": {},
    }
    path = out / pair.name / "results.json"
    old = read_json(path)["architectures"] if path.exists() else {}
    for arch in archs:
        folder = arch_dir(out, pair.name, arch.name)
        entry: dict[str, Any] = {
            "a": _meta(folder / "a" / "meta.json"),
            "b": _meta(folder / "b" / "summary.json"),
            "variants": {},
        }
        entry["a"].pop("modules", None)
        a_trace = None
        if entry["a"].get("status") == "built":
            a_trace = tl.load(folder / "a" / "trace")
        for variant_dir in sorted((folder / "b").glob("*/meta.json")):
            meta = read_json(variant_dir)
            name = meta.get("variant", variant_dir.parent.name)
            row: dict[str, Any] = {
                k: meta.get(k) for k in ("status", "reason", "error", "injection", "untraced", "ops", "trace_seconds")
            }
            if meta.get("status") in ("built", "disagrees") and meta.get("ops") and a_trace is not None:
                try:
                    b_trace = tl.load(variant_dir.parent / "trace")
                    started = time.perf_counter()
                    cmp = tl.compare(a_trace, b_trace)
                    row["compare_seconds"] = round(time.perf_counter() - started, 3)
                    row.update(summarize(cmp))
                    if meta.get("injection"):
                        row["located"] = locate(row, meta["injection"])
                except Exception as exc:  # noqa: BLE001 - a comparison that raises is a result too
                    row.update(
                        status="compare failed",
                        error=f"{type(exc).__name__}: {str(exc)[:300]}",
                        traceback=traceback.format_exc()[-2000:],
                    )
            entry["variants"][name] = row
            print(f"{arch.name}/{name}: {_line(row)}", flush=True)
        results["architectures"][arch.name] = entry
    for name, entry in old.items():  # an --only run keeps the other architectures' results
        results["architectures"].setdefault(name, entry)
    results["architectures"] = dict(
        sorted(
            results["architectures"].items(),
            key=lambda kv: (
                [a.name for a in pair.architectures()].index(kv[0])
                if kv[0] in {a.name for a in pair.architectures()}
                else 999
            ),
        )
    )
    results["compare_seconds_total"] = round(
        sum(v.get("compare_seconds", 0) for e in results["architectures"].values() for v in e["variants"].values()), 2
    )
    write_json(path, results)
    print(f"-> {path}")
    return 0


def provenance() -> dict[str, Any]:
    """Which TorchLens compared: the commit, and whether the aligner's folder had uncommitted changes."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "torchlens_core/compare"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {
        "commit": head,
        "aligner_uncommitted_changes": bool(dirty),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _meta(path: pathlib.Path) -> dict[str, Any]:
    return read_json(path) if path.exists() else {"status": "not built"}


def _line(row: dict[str, Any]) -> str:
    if "compare_seconds" not in row:
        return f"{row.get('status')} {row.get('reason') or row.get('error') or ''}"[:200]
    first = row["first_divergence"]
    text = f"{row['pairs']} pairs, first divergence " + (
        "none" if first is None else f"{first['a']} ~ {first['b']} in {first['b_module']} ({first['verdict']})"
    )
    if "located" in row:
        text += f" -> {row['located']['outcome']}"
    return text + f" [{row['compare_seconds']:.2f}s]"
