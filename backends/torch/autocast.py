"""Autocast as each op ran, recorded at capture and put back at replay.

``torch.autocast`` changes what an op computes (a ``linear`` under CPU
bfloat16 autocast casts its inputs and returns bfloat16) without changing the
call: an op recorded without its autocast state replays in float32. Each op
recorded while some autocast is on keeps, in ``op.meta["autocast"]``, one
entry per device type whose autocast is on (its device type, dtype and
whether the cast cache is on); replay runs the op under exactly those, with
every other autocast off, so an autocast around ``trace.replay()`` does not
change ops that ran without one. The entries hold strings, bools and a dtype:
``tl.save`` keeps them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from torchlens_core.ir.errors import ReplayError

META_KEY = "autocast"
# Is any device's autocast on? One C call: the capture's per-op check.
any_enabled = torch._C._is_any_autocast_enabled


def _device_types() -> tuple[str, ...]:
    supported = getattr(torch._C, "_autocast_supported_devices", None)
    return tuple(supported()) if supported is not None else ("cpu", "cuda")


DEVICE_TYPES = _device_types()


def recorded_state() -> tuple[dict[str, Any], ...]:
    """One entry per device type whose autocast is on now: ``{"device_type", "dtype", "cache"}``.

    Call only when :data:`any_enabled` says one is on (this walks every device type).
    """
    cache = torch.is_autocast_cache_enabled()
    return tuple(
        {"device_type": device, "dtype": torch.get_autocast_dtype(device), "cache": cache}
        for device in DEVICE_TYPES
        if torch.is_autocast_enabled(device)
    )


def _checked(states: Any) -> list[tuple[str, torch.dtype, bool]]:
    """The recorded entries as ``(device type, dtype, cache)``; a malformed entry (a changed file) is refused."""
    if not isinstance(states, (tuple, list)):
        raise ReplayError(f"op.meta['autocast'] should be a list of autocast states, not {states!r}")
    found = []
    for state in states:
        if not (
            isinstance(state, dict)
            and set(state) == {"device_type", "dtype", "cache"}
            and state["device_type"] in DEVICE_TYPES
            and isinstance(state["dtype"], torch.dtype)
            and isinstance(state["cache"], bool)
        ):
            raise ReplayError(
                f"not an autocast state this torch can enter: {state!r} (expected a device type of "
                f"{DEVICE_TYPES}, a torch dtype and a bool cache flag)"
            )
        found.append((state["device_type"], state["dtype"], state["cache"]))
    return found


@contextlib.contextmanager
def as_recorded(states: Any) -> Iterator[None]:
    """Autocast exactly as recorded (``states``: an op's ``meta["autocast"]``, or None: none was on)."""
    wanted = _checked(states) if states is not None else []
    on = {device for device, _, _ in wanted}
    with contextlib.ExitStack() as stack:
        for device in DEVICE_TYPES:  # an autocast around the replay is not the op's: turned off
            if device not in on and torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        for device, dtype, cache in wanted:
            stack.enter_context(torch.autocast(device, dtype=dtype, enabled=True, cache_enabled=cache))
        yield
