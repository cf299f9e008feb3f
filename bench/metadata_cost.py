"""What per-op metadata costs, next to capture itself (median of interleaved repeats, one thread).

    python bench/metadata_cost.py            # torch: ResNet-18, GPT-2 small
    python bench/metadata_cost.py --repeats 21

Three figures per model, each against the same capture:
- at capture: the user's call stack (op.code_context) and call timing, measured as
  the capture time saved when the stack walk is switched off;
- derived, on first read: FLOPs/MACs, graph distances and config of every op;
- the op table: trace.to_pandas() with all its columns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from capture_overhead import REFERENCE  # noqa: E402  (sets one thread before frameworks load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11)
    options = parser.parse_args()
    import torch

    import torchlens as tl
    from torchlens_core import sites

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {options.repeats} interleaved runs")
    print(f"{'model':<10} {'ops':>5} {'capture ms':>11} {'stack walk ms':>14} {'derived ms':>11} "
          f"{'to_pandas ms':>13}")
    for name, build in REFERENCE.items():
        model, args, kwargs = build()
        with torch.no_grad():
            for _ in range(2):
                tl.trace(model, *args, **kwargs)
            capture, bare, derived, table = [], [], [], []
            stack = sites.CallSites.stack
            for i in range(options.repeats):
                for walk in (True, False) if i % 2 else (False, True):  # alternate: no order bias
                    if not walk:
                        sites.CallSites.stack = lambda self, limit=0: ()  # type: ignore[method-assign]
                    try:
                        t0 = time.perf_counter()
                        result = tl.trace(model, *args, **kwargs)
                        t1 = time.perf_counter()
                    finally:
                        sites.CallSites.stack = stack  # type: ignore[method-assign]
                    (capture if walk else bare).append(t1 - t0)
                    if walk:
                        trace = result
                    del result
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
        walk = c - statistics.median(bare)
        d, tb = statistics.median(derived), statistics.median(table)
        print(f"{name:<10} {trace.num_ops:>5} {c * 1e3:>11.1f} {walk * 1e3:>8.1f} ({walk / c:>3.0%}) "
              f"{d * 1e3:>5.1f} ({d / c:>3.0%}) {tb * 1e3:>6.1f} ({tb / c:>3.0%})")


if __name__ == "__main__":
    main()
