"""Comparison cost: tl.compare on two GPT-2 small traces (about 530 ops each), from memory and from disk.

    python bench/compare_cost.py --repeats 5

GPT-2 small (12 layers, 768 wide, random weights), 32 tokens; the second
model has a different LayerNorm epsilon, so the comparison aligns, finds the
first divergence and measures every pair. One thread; medians. The issue's
target is under 2 s for a pair of ~500-op traces.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()

    import torch
    import transformers

    import torchlens as tl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config()).eval()
    other = transformers.GPT2Model(transformers.GPT2Config(layer_norm_epsilon=1e-3)).eval()
    other.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50257, (1, 32))
    with torch.no_grad():
        a, b = tl.trace(model, ids), tl.trace(other, ids)
    live = []
    for _ in range(options.repeats):
        start = time.perf_counter()
        cmp = tl.compare(a, b)
        live.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as folder:
        tl.save(a, os.path.join(folder, "a"))
        tl.save(b, os.path.join(folder, "b"))
        la, lb = tl.load(os.path.join(folder, "a")), tl.load(os.path.join(folder, "b"))
        loaded = []
        for _ in range(options.repeats):
            start = time.perf_counter()
            tl.compare(la, lb)
            loaded.append(time.perf_counter() - start)
    first = cmp.first_divergence
    print(
        f"tl.compare, GPT-2 small, {len(a.ops)} vs {len(b.ops)} ops, {len(cmp.pairs)} pairs "
        f"(first divergence {first.a if first else None}):"
    )
    print(f"  live traces:   {statistics.median(live):.2f} s")
    print(f"  loaded traces: {statistics.median(loaded):.2f} s (target: under 2 s)")


if __name__ == "__main__":
    main()
