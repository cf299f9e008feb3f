"""tl.trace(..., save_to=): peak memory over a plain forward, and write speed against a plain file write.

    python bench/stream_save.py [--gib 4]

Each measurement runs in a fresh child process, which reports the growth of
its peak resident memory (VmHWM, Linux) over what it held before the step:

- ``forward``: the model alone (the floor);
- ``save_to``: tl.trace(model, x, save_to=folder), every value kept, written as produced;
- ``in memory``: tl.trace(model, x) then tl.save (skipped above a quarter of this machine's memory).

The model is a chain of elementwise ops on one array of 16 MiB, so the trace
holds ``--gib`` GiB of values while the forward itself holds two arrays. Write
speed: the trace's bytes over the capture's time, against writing the same
number of bytes to a plain file (buffered, fsync at the end) on the same disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, time
import torch
torch.set_num_threads(1)
import torchlens as tl

class Chain(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n
    def forward(self, x):
        for _ in range(self.n):
            x = x * 1.0001 + 0.5
        return x.sum()

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) << 10

step, folder, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, x = Chain(n), torch.ones(4 << 20)  # 16 MiB per value
tl.trace(model, torch.ones(8), save_to=os.path.join(folder, "warm"))  # imports, first-use allocations
tl.save(tl.trace(model, torch.ones(8)), os.path.join(folder, "warm"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak starts again from what is held now
before = hwm()
t0 = time.perf_counter()
with torch.no_grad():
    if step == "forward":
        model(x)
        size = 0
    elif step == "save_to":
        t = tl.trace(model, x, save_to=os.path.join(folder, "t"))
        size = os.path.getsize(os.path.join(folder, "t", "arrays.bin"))
    else:
        t = tl.trace(model, x)
        tl.save(t, os.path.join(folder, "t"))
        size = os.path.getsize(os.path.join(folder, "t", "arrays.bin"))
seconds = time.perf_counter() - t0
print(json.dumps({"peak_growth": hwm() - before, "seconds": seconds, "bytes": size}))
"""


def plain_write(folder: str, nbytes: int) -> float:
    """Seconds to write ``nbytes`` to a new file in 16 MiB chunks, buffered, fsync at the end."""
    chunk = os.urandom(1 << 20) * 16
    path = os.path.join(folder, "plain.bin")
    t0 = time.perf_counter()
    with open(path, "wb", buffering=8 << 20) as f:
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    os.remove(path)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0, help="GiB of values the trace holds")
    args = parser.parse_args()
    n = max(1, int(args.gib * 1024 / 16 / 2))  # two values per iteration
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TORCHLENS_BENCH_DIR")) as folder:
        for step in ("forward", "save_to", "in memory"):
            if step == "in memory" and args.gib * (1 << 30) > memory / 4:
                continue
            done = subprocess.run(
                [sys.executable, "-c", CHILD, step, folder, str(n)], capture_output=True, text=True, check=True
            )
            rows[step] = json.loads(done.stdout.strip().splitlines()[-1])
            shutil.rmtree(os.path.join(folder, "t"), ignore_errors=True)  # one copy on the disk at a time
        plain = plain_write(folder, rows["save_to"]["bytes"])
    gib = rows["save_to"]["bytes"] / (1 << 30)
    print(f"trace of {gib:.2f} GiB of values ({2 * n} ops of 16 MiB), torch, one thread")
    print(f"{'step':<12} {'peak growth MiB':>16} {'seconds':>9} {'write MB/s':>11}")
    for step, row in rows.items():
        speed = f"{row['bytes'] / row['seconds'] / 1e6:11.0f}" if row["bytes"] else f"{'':>11}"
        print(f"{step:<12} {row['peak_growth'] / (1 << 20):16.0f} {row['seconds']:9.2f} {speed}")
    print(f"{'plain write':<12} {'':>16} {plain:9.2f} {rows['save_to']['bytes'] / plain / 1e6:11.0f}")
    extra = (rows["save_to"]["peak_growth"] - rows["forward"]["peak_growth"]) / (1 << 20)
    print(f"save_to holds {extra:.0f} MiB more than the plain forward at its peak, for {gib:.2f} GiB written")


if __name__ == "__main__":
    main()
