"""Hostile and damaged trace folders: a seeded fuzzer for ``tl.load``, one backend at a time.

Each mutation damages a folder saved from a real zoo model of the backend:
bytes (truncation, bit flips, appended and zeroed bytes, with and without
hashes recomputed to match), hand-edited JSON (wrong types, references to
nothing, out-of-range, NaN and huge numbers, deep nesting, fields removed,
added, duplicated or swapped; hashes recomputed), manifest edits, memory
bombs (unused bytes, JSON that parses to far more than its size, a declared
terabyte), and the folder itself (symbolic links, FIFOs, directories and oversized files in place
of its files). After each, ``tl.load`` must raise ``TraceFileError`` or give a
trace on which every view, ``replay()`` and ``audit()`` raise nothing but
TorchLens errors; anything else is an escape.

Run as ``python tests/fuzz_saving.py BACKEND`` for the counts (one JSON line);
``tests/test_load_fuzz.py`` runs it for every backend installed and requires
no escapes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pathlib
import random
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torchlens as tl
from torchlens_core.ir.errors import TorchLensError
from torchlens_core.store import saving

# Small zoo models with modules, parameters and several outputs: the folders mutated.
SEEDS = {
    "torch": ("lstm_classifier", "tuple_output"),
    "jax": ("jnp_mlp", "nnx_mlp"),
    "tf": ("sequential_mlp", "functional_shared"),
    "paddle": ("lenet", "dict_output"),
    "tinygrad": ("mlp", "multi_output"),
    "numpy": ("mlp", "tuple_output"),
}
FILES = ("manifest.json", "trace.json", "arrays.bin")
DEEP: Any = 0
for _ in range(200):  # nesting far deeper than any saved value
    DEEP = [DEEP]
# Values a hand-edit puts in place of a field: wrong types, references to nothing, NaN, huge and deep.
REPLACEMENTS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    2**63,
    10**400,
    1e308,
    -0.0,
    "",
    "x",
    "../../etc/passwd",
    [],
    {},
    [[]],
    [None],
    [1, 2],
    ["a"],
    {"x": 1},
    {"float": "nan"},
    {"float": "inf"},
    {"array": 0},
    {"array": 10**9},
    {"ref": [0, []]},
    {"ref": [10**6, []]},
    {"ref": [0, [5]]},
    {"ref": [0, ["key"]]},
    {"param": "no.such.param"},
    {"unsaved": "x"},
    {"value": {"x": 1}, "repr": "x"},
    {"list": [1]},
    {"dict": [[1, 2]]},
    {"dict": [[[1], 2]]},
    {"slice": [0, 10**9, 0]},
    {"complex": [1, 2]},
    {"numpy_dtype": "O"},
    {"numpy_type": "<f4"},
    DEEP,
]


def use(trace: tl.Trace) -> None:
    """Everything a user may do with a loaded trace; only TorchLens errors may come out of any of it."""

    def each_op(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        return lambda: [fn(op) for op in trace.ops]

    steps: list[Callable[[], Any]] = [
        lambda: [trace[op.label] for op in trace.ops],
        lambda: [trace[i] for i in range(-len(trace), len(trace))],
        lambda: [trace[k] for k in list(trace.modules)],
        each_op(trace.keys_of),
        lambda: "relu_1" in trace,
        trace.summary,
        lambda: str(trace),
        lambda: repr(trace),
        each_op(str),
        each_op(repr),
        trace.to_dot,
        lambda: trace.to_dot(vis_mode="rolled"),
        lambda: trace.to_dot(collapse=1),
        lambda: tl.hash(trace),
        trace.to_pandas,
        trace.modules.to_pandas,
        trace.params.to_pandas,
        each_op(lambda op: (op.flops, op.macs, op.config, op.distances, op.num_bytes, op.module, op.code_site)),
        lambda: (trace.flops, trace.macs, trace.unknown_flops, trace.output_labels, trace.input_labels),
        lambda: trace.output,
        lambda: [mp.out for m in trace.modules.values() for mp in m.passes],
        lambda: [(mp.output_shapes, mp.output_ops) for m in trace.modules.values() for mp in m.passes],
        trace.replay,
        lambda: str(trace.audit()),
    ]
    for step in steps:
        try:
            step()
        except TorchLensError:
            pass


class Fuzzer:
    """Mutates a saved folder, loads it, uses what loads, and counts."""

    def __init__(self, folder: pathlib.Path, scratch: pathlib.Path, rng: random.Random) -> None:
        self.folder, self.scratch, self.rng = folder, scratch, rng
        self.originals = {name: (folder / name).read_bytes() for name in FILES}
        self.records = json.loads(self.originals["trace.json"])
        self.counts = {"tried": 0, "refused": 0, "loaded_and_used": 0, "escapes": 0}
        self.by_kind: dict[str, list[int]] = {}  # kind -> [tried, refused]
        self.escapes: list[str] = []
        self.must_refuse_failures: list[str] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def restore(self) -> None:
        for name, data in self.originals.items():
            path = self.folder / name
            if path.is_symlink() or path.is_file() or _is_special(path):
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
            path.write_bytes(data)

    def rehash(self) -> None:
        manifest = json.loads((self.folder / "manifest.json").read_text())
        for name in ("trace.json", "arrays.bin"):
            data = (self.folder / name).read_bytes()
            manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (self.folder / "manifest.json").write_text(json.dumps(manifest))

    def attempt(self, kind: str, what: str, mutate: Callable[[], None], must_refuse: bool = False) -> None:
        self.restore()
        mutate()
        if os.environ.get("TORCHLENS_FUZZ_LOG"):  # to find the mutation that crashed a run
            print(f"{kind}: {what}", file=sys.stderr, flush=True)
        self.counts["tried"] += 1
        tally = self.by_kind.setdefault(kind, [0, 0])
        tally[0] += 1
        try:
            trace = tl.load(self.folder)
        except tl.TraceFileError:
            self.counts["refused"] += 1
            tally[1] += 1
            return
        except BaseException as exc:  # noqa: BLE001 - an escape: recorded, the fuzzing goes on
            self._escape(kind, what, "load", exc)
            return
        if os.environ.get("TORCHLENS_FUZZ_LOG"):
            print("  loaded", file=sys.stderr, flush=True)
        if must_refuse:
            self.must_refuse_failures.append(f"{kind}: {what} loaded")
        try:
            use(trace)
        except BaseException as exc:  # noqa: BLE001
            self._escape(kind, what, "use", exc)
            return
        self.counts["loaded_and_used"] += 1

    def _escape(self, kind: str, what: str, stage: str, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        self.counts["escapes"] += 1
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.escapes.append(f"[{kind}] {what} -> {stage}: {type(exc).__name__}: {str(exc)[:300]}\n" + "".join(tb[-4:]))

    # -- mutations -------------------------------------------------------------------------
    def bytes_(self, n: int, rehash: bool) -> None:
        names = ("trace.json", "arrays.bin") if rehash else FILES
        for _ in range(n):
            name = self.rng.choice(names)
            data = bytearray(self.originals[name])
            how = self.rng.choice(["flip", "flip", "truncate", "append", "zero"])
            if how == "flip":
                for _ in range(self.rng.randint(1, 3)):
                    data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
            elif how == "truncate":
                del data[self.rng.randrange(len(data)) :]
            elif how == "append":
                data += bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 16)))
            else:
                start = self.rng.randrange(len(data))
                data[start : start + 8] = bytes(len(data[start : start + 8]))
            changed = bytes(data) != self.originals[name]

            def mutate(name: str = name, data: bytes = bytes(data)) -> None:
                (self.folder / name).write_bytes(data)
                if rehash:
                    self.rehash()

            # Without new hashes only the manifest may change harmlessly (its whitespace, say).
            self.attempt(
                "bytes, hashes recomputed" if rehash else "bytes",
                f"{how} in {name}",
                mutate,
                must_refuse=not rehash and name != "manifest.json" and changed,
            )

    def json_edits(self, n: int) -> None:
        paths = list(_paths(self.records))
        for _ in range(n):
            path = self.rng.choice(paths)
            how = self.rng.choice(["replace"] * 6 + ["delete", "add", "duplicate", "swap", "nudge"])
            records = copy.deepcopy(self.records)
            parent = _at(records, path[:-1])
            key = path[-1]
            if how == "replace":
                value = copy.deepcopy(self.rng.choice(REPLACEMENTS))
                parent[key] = value
                what = f"{_show(path)} = {str(value)[:40]}"
            elif how == "delete":
                del parent[key]
                what = f"del {_show(path)}"
            elif how == "add":
                if isinstance(parent, dict):
                    parent["unexpected"] = 1
                else:
                    parent.append(parent[key])
                what = f"add an element beside {_show(path)}"
            elif how == "duplicate" and isinstance(parent, list):
                parent.insert(key, copy.deepcopy(parent[key]))
                what = f"duplicate {_show(path)}"
            elif how == "swap":  # a value of the right shape taken from elsewhere: a wrong reference
                other = self.rng.choice(paths)
                parent[key] = copy.deepcopy(_at(self.records, other))
                what = f"{_show(path)} = value of {_show(other)}"
            else:
                value = parent[key]
                parent[key] = (
                    value + self.rng.choice([-1, 1])
                    if type(value) in (int, float)
                    else value[:-1]
                    if isinstance(value, str)
                    else None
                )
                what = f"nudge {_show(path)}"
            text = json.dumps(records, allow_nan=True).encode()

            def mutate(text: bytes = text) -> None:
                (self.folder / "trace.json").write_bytes(text)
                self.rehash()

            self.attempt("JSON edits, hashes recomputed", what, mutate)

    def manifest_edits(self) -> None:
        base = json.loads(self.originals["manifest.json"])
        edits: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
            ("size + 1", lambda m: m["files"]["arrays.bin"].update(size=m["files"]["arrays.bin"]["size"] + 1)),
            ("size - 1", lambda m: m["files"]["trace.json"].update(size=m["files"]["trace.json"]["size"] - 1)),
            ("size 2**40", lambda m: m["files"]["arrays.bin"].update(size=2**40)),
            ("size 2**62 for trace.json", lambda m: m["files"]["trace.json"].update(size=2**62)),
            ("size -1", lambda m: m["files"]["arrays.bin"].update(size=-1)),
            ("size as text", lambda m: m["files"]["arrays.bin"].update(size="64")),
            ("other hash", lambda m: m["files"]["trace.json"].update(sha256="0" * 64)),
            ("hash not hex", lambda m: m["files"]["trace.json"].update(sha256=None)),
            ("extra field", lambda m: m["files"]["trace.json"].update(extra=1)),
            ("format", lambda m: m.update(format="pickle")),
            ("version 0", lambda m: m.update(format_version=0)),
            ("a newer version", lambda m: m.update(format_version=saving.FORMAT_VERSION + 1)),
            # versions 5 and 6 only added module fields: a trace without modules reads the same as version 4, so
            # the older version claimed is 3, whose ops lack the gradient fields every trace's ops have
            ("an older version", lambda m: m.update(format_version=3)),
            ("version text", lambda m: m.update(format_version="2")),
            ("no arrays entry", lambda m: m["files"].pop("arrays.bin")),
            ("extra file", lambda m: m["files"].update({"evil.py": {"size": 0, "sha256": "0" * 64}})),
            ("files a list", lambda m: m.update(files=[])),
            ("not an object", lambda m: m.clear() or m.update(x=[m])),
        ]
        for what, edit in edits:
            manifest = copy.deepcopy(base)
            edit(manifest)
            text = json.dumps(manifest).encode() if what != "not an object" else b"[1, 2]"
            self.attempt(
                "manifest edits",
                what,
                lambda text=text: (self.folder / "manifest.json").write_bytes(text),
                must_refuse=True,
            )
        self.attempt(
            "manifest edits",
            "a 2 MB manifest",
            lambda: (self.folder / "manifest.json").write_bytes(self.originals["manifest.json"] + b" " * (2 << 20)),
            must_refuse=True,
        )

    def bombs(self) -> None:
        """Folders whose files would cost far more to load than they are worth (issue 36 item 13): all refused."""
        array_file = self.originals["arrays.bin"]

        def unused_tail() -> None:  # bytes no array uses, hashes to match: read and held for nothing, before
            (self.folder / "arrays.bin").write_bytes(array_file + bytes(1 << 20))
            self.rehash()

        def nested_lists() -> None:  # 1.8 MB of "[]," parse to some 40 MB of lists
            records = json.loads(self.originals["trace.json"])
            records["notes"] = {"dict": [["bomb", {"list": [[]] * 600_000}]]}
            (self.folder / "trace.json").write_bytes(json.dumps(records).encode())
            self.rehash()

        def terabyte() -> None:  # sparse: 1 TiB on paper, size and (made-up) hash in the manifest to match
            with open(self.folder / "arrays.bin", "r+b") as f:
                f.truncate(1 << 40)
            manifest = json.loads(self.originals["manifest.json"])
            manifest["files"]["arrays.bin"]["size"] = 1 << 40
            (self.folder / "manifest.json").write_text(json.dumps(manifest))

        self.attempt("memory bombs", "arrays.bin with 1 MiB no array uses", unused_tail, must_refuse=True)
        self.attempt("memory bombs", "trace.json notes of 600 000 empty lists", nested_lists, must_refuse=True)
        self.attempt("memory bombs", "arrays.bin of 1 TiB, declared", terabyte, must_refuse=True)

    def filesystem(self) -> None:
        outside = self.scratch / "outside"
        outside.mkdir(exist_ok=True)
        for name in FILES:
            copy_path = outside / name
            copy_path.write_bytes(self.originals[name])  # the very same bytes: only the link is wrong

            def link(name: str = name, target: pathlib.Path = copy_path) -> None:
                (self.folder / name).unlink()
                (self.folder / name).symlink_to(target)

            def directory(name: str = name) -> None:
                (self.folder / name).unlink()
                (self.folder / name).mkdir()

            def missing(name: str = name) -> None:
                (self.folder / name).unlink()

            def oversized(name: str = name) -> None:  # sparse: 4 GiB on paper, nothing on disk
                with open(self.folder / name, "r+b") as f:
                    f.truncate(4 << 30)

            self.attempt("links and special files", f"{name} a symbolic link outside", link, must_refuse=True)
            self.attempt("links and special files", f"{name} a directory", directory, must_refuse=True)
            self.attempt("links and special files", f"{name} missing", missing, must_refuse=True)
            self.attempt("links and special files", f"{name} 4 GiB", oversized, must_refuse=True)
            if hasattr(os, "mkfifo"):

                def fifo(name: str = name) -> None:
                    (self.folder / name).unlink()
                    os.mkfifo(self.folder / name)

                self.attempt("links and special files", f"{name} a FIFO", fifo, must_refuse=True)
            if name == "arrays.bin" and pathlib.Path("/dev/zero").exists():

                def device(name: str = name) -> None:
                    (self.folder / name).unlink()
                    (self.folder / name).symlink_to("/dev/zero")

                self.attempt("links and special files", f"{name} a link to /dev/zero", device, must_refuse=True)


def _is_special(path: pathlib.Path) -> bool:
    return os.path.lexists(path) and not path.is_file() and not path.is_dir()


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Any:
    """Every (container, key) position in the JSON, as a key path."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k)
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*path, i)
            yield from _paths(v, (*path, i))


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        node = node[k]
    return node


def _show(path: tuple[Any, ...]) -> str:
    return "".join(f"[{k!r}]" for k in path)


def fuzz(backend: str, seed: int = 0, json_edits: int = 140, byte_edits: int = 30) -> dict[str, Any]:
    """Fuzz folders saved from the backend's seed models; the counts, escapes and refusals that should have been."""
    from torchlens_core.backend.manager import backend_named

    cases = {c.name: c for c in backend_named(backend).conformance_cases() or []}
    rng = random.Random(seed)
    total: dict[str, Any] = {
        "backend": backend,
        "seeds": list(SEEDS[backend]),
        "tried": 0,
        "refused": 0,
        "loaded_and_used": 0,
        "escapes": 0,
        "by_kind": {},
        "escape_details": [],
        "must_refuse_failures": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in SEEDS[backend]:
            model, args, kwargs = cases[name].build()
            trace = tl.trace(model, *args, backend=backend, **kwargs)
            scratch = pathlib.Path(tmp) / name
            scratch.mkdir()
            fuzzer = Fuzzer(tl.save(trace, scratch / "trace"), scratch, rng)
            fuzzer.attempt("unchanged", "the folder as saved", lambda: None)
            fuzzer.bytes_(byte_edits, rehash=False)
            fuzzer.bytes_(byte_edits, rehash=True)
            fuzzer.json_edits(json_edits)
            fuzzer.manifest_edits()
            fuzzer.bombs()
            fuzzer.filesystem()
            fuzzer.restore()
            for key in ("tried", "refused", "loaded_and_used", "escapes"):
                total[key] += fuzzer.counts[key]
            for kind, (tried, refused) in fuzzer.by_kind.items():
                tally = total["by_kind"].setdefault(kind, [0, 0])
                tally[0] += tried
                tally[1] += refused
            total["escape_details"] += fuzzer.escapes
            total["must_refuse_failures"] += fuzzer.must_refuse_failures
    return total


if __name__ == "__main__":
    result = fuzz(sys.argv[1])
    print(json.dumps(result))
