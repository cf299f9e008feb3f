"""What each rank of the gloo jobs in test_distributed.py runs (a module, so spawned processes can import it).

Every rank traces its models with tl.distributed armed, saves each trace with
tl.save into ``out/<case>/rank<r>``, and saves beside it, as NumPy files, the
references the parent checks against: the untraced output of the same model
on the same input, and the value entering the all_reduce as a forward hook
on the activation module saw it in that untraced run.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import traceback
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import torchlens as tl


def free_init_method() -> str:
    """A TCP rendezvous on a free port of 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class RankModel(nn.Module):
    """A data-parallel step's forward: a local layer, an all_reduce of its activation, an all_gather, a head."""

    def __init__(self, world: int, reduce_op: Any = dist.ReduceOp.SUM, extra: bool = False, pairs: Any = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(6 * world, 3)
        self.reduce_op, self.extra, self.world, self.pairs = reduce_op, extra, world, pairs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        if self.extra:  # another graph, the same collectives
            h = torch.tanh(h) + 1
        dist.all_reduce(h, op=self.reduce_op)
        parts = [torch.empty_like(h) for _ in range(self.world)]
        dist.all_gather(parts, h * 0.5)
        y = self.fc2(torch.cat(parts, dim=-1))
        if self.pairs is not None:  # a collective on a subgroup: ranks {0, 1} and {2, 3}
            dist.all_reduce(y, group=self.pairs[dist.get_rank() // 2])
        return y


class MoreCollectives(nn.Module):
    """broadcast, reduce_scatter, all_gather_into_tensor, and a gather that writes on its root only."""

    def __init__(self, world: int) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2 * world)
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        dist.broadcast(h, src=1)  # every rank now holds rank 1's h
        parts = [c.contiguous() for c in (h + x.sum()).chunk(self.world, dim=1)]  # each rank's own values again
        mine = torch.empty(2, 2)
        dist.reduce_scatter(mine, parts)
        flat = torch.empty(2 * self.world, 2)
        dist.all_gather_into_tensor(flat, mine)
        gathered = [torch.empty_like(mine) for _ in range(self.world)] if dist.get_rank() == 0 else None
        dist.gather(mine, gathered, dst=0)
        y = flat.sum(dim=0)
        return y + torch.stack(gathered).sum(dim=0).sum(dim=0) if gathered is not None else y


class SendRecv(nn.Module):
    """A pipeline-like forward: rank 0 sends its activation, rank 1 receives it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if dist.get_rank() == 0:
            dist.send(h, dst=1)
            return h
        buffer = torch.zeros_like(h)
        dist.recv(buffer, src=0)
        return buffer + h


def _save_case(
    out: pathlib.Path, case: str, rank: int, model: nn.Module, x: torch.Tensor, grad: bool = True
) -> tl.Trace:
    folder = out / case / f"rank{rank}"
    seen: dict[str, Any] = {}

    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:  # None: the output stays the module's
        seen["act"] = output.detach().clone()

    handle = model.act.register_forward_hook(hook) if hasattr(model, "act") else None
    with torch.no_grad():
        plain = model(x)  # untraced: the reference
    if handle is not None:
        handle.remove()
    with torch.set_grad_enabled(grad):
        trace = tl.trace(model, x)
    tl.save(trace, folder)
    np.save(folder / "plain.npy", plain.numpy())
    np.save(folder / "replayed.npy", trace.replay().detach().numpy())
    if "act" in seen:
        np.save(folder / "act.npy", seen["act"].numpy())
    (folder / "audit.txt").write_text(str(trace.audit()))
    return trace


def _refusals(trace: tl.Trace) -> list[str]:
    """The kinds a single rank's report refuses it for (merge_report of one trace: the other ranks are missing)."""
    return sorted({f.kind for f in tl.merge_report([trace]).findings})


def worker(rank: int, world: int, init: str, out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out_path = pathlib.Path(out)
    # a rank that fails leaves the others waiting in a collective: they give up after a minute, not half an hour
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    results: dict[str, Any] = {}
    try:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else None
        with tl.distributed.arm():
            torch.manual_seed(0)  # the same weights on every rank, as data parallelism has
            model = RankModel(world, pairs=pairs)
            torch.manual_seed(100 + rank)  # each rank its own batch
            x = torch.randn(2, 4)
            _save_case(out_path, "clean", rank, model, x)
            if world == 2:
                _save_case(out_path, "step2", rank, model, torch.randn(2, 4))  # the next step: other values
                torch.manual_seed(0)
                _save_case(out_path, "other_graph", rank, RankModel(world, extra=rank == 1), x)
                torch.manual_seed(0)
                _save_case(out_path, "max", rank, RankModel(world, reduce_op=dist.ReduceOp.MAX), x)
                torch.manual_seed(0)
                # without autograd: gloo's all_gather_into_tensor fails in a forward that needs gradients,
                # traced or not ("a view was created in no_grad mode and is being modified inplace")
                _save_case(out_path, "more", rank, MoreCollectives(world), x, grad=False)
                torch.manual_seed(0)
                _save_case(out_path, "send_recv", rank, SendRecv(), x)
                results.update(_sharded(rank, world, x))
        # every rank reaches here before any tears gloo down: a rank that closed its sockets while
        # another still drained a collective's background work could abort that rank (SIGABRT)
        dist.barrier()
    except Exception:
        results["error"] = traceback.format_exc()
        raise  # torch.multiprocessing.spawn then stops the other ranks
    finally:
        (out_path / f"results{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
    # skip interpreter teardown: device meshes and FSDP state still hold process groups whose
    # destructors run after destroy_process_group, and gloo may abort there; the results are written
    os._exit(0)


def _sharded(rank: int, world: int, x: torch.Tensor) -> dict[str, Any]:
    """Traces of a DTensor (tensor-parallel) model and of an FSDP2 model: what merge_report refuses them for."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    found: dict[str, Any] = {}
    torch.manual_seed(0)
    tp = parallelize_module(nn.Sequential(nn.Linear(4, 8)), mesh, {"0": ColwiseParallel()})
    found["tensor_parallel"] = _refusals(tl.trace(tp, x))
    torch.manual_seed(0)
    sharded = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    fully_shard(sharded, mesh=mesh)
    try:
        found["fsdp"] = _refusals(tl.trace(sharded, x))
    except Exception as exc:  # noqa: BLE001 - recorded for the parent to report
        found["fsdp_capture_error"] = f"{type(exc).__name__}: {exc}"
    return found
