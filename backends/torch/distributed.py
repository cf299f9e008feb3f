"""``tl.distributed`` on PyTorch: explicit ``torch.distributed`` collectives in a forward as boundary nodes.

``arm()`` turns recording on, process-wide, until ``disarm()``. While an
armed capture runs in an initialized process group, the collectives of
``torch.distributed`` (and of ``torch.distributed.distributed_c10d``, where
torch's own code finds them) are replaced by wrappers, and put back by the
last capture out (``torchlens_core.capture.threads.shared_patch``): outside
captures nothing is replaced. A wrapper records only calls from the
capturing thread's model code; any other call goes to the original at once.

Inside a capture a collective that writes tensors (``all_reduce``,
``all_gather``, ``broadcast``, ``reduce_scatter`` and the rest of
:data:`SPECS`) is recorded as one op, a *boundary node*:

- ``func_name`` is the collective's name, ``op.meta["collective"]`` says which
  call it was (``name``, ``group``: the global ranks of its group in group
  order, ``rank``, ``group_rank``, ``world_size``, ``op``: the ReduceOp's name,
  ``root``: the global rank of ``src``/``dst``, ``seq``: its place among this
  rank's calls on that group);
- its arguments are ``(written, sent, received)``: the tensor (or list) the
  collective wrote into, the tensors this rank sent, and a copy of what it
  received. Its output is ``written`` (so later ops read the collective), and
  recorded values sharing memory with ``written`` are copied before the write,
  as for any in-place op;
- its call is a function of :data:`RECEIVERS` that writes ``received`` into
  ``written``: replay cannot run a collective (the other ranks are absent), so
  a rank's trace replays the values its ranks sent it. The values it sent are
  taken as fixed, as a branch condition is (``TraceBuilder.to_python``):
  replay on new inputs, or a fork whose edits change them, raises
  ``GraphDoesNotHold`` rather than pretend the other ranks answered the same.

Every call is also listed, in order, in ``trace.notes["distributed"]``
(rank, world size, the calls with their group and what they sent, and what
cannot be merged: DTensor, FSDP, point-to-point), which
``torchlens_core.ranks`` reads to diagnose and merge rank traces without torch.
An asynchronous collective (``async_op=True``) is waited for inside the
capture, so that its result is recorded where it was asked for.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import warnings
from collections.abc import Iterator
from time import perf_counter
from typing import Any

import attrs
import torch

from torchlens_core.capture.policy import CaptureOptions, HaltCapture
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TraceFileError, UnsupportedError
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace

NOTES = "distributed"  # trace.notes key read by torchlens_core.ranks
CALL_NAMESPACE = "torchlens.collective"  # how tl.save names a boundary node's call
_SMALL = 4096  # sent values up to this many elements are kept as Python numbers for replay's checks


@attrs.frozen(slots=True)
class Spec:
    """Where one collective's written and sent tensors are among its parameters."""

    name: str
    written: str | None  # the parameter written into (None: the call writes nothing here)
    written_list: bool
    sent: str | None
    sent_list: bool
    reduce: bool = False  # takes a ReduceOp as ``op``
    root: tuple[str, str] | None = None  # (global, group-relative) parameter naming src or dst
    point_to_point: bool = False


SPECS = {
    s.name: s
    for s in (
        Spec("all_reduce", "tensor", False, "tensor", False, reduce=True),
        Spec("broadcast", "tensor", False, "tensor", False, root=("src", "group_src")),
        Spec("reduce", "tensor", False, "tensor", False, reduce=True, root=("dst", "group_dst")),
        Spec("all_gather", "tensor_list", True, "tensor", False),
        Spec("all_gather_into_tensor", "output_tensor", False, "input_tensor", False),
        Spec("all_gather_single", "output_tensor", False, "input_tensor", False),
        Spec("reduce_scatter", "output", False, "input_list", True, reduce=True),
        Spec("reduce_scatter_tensor", "output", False, "input", False, reduce=True),
        Spec("reduce_scatter_single", "output", False, "input", False, reduce=True),
        Spec("gather", "gather_list", True, "tensor", False, root=("dst", "group_dst")),
        Spec("gather_into_tensor", "gather_tensor", False, "tensor", False, root=("dst", "group_dst")),
        Spec("gather_single", "gather_tensor", False, "tensor", False, root=("dst", "group_dst")),
        Spec("scatter", "tensor", False, "scatter_list", True, root=("src", "group_src")),
        Spec("all_to_all", "output_tensor_list", True, "input_tensor_list", True),
        Spec("all_to_all_single", "output", False, "input", False),
        Spec("recv", "tensor", False, None, False, root=("src", "group_src"), point_to_point=True),
        Spec("send", None, False, "tensor", False, root=("dst", "group_dst"), point_to_point=True),
    )
}
# Point-to-point calls that return before their data moves: refused for merging, and their writes unrecorded.
ASYNC_POINT_TO_POINT = ("isend", "irecv", "batch_isend_irecv")


# -- replay: a boundary node writes what its rank received --------------------------------------------
def _receiver(name: str) -> Any:
    def receive(written: Any, sent: Any, received: Any) -> Any:
        if isinstance(written, torch.Tensor):
            return written.copy_(received)
        for target, value in zip(written, received):
            target.copy_(value)
        return list(written)

    receive.__name__ = receive.__qualname__ = name
    receive.__doc__ = (
        f"Replay of ``torch.distributed.{name}``: write the values this rank received into the "
        f"tensors it wrote (``sent`` is there for the graph's edges; other ranks are absent)."
    )
    return receive


RECEIVERS = {name: _receiver(name) for name, spec in SPECS.items() if spec.written is not None}
_RECEIVER_NAMES = {id(fn): name for name, fn in RECEIVERS.items()}


def encode_call(op: OpRecord) -> Any:
    """``tl.save``: a boundary node's call by name; any other call as torch's saving names it."""
    name = _RECEIVER_NAMES.get(id(op.call))
    if name is not None:
        return {"ns": CALL_NAMESPACE, "name": name}
    from torchlens_torch.saving import encode_call as encode_torch_call

    return encode_torch_call(op)


def decode_call(data: Any) -> Any:
    """``tl.load``: a boundary node's call only from :data:`RECEIVERS`, any other through torch's allow-list."""
    if isinstance(data, dict) and data.get("ns") == CALL_NAMESPACE:
        if set(data) != {"ns", "name"} or data.get("name") not in RECEIVERS:
            raise TraceFileError(f"not a collective TorchLens replays: {str(data)[:80]}")
        return RECEIVERS[data["name"]]
    from torchlens_torch.saving import decode_call as decode_torch_call

    return decode_torch_call(data)


# -- arming ---------------------------------------------------------------------------------------------
_armed = False


class Arming:
    """What :func:`arm` returns; as a context manager it disarms at exit if this call armed."""

    def __init__(self, installed: bool) -> None:
        self.installed = installed

    def __enter__(self) -> Arming:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.installed:
            disarm()

    def __repr__(self) -> str:
        return f"<tl.distributed {'armed' if armed() else 'disarmed'}>"


def arm() -> Arming:
    """Record explicit ``torch.distributed`` collectives of traced forwards as boundary nodes (idempotent)."""
    global _armed
    import torch.distributed as dist

    if not dist.is_available():
        raise UnsupportedError("this PyTorch build has no torch.distributed: tl.distributed.arm() has nothing to arm")
    was, _armed = _armed, True
    return Arming(not was)


def disarm() -> None:
    """Stop recording collectives (idempotent); a capture under way keeps recording until it ends."""
    global _armed
    _armed = False


def armed() -> bool:
    return _armed


@contextlib.contextmanager
def _collectives_recorded() -> Iterator[None]:
    """For one capture: this thread's collectives go to its recorder (torchlens_core.capture.threads).

    The attributes are replaced while some thread captures armed, and put back
    by the last one out, whatever happens in the forward: outside captures
    ``torch.distributed`` is as torch made it (``torch.compile`` included).
    """
    import torch.distributed as dist
    import torch.distributed._functional_collectives  # noqa: F401 - before the patch: its table keeps the originals
    from torch.distributed import distributed_c10d as c10d

    from torchlens_core.capture.threads import shared_patch

    with contextlib.ExitStack() as stack:
        for name in (*SPECS, *ASYNC_POINT_TO_POINT):
            original = getattr(c10d, name, None)
            if original is None:  # not in this torch version
                continue
            for module in (c10d, dist):
                if getattr(module, name, None) is original:
                    stack.enter_context(shared_patch(module, name, _MAKERS[name]).use(True))
        yield


def _make(name: str, original: Any, handlers: dict[int, Any]) -> Any:
    """The replacement of collective ``name``: recorded in threads capturing armed, the original elsewhere."""
    spec = SPECS.get(name)

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        recorder = _active_recorder() if threading.get_ident() in handlers else None
        if recorder is None:
            return original(*args, **kwargs)
        if spec is None:
            return _async_point_to_point(name, original, recorder, args, kwargs)
        return _record_call(spec, original, recorder, args, kwargs)

    return collective


# One maker per name, the same for every capture (shared_patch refuses two makers for one attribute).
_MAKERS = {name: functools.partial(_make, name) for name in (*SPECS, *ASYNC_POINT_TO_POINT)}


def _active_recorder() -> Any:
    """This thread's recorder, if it is recording here: not inside a recorded call, nor TorchLens' own code.

    A recorded torch call runs with its function mode off, and TorchLens' own
    tensor work (and the collective itself, run below) with torch functions
    disabled: a collective called there is part of that call, not an op.
    """
    if torch._C._len_torch_function_stack() == 0 or not torch._C._is_torch_function_enabled():
        return None
    from torchlens_torch.capture import _Recorder

    for mode in reversed(torch.overrides._get_current_function_mode_stack()):
        if isinstance(mode, _Recorder):
            return mode
    return None


# -- recording --------------------------------------------------------------------------------------------
class RecorderAccess:
    """The recorder's own steps for an in-place call, used by the collectives' wrappers.

    ``torchlens_torch.capture._Recorder`` records calls its TorchFunctionMode
    sees; a collective is not one, so its wrapper takes the same steps through
    the recorder's entry point for such calls: copy recorded values before a
    write (``protect``), template arguments (``template``), record the op
    (``record_call``).
    """

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.builder = recorder.builder

    def producer(self, t: torch.Tensor) -> Ref | None:
        return self.recorder.producer(t)

    def protect(self, t: torch.Tensor) -> None:
        self.recorder.protect(t)

    def template(self, value: Any) -> Any:
        return self.recorder.template(value, [], [])

    def record(
        self, func: Any, args: tuple[Any, ...], out: Any, target: torch.Tensor, meta: dict[str, Any], elapsed: float
    ) -> None:
        """Record ``func(*args)`` as an op that wrote into ``target``, with output ``out``, at the next index."""
        self.recorder.record_call(func, args, out, target, meta, elapsed)


def _record_call(spec: Spec, original: Any, recorder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    bound = _signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    given = bound.arguments
    group = given.get("group")
    if c10d._rank_not_in_group(group):  # torch returns at once: nothing is sent or written
        return original(*args, **kwargs)
    pg = group if group is not None else c10d._get_default_group()
    ranks = list(dist.get_process_group_ranks(pg))
    written = given.get(spec.written) if spec.written else None
    if isinstance(written, (list, tuple)):
        written = list(written)
    sent = given.get(spec.sent) if spec.sent else None
    sent = [] if sent is None else list(sent) if spec.sent_list else [sent]
    access = RecorderAccess(recorder)
    notes = _rank_notes(access.builder.notes)
    seq = sum(1 for c in notes["collectives"] if c["group"] == ranks)
    root = _root(spec, given, pg)
    call = {
        "name": spec.name,
        "group": ranks,
        "rank": dist.get_rank(),
        "group_rank": ranks.index(dist.get_rank()),
        "world_size": dist.get_world_size(),
        "op": _reduce_name(given.get("op")) if spec.reduce else None,
        "root": root,
        "seq": seq,
    }
    if spec.name == "all_to_all_single":
        call["splits"] = [_ints(given.get("output_split_sizes")), _ints(given.get("input_split_sizes"))]
    _fix_sent(access, sent)
    targets = [] if written is None else [written] if isinstance(written, torch.Tensor) else written
    for t in targets:
        access.protect(t)
    start = perf_counter()
    with torch._C.DisableTorchFunction():  # its own tensor calls, and collectives it calls, are its own
        result = original(*args, **kwargs)
        if given.get("async_op") and result is not None:
            result.wait()  # recorded where it was asked for; the caller's own wait() then returns at once
    elapsed = perf_counter() - start
    entry = {**call, "at": len(access.builder.ops), "index": None}
    if spec.name == "recv" and root is None and isinstance(result, int):
        entry["root"] = call["root"] = result  # recv from any source returns the one it heard from
    if not targets:
        entry["sent"] = access.template(sent)
        notes["collectives"].append(entry)
    else:
        assert written is not None  # the targets are its tensors
        with torch.no_grad(), torch._C.DisableTorchFunction():
            received = (
                written.detach().clone() if isinstance(written, torch.Tensor) else [t.detach().clone() for t in written]
            )
        try:
            access.record(
                RECEIVERS[spec.name], (written, sent, received), written, targets[0], {"collective": call}, elapsed
            )
        finally:  # halt= may stop the forward at this very op: it is recorded, and listed
            if len(access.builder.ops) > entry["at"]:
                entry["index"], entry["sent"] = entry["at"], access.builder.ops[entry["at"]].args[1]
                notes["collectives"].append(entry)
    if spec.point_to_point:
        peer = "from" if spec.name == "recv" else "to"
        notes["refused"].append({"kind": "point_to_point", "what": f"{spec.name} {peer} rank {entry['root']}"})
    return result


def _async_point_to_point(
    name: str, original: Any, recorder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """isend / irecv / batch_isend_irecv: noted (merging refuses them) and run; their writes are not recorded."""
    access = RecorderAccess(recorder)
    notes = _rank_notes(access.builder.notes)
    if name == "batch_isend_irecv":
        ops = list(args[0] if args else kwargs.get("p2p_op_list", ()))
    else:
        ops = [(name, args[0] if args else kwargs.get("tensor"))]
    for item in ops:
        op_name, tensor = item if isinstance(item, tuple) else (getattr(item.op, "__name__", "p2p"), item.tensor)
        if "recv" in op_name and isinstance(tensor, torch.Tensor):
            access.protect(tensor)  # recorded values in its memory keep what they were
            notes.setdefault("unrecorded_writes", []).append(f"{op_name} into a tensor of shape {list(tensor.shape)}")
    notes["refused"].append({"kind": "point_to_point", "what": f"{name} (asynchronous)"})
    warnings.warn(
        f"TorchLens: torch.distributed.{name} during capture: an asynchronous point-to-point transfer "
        f"writes when it completes, outside any recorded op, so this rank's trace may not replay the "
        f"values after it (trace.audit() tells); merging such traces is refused",
        stacklevel=3,
    )
    with torch._C.DisableTorchFunction():  # its own tensor calls, and collectives it calls, are its own
        return original(*args, **kwargs)


def _fix_sent(access: RecorderAccess, sent: list[Any]) -> None:
    """Replay takes what this rank received as fixed: it holds only while the values sent are the recorded ones."""
    for t in sent:
        ref = access.producer(t) if isinstance(t, torch.Tensor) else None
        if ref is None:  # a parameter or a constant: fixed in the graph anyway
            continue
        with torch._C.DisableTorchFunction():
            # A value too large to keep as numbers (not a small Python value) is kept as None, and replay on
            # new inputs then refuses the trace: it cannot check that the same values would be sent.
            value = t.tolist() if t.numel() <= _SMALL else t
        access.builder.to_python(ref.index, ref.path, "tolist", value)


@functools.cache
def _signature(original: Any) -> inspect.Signature:
    return inspect.signature(original)


def _root(spec: Spec, given: dict[str, Any], pg: Any) -> int | None:
    if spec.root is None:
        return None
    import torch.distributed as dist

    global_name, group_name = spec.root
    if given.get(global_name) is not None:
        return int(given[global_name])
    if given.get(group_name) is not None:
        return int(dist.get_global_rank(pg, given[group_name]))
    return None


def _reduce_name(op: Any) -> str:
    return str(getattr(op, "name", None) or op).rpartition(".")[2]


def _ints(values: Any) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _rank_notes(notes: dict[str, Any]) -> dict[str, Any]:
    """``notes["distributed"]`` of the capture under way: this rank, the calls so far, what refuses merging."""
    found = notes.get(NOTES)
    if found is None:
        import torch.distributed as dist

        found = notes[NOTES] = {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
            "collectives": [],
            "refused": [],
        }
    return found


# -- capture: the plain one, with this rank's notes while armed ------------------------------------------------
def capture(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None) -> Any:
    """The torch capture; while armed in an initialized process group, the trace's rank notes too."""
    from torchlens_torch.capture import capture as plain

    if not _armed or not _initialized():
        return plain(model, args, kwargs, options)
    refused = _sharded(model, args, kwargs)
    try:
        with _collectives_recorded():
            result = plain(model, args, kwargs, options)
    except HaltCapture as halt:
        _rank_notes(halt.builder.notes)["refused"][:0] = refused
        raise
    # tl.record returns a Recording that has not built its Trace yet: its builder holds the notes
    if isinstance(result, Trace):
        ops, notes = result.ops, result.notes
    else:
        builder = result._builder
        assert builder is not None  # a Recording fresh from the capture: to_trace() has not taken it
        ops, notes = builder.ops, builder.notes
    refused += _dtensor_values(ops)
    _rank_notes(notes)["refused"][:0] = refused
    return result


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _sharded(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[dict[str, str]]:
    """What makes this rank's graph a shard of a larger one (merging refuses it): FSDP, DTensor."""
    found = []
    dtensor = _dtensor_type()
    fsdp_types = _fsdp_types()
    if isinstance(model, torch.nn.Module):
        sharded: list[str] = []  # FSDP modules' paths: their parameters are its shards, not tensor parallelism
        for path, module in model.named_modules():
            if fsdp_types and isinstance(module, fsdp_types):
                sharded.append(path)
                found.append(
                    {
                        "kind": "fsdp",
                        "what": f"module {path or '(the model)'} is "
                        f"{type(module).__name__} (fully sharded data parallel)",
                    }
                )
        if dtensor is not None:
            for name, value in [*model.named_parameters(), *model.named_buffers()]:
                if any(not p or name.startswith(p + ".") for p in sharded):
                    continue
                if isinstance(value, dtensor):
                    kind = "tensor_parallel" if any(p.is_shard() for p in value.placements) else "dtensor"
                    found.append({"kind": kind, "what": f"{name} is a DTensor {_placements(value)}"})
    if dtensor is not None:
        for path, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, dtensor)):
            found.append({"kind": "dtensor", "what": f"input {list(path)} is a DTensor {_placements(leaf)}"})
    return found


def _dtensor_values(ops: list[OpRecord]) -> list[dict[str, str]]:
    """DTensors made inside the forward (``DTensor.from_local``, ``distribute_tensor``...): the first one."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return []
    for op in ops:
        if op.out is not None and any(True for _ in tree.leaves(op.out, lambda v: isinstance(v, dtensor))):
            return [{"kind": "dtensor", "what": f"op {op.func_name} (#{op.index}) computed a DTensor"}]
    return []


def _placements(value: Any) -> str:
    return f"({', '.join(map(str, value.placements))} over {value.device_mesh.mesh.tolist()})"


def _dtensor_type() -> Any:
    # Only modules already imported: a model cannot hold a DTensor or an FSDP module unless torch's were loaded.
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        found = getattr(sys.modules.get(name), "DTensor", None)
        if found is not None:
            return found
    return None


def _fsdp_types() -> tuple[type, ...]:
    found = []
    fsdp, fsdp2 = "torch.distributed.fsdp", "torch.distributed._composable.fsdp"
    for module, attr in ((fsdp, "FullyShardedDataParallel"), (fsdp, "FSDPModule"), (fsdp2, "FSDPModule")):
        cls = getattr(sys.modules.get(module), attr, None)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


__all__ = ["RECEIVERS", "SPECS", "Arming", "arm", "armed", "capture", "decode_call", "disarm", "encode_call"]
