"""One entry, verified with the shared conformance checks (torchlens/conformance/checks.py), called directly.

Verified means: traced, and every check passes: output parity with the
model's own untraced call, ``audit()`` clean (replay parity, every tripwire,
the untraced rerun), module outputs equal to the framework's own hooks, the
save/load round trip, and replay on a second input equal to the model's own
output on it. A model that cannot be built, or whose own untraced call
fails, is excluded with its error: TorchLens never ran.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

import pytest

from bench.menagerie.entries import Entry

# The checks, in the conformance suite's order: round_trip runs after module_outputs on purpose (the model has
# run again since the capture, and the trace must still hold the values that ran).
CHECKS = ("output_parity", "audit_clean", "module_outputs", "round_trip", "replay_on_other_inputs")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}"[:300]


def _detail(exc: BaseException) -> str:
    return str(exc).strip()[:2000]


def _settings_request(untraced: bool) -> Any:
    """What test_audit_clean reads from pytest's ``request``: the suite's settings (the untraced rerun on)."""
    from torchlens.conformance.plugin import SuiteSettings, configure_suite

    config = types.SimpleNamespace(stash={})
    configure_suite(config, SuiteSettings(untraced=untraced))  # type: ignore[arg-type]
    return types.SimpleNamespace(config=config)


def _check_calls(traced: Any, scratch: str) -> dict[str, Callable[[], None]]:
    import pathlib

    from torchlens.conformance import checks

    return {
        "output_parity": lambda: checks.test_output_parity(traced),
        "audit_clean": lambda: checks.test_audit_clean(traced, _settings_request(untraced=True)),
        "module_outputs": lambda: checks.test_module_outputs(traced),
        "round_trip": lambda: checks.test_round_trip(traced, pathlib.Path(scratch)),
        "replay_on_other_inputs": lambda: checks.test_replay_on_other_inputs(traced),
    }


def verify(entry: Entry) -> dict[str, Any]:
    """The result record of one entry (a JSON-able dict): status verified, failed or excluded, and why."""
    import torchlens as tl
    from torchlens.conformance.checks import Traced
    from torchlens_core.backend.cases import Case

    started = time.monotonic()
    result: dict[str, Any] = {"status": "verified", "check": None, "error": None, "checks": {}}
    case = Case(entry.name, entry.build, rtol=entry.rtol, reset=_reset(entry.backend), other_inputs=entry.other_inputs)
    try:
        model, args, kwargs = case.build()
    except Exception as exc:  # noqa: BLE001 - any failure to build is the model's, not TorchLens's
        return {
            **result,
            "status": "excluded",
            "check": "build",
            "error": first_line(exc),
            "reason": f"the model cannot be built small: {first_line(exc)}",
        }
    result["family"] = _family(entry, model, kwargs)
    try:
        case.reset()
        own = model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return {
            **result,
            "status": "excluded",
            "check": "untraced call",
            "error": first_line(exc),
            "reason": f"the model's own untraced call fails: {first_line(exc)}",
        }
    try:
        case.reset()
        trace = tl.trace(model, *args, backend=entry.backend, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return {
            **result,
            "status": "failed",
            "check": "trace",
            "error": first_line(exc),
            "detail": _detail(exc),
            "traceback": traceback.format_exc()[-3000:],
            "seconds": round(time.monotonic() - started, 2),
        }
    result["ops"] = trace.num_ops
    traced = Traced(entry.backend, case, model, args, kwargs, trace, own)
    scratch = tempfile.mkdtemp(prefix="menagerie-")
    try:
        for name, call in _check_calls(traced, scratch).items():
            try:
                call()
                result["checks"][name] = "passed"
            except pytest.skip.Exception as exc:
                result["checks"][name] = f"skipped: {str(exc)[:200]}"
            except Exception as exc:  # noqa: BLE001 - AssertionError from a check, or whatever a step raised
                result["checks"][name] = f"failed: {first_line(exc)}"
                if result["status"] == "verified":
                    result.update(
                        status="failed",
                        check=name,
                        error=first_line(exc),
                        detail=_detail(exc),
                        traceback=traceback.format_exc()[-3000:],
                    )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def _reset(backend: str) -> Callable[[], None]:
    """Reseed before every run of the model, as the capture was: a forward drawing random numbers draws alike."""
    if backend == "torch":

        def seed() -> None:
            import torch

            torch.manual_seed(0)

        return seed
    return lambda: None


def _family(entry: Entry, model: Any, kwargs: dict[str, Any]) -> str:
    """The entry's family; a transformers model's is what it reads and whether it has a decoder, known once built."""
    if entry.library != "transformers":
        return entry.family
    config = getattr(model, "config", None)
    kind = {"input_ids": "text", "pixel_values": "vision", "input_values": "audio", "input_features": "audio"}.get(
        getattr(model, "main_input_name", ""), "other"
    )
    if getattr(config, "is_encoder_decoder", False):
        kind += "-encoder-decoder"
    elif any(hasattr(config, k) for k in ("vision_config", "audio_config")) and kind == "text":
        kind = "multimodal"
    return f"transformers.{kind}"
