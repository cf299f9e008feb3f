"""Replay: re-executing a recorded trace op by op, and the audit built on it.

:mod:`.evaluator` walks the ops and hands each call to the backend;
:mod:`.audit` replays while comparing every value and checks the invariant
tripwires.
"""

from torchlens_core.ir.errors import ReplayError
from torchlens_core.replay.audit import AuditReport, Finding
from torchlens_core.replay.evaluator import Observe, RunOp, interpret, replay_values

__all__ = ["AuditReport", "Finding", "Observe", "ReplayError", "RunOp", "interpret", "replay_values"]
