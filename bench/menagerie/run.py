"""Run the menagerie: each entry in its own forked child, under a time and a memory limit; JSON lines out.

    python -m bench.menagerie --backend torch                  # everything, into bench/menagerie/results/torch.jsonl
    python -m bench.menagerie --backend torch --resume         # skip the entries the results file already has
    python -m bench.menagerie --backend torch --shard 2/4      # every 4th entry, from the 2nd
    python -m bench.menagerie --backend torch --sample         # the fixed CI sample (about 5%)
    python bench/menagerie/run.py --backend torch --only timm/resnet10t 'torchvision/vit*'
    python -m bench.menagerie --backend torch --dask-local 4   # on a Dask cluster (bench/menagerie/cluster.py)

The parent imports the framework and its model libraries once, then forks a
child per entry: a child pays no import time, and whatever it does (a crash,
a hang, memory exhausted) ends that child and fails that entry only, never
the run. The child gets RLIMIT_AS (the parent's address space plus
``--memory-gb``) and the parent kills it at ``--timeout``. Each result is
appended and flushed as it comes, so an interrupted run resumes where it
stopped; a shard writes its own file (``torch.2of4.jsonl``) so shards can run
side by side. With ``--dask ADDRESS`` or ``--dask-local N`` the entries run as
tasks on a Dask cluster's workers, each still in its own forked child
(:mod:`bench.menagerie.cluster`), and the results file is written the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import resource
import selectors
import signal
import sys
import time
from typing import Any

if not __package__:  # run as a script: the repository root is where `bench` is found
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench.menagerie.entries import Entry, entries, exclusion, parse_shard, select

RESULTS = pathlib.Path(__file__).parent / "results"


def results_path(backend: str, shard: tuple[int, int] | None, sample: bool) -> pathlib.Path:
    stem = backend + (".sample" if sample else "") + (f".{shard[0]}of{shard[1]}" if shard else "")
    return RESULTS / f"{stem}.jsonl"


def done_names(path: pathlib.Path) -> set[str]:
    """Entries the results file already holds (a line cut short by an interruption is ignored)."""
    names = set()
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                names.add(json.loads(line)["name"])
    return names


def _ends_a_line(path: pathlib.Path) -> bool:
    """Whether the file is empty or its last byte ends a line."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _address_space() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(entry: Entry, write_fd: int, memory_bytes: int, log_fd: int) -> None:
    """In the forked child: limits, quiet output, verify, one JSON document down the pipe, exit."""
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.setpgid(0, 0)  # its own group: a timeout kills whatever it started too
        limit = _address_space() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        import warnings

        warnings.simplefilter("ignore")
        if entry.backend == "torch":
            import torch

            torch.set_num_threads(1)  # the cores are shared; one thread also keeps reductions in one order
        from bench.menagerie.verify import first_line, verify

        try:
            result = verify(entry)
        except MemoryError as exc:
            result = {"status": "failed", "check": "memory", "error": first_line(exc)}
        except BaseException as exc:  # noqa: BLE001 - the harness's own bug: still one line, not a lost entry
            result = {"status": "failed", "check": "harness", "error": first_line(exc)}
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(json.dumps(result, default=str).encode())
    finally:
        os._exit(0)


def run_entry(entry: Entry, timeout: float, memory_bytes: int, log_fd: int) -> dict[str, Any]:
    """Fork, let the child verify ``entry``, and read its result; a hang, a crash or an overrun fails the entry."""
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(entry, write_fd, memory_bytes, log_fd)
    os.close(write_fd)
    chunks, timed_out = [], False
    with selectors.DefaultSelector() as sel, os.fdopen(read_fd, "rb", buffering=0) as pipe:
        sel.register(pipe, selectors.EVENT_READ)
        while True:
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                timed_out = True
                break
            if sel.select(left):
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    seconds = round(time.monotonic() - started, 2)
    if timed_out:
        return {
            "status": "failed",
            "check": "timeout",
            "error": f"no result within {timeout:.0f} s",
            "seconds": seconds,
        }
    try:
        result = json.loads(b"".join(chunks))
    except json.JSONDecodeError:
        how = (
            f"killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited with status {os.WEXITSTATUS(status)}"
        )
        return {
            "status": "failed",
            "check": "crash",
            "error": f"the child {how} before reporting (memory limit?)",
            "seconds": seconds,
        }
    result.setdefault("seconds", seconds)
    result["wall_seconds"] = seconds
    return result


def preload(backend: str) -> None:
    """Import TorchLens, the checks and the framework once, in the parent: every forked child starts with them."""
    import bench.menagerie.verify  # noqa: F401 - imports pytest and the conformance checks
    from torchlens_core.backend.manager import resolve_backend

    resolve_backend(backend)
    if backend == "torch":
        import torch  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.menagerie", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--shard", type=parse_shard, default=None, metavar="I/N")
    parser.add_argument("--resume", action="store_true", help="skip the entries the results file already has")
    parser.add_argument("--sample", action="store_true", help="only the fixed CI sample (about 5%%)")
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="NAME", help="these entries (a trailing * matches a prefix)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per entry")
    parser.add_argument(
        "--memory-gb",
        type=float,
        default=14.0,
        help="address space per entry beyond the parent's (three MoE and speech models need over 6)",
    )
    parser.add_argument("--results", type=pathlib.Path, default=None, help="the JSON lines file to append to")
    parser.add_argument("--list", action="store_true", help="print the selected entries and exit")
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument(
        "--dask",
        default=None,
        metavar="ADDRESS",
        help="run the entries on the Dask scheduler at ADDRESS (its workers import this repository)",
    )
    engine.add_argument(
        "--dask-local",
        type=int,
        default=None,
        metavar="N",
        help="run the entries on a local Dask cluster of N single-threaded worker processes",
    )
    args = parser.parse_args(argv)
    if args.dask_local is not None and args.dask_local < 1:
        parser.error("--dask-local takes a number of workers, at least 1")

    chosen = select(entries(args.backend), args.shard, args.sample, args.only)
    if args.list:
        for entry in chosen:
            print(entry.name, entry.family, exclusion(entry) or "", sep="\t")
        return 0
    path = args.results or results_path(args.backend, args.shard, args.sample)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not args.resume and path.exists() and path.stat().st_size:
        raise SystemExit(f"{path} already holds results: pass --resume to continue it, or remove it to start over")
    if args.dask is None and args.dask_local is None:
        preload(args.backend)  # on a cluster each worker preloads, at its first task
    done = done_names(path) if args.resume else set()
    todo = [e for e in chosen if e.name not in done]
    print(f"{len(chosen)} entries selected, {len(chosen) - len(todo)} already done; results -> {path}", flush=True)
    counts: dict[str, int] = {}
    memory_bytes = int(args.memory_gb * 2**30)
    with open(path, "a") as out, open(path.with_suffix(".log"), "a") as log:
        if not _ends_a_line(path):
            out.write("\n")  # a line an interruption cut short stays alone on its line: the next record is whole

        def record(entry: Entry, result: dict[str, Any]) -> None:
            """Append the entry's record to the results file (flushed: an interrupted run resumes after it)."""
            child_log = result.pop("log", None)  # a Dask task's child output: into the log here
            if child_log is not None:
                log.write(f"\n===== {entry.name}\n{child_log}")
                log.flush()
            line = {
                "backend": entry.backend,
                "name": entry.name,
                "library": entry.library,
                "family": result.pop("family", entry.family),
                **result,
            }
            out.write(json.dumps(line, default=str) + "\n")
            out.flush()
            counts[line["status"]] = counts.get(line["status"], 0) + 1
            text = f"[{sum(counts.values())}/{len(todo)}] {entry.name}: {line['status']}"
            if line["status"] != "verified":
                text += f" ({line.get('check')}: {line.get('error') or line.get('reason')})"
            print(text, f"{line.get('wall_seconds', 0):.1f}s", flush=True)

        on_dask: list[Entry] = []
        for entry in todo:
            reason = exclusion(entry)
            if reason is not None:
                record(entry, {"status": "excluded", "check": None, "error": None, "reason": reason})
            elif args.dask is not None or args.dask_local is not None:
                on_dask.append(entry)
            else:
                log.write(f"\n===== {entry.name}\n")
                log.flush()
                record(entry, run_entry(entry, args.timeout, memory_bytes, log.fileno()))
        if on_dask:
            from bench.menagerie.cluster import client_for, run_on_dask

            with client_for(args.dask, args.dask_local) as client:
                run_on_dask(client, on_dask, args.timeout, memory_bytes, record)
    print("done:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
