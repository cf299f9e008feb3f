"""tl.save / tl.load: time and size for the reference models (median of repeats, one thread).

python bench/save_load.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from capture_overhead import REFERENCE


def main(repeats: int = 5) -> None:
    import torch

    import torchlens as tl

    torch.set_num_threads(1)
    print(f"{'model':<10} {'ops':>5} {'MiB on disk':>12} {'save s':>8} {'load s':>8} {'capture s':>10}")
    for name, build in REFERENCE.items():
        model, args, kwargs = build()
        with torch.no_grad():
            saves, loads, captures = [], [], []
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / name
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    trace = tl.trace(model, *args, **kwargs)
                    t1 = time.perf_counter()
                    tl.save(trace, path)
                    t2 = time.perf_counter()
                    tl.load(path)
                    t3 = time.perf_counter()
                    captures.append(t1 - t0)
                    saves.append(t2 - t1)
                    loads.append(t3 - t2)
                size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
        print(
            f"{name:<10} {trace.num_ops:>5} {size:>12.1f} {statistics.median(saves):>8.2f} "
            f"{statistics.median(loads):>8.2f} {statistics.median(captures):>10.2f}"
        )


if __name__ == "__main__":
    main()
