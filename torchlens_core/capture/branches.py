"""Data-dependent branches: which ops ran inside an ``if`` or ``while`` decided by an array's value.

A backend calls :meth:`BranchTracker.condition` when a recorded array is turned
into a Python bool or number (``Tensor.__bool__``, ``.item()``). If that
happens in the test of an ``if``, ``while`` or conditional expression, the
statement's body is a data-dependent branch for as long as the frame that
evaluated it stays inside it; :meth:`BranchTracker.current` names the
conditions steering the op being recorded. Source is read with ``ast`` once
per file; code without source (the REPL, exec) is not tracked.
"""

from __future__ import annotations

import ast
import linecache
import sys
from types import FrameType

_BRANCHING = (ast.If, ast.While, ast.IfExp)
# filename -> {line of a test -> (first line, last line) of the statement it decides}
_REGIONS: dict[str, dict[int, tuple[int, int]]] = {}


def _regions(filename: str) -> dict[int, tuple[int, int]]:
    found = _REGIONS.get(filename)
    if found is not None:
        return found
    found = {}
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, _BRANCHING):
            test = node.test
            # Statements branch over their bodies (not the test, which a loop runs again);
            # a conditional expression over its whole self.
            body = node.body if isinstance(node, (ast.If, ast.While)) else [node]
            start, end = body[0].lineno, node.end_lineno or node.lineno
            for line in range(test.lineno, (test.end_lineno or test.lineno) + 1):
                old = found.get(line)
                if old is None or old[1] - old[0] > end - start:  # the innermost statement wins
                    found[line] = (start, end)
    _REGIONS[filename] = found
    return found


class BranchTracker:
    """The data-dependent branches open during one capture."""

    def __init__(self, internal: tuple[str, ...]) -> None:
        self.internal = internal  # directories of framework and TorchLens code: never a user's branch
        # (frame that branched, first line, last line, op index of the deciding value)
        self.open: list[tuple[FrameType, int, int, int]] = []

    def condition(self, op_index: int) -> bool:
        """A recorded value (op ``op_index``) was turned into a Python value by the caller's code.

        Returns True if that opened a branch (the conversion is in the test of an ``if``, ``while``...).
        """
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(self.internal):
            frame = frame.f_back
        if frame is None:
            return False
        region = _regions(frame.f_code.co_filename).get(frame.f_lineno)
        if region is not None:
            self.open.append((frame, region[0], region[1], op_index))
        return region is not None

    def current(self) -> tuple[int, ...]:
        """Op indices of the conditions deciding every open branch the current call runs inside."""
        if not self.open:
            return ()
        live: dict[int, FrameType] = {}
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            live[id(frame)] = frame
            frame = frame.f_back
        still = [b for b in self.open if live.get(id(b[0])) is b[0] and b[1] <= b[0].f_lineno <= b[2]]
        self.open = still  # frames that returned or left the statement close their branches
        return tuple(dict.fromkeys(b[3] for b in still))

    def close(self) -> None:
        self.open.clear()  # drop the frames: they hold the model's locals
