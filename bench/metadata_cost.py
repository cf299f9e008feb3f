"""What per-op metadata costs, next to capture itself (median of interleaved repeats, one thread).

    python bench/metadata_cost.py            # torch: ResNet-18, GPT-2 small
    python bench/metadata_cost.py --repeats 21

Three figures per model, each against the same capture:
- at capture: walking the user's call stack for op.code_context (timed call by call);
- derived, on first read: FLOPs/MACs, graph distances and config of every op;
- the op table: trace.to_pandas() with all its columns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from capture_overhead import REFERENCE


def _timed(stack: Any, spent: list[float]) -> Any:
    """``CallSites.stack`` adding the time of each call to ``spent[0]``."""
    from torchlens_core.capture.sites import CONTEXT_FRAMES

    def timed_stack(self: Any, limit: int = CONTEXT_FRAMES) -> Any:
        t = time.perf_counter()
        found = stack(self, limit)
        spent[0] += time.perf_counter() - t
        return found

    return timed_stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11)
    options = parser.parse_args()
    import torch

    import torchlens as tl
    from torchlens_core.capture import sites

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {options.repeats} interleaved runs")
    print(f"{'model':<10} {'ops':>5} {'capture ms':>11} {'stack walk ms':>14} {'derived ms':>11} {'to_pandas ms':>13}")
    for name, build in REFERENCE.items():
        model, args, kwargs = build()
        with torch.no_grad():
            for _ in range(2):
                tl.trace(model, *args, **kwargs)
            capture, walks, derived, table = [], [], [], []
            spent = [0.0]
            timed_stack = _timed(sites.CallSites.stack, spent)
            stack = sites.CallSites.stack

            for _ in range(options.repeats):
                sites.CallSites.stack = timed_stack  # type: ignore[method-assign]
                spent[0] = 0.0
                try:
                    t0 = time.perf_counter()
                    trace = tl.trace(model, *args, **kwargs)
                    t1 = time.perf_counter()
                finally:
                    sites.CallSites.stack = stack  # type: ignore[method-assign]
                capture.append(t1 - t0)
                walks.append(spent[0])
                t4 = time.perf_counter()
                for op in trace:
                    op.flops, op.config  # noqa: B018
                trace.distances()
                t5 = time.perf_counter()
                trace.to_pandas()
                t6 = time.perf_counter()
                derived.append(t5 - t4)
                table.append(t6 - t5)
        c = statistics.median(capture)
        walk = statistics.median(walks)
        d, tb = statistics.median(derived), statistics.median(table)
        print(
            f"{name:<10} {trace.num_ops:>5} {c * 1e3:>11.1f} {walk * 1e3:>8.1f} ({walk / c:>3.0%}) "
            f"{d * 1e3:>5.1f} ({d / c:>3.0%}) {tb * 1e3:>6.1f} ({tb / c:>3.0%})"
        )


if __name__ == "__main__":
    main()
