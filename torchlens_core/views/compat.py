"""``tl.compat.report(model, x)``: what is known about tracing this model here, before tracing it.

Each row is one check, with a status and the reason:

- ``pass``: traced and verified (the project's tests cover it);
- ``known_broken``: does not work, or is refused with a typed error; the reason says what to do instead;
- ``scope``: works with a stated restriction (no values, part of the model, another entry point);
- ``not_tested``: may work; nothing here verifies it.

The backend's rows come from the ``torchlens_compat`` hook, which inspects the
wrapper, modules, parameters and inputs with the same checks the capture makes;
nothing runs the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named, claim_backend, resolve_backend
from torchlens_core.ir.errors import ArgumentTypeError, BackendNotFoundError, UnsupportedError

STATUSES = ("pass", "known_broken", "scope", "not_tested")


@attrs.frozen
class CompatRow:
    area: str  # "wrapper", "modules", "parameters", "inputs", "device", "framework"
    check: str
    status: str
    reason: str

    def __attrs_post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ArgumentTypeError(f"a compat row's status is one of {STATUSES}, not {self.status!r}")


@attrs.frozen
class CompatReport:
    backend: str | None
    model_name: str
    rows: tuple[CompatRow, ...]

    @property
    def blocking(self) -> list[CompatRow]:
        """Rows that stop a faithful trace (``known_broken``)."""
        return [row for row in self.rows if row.status == "known_broken"]

    def to_markdown(self) -> str:
        lines = [
            f"Compatibility of {self.model_name} with the {self.backend or 'no'} backend",
            "",
            "| area | check | status | reason |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r.area} | {r.check} | {r.status} | {r.reason.replace('|', '/')} |" for r in self.rows]
        return "\n".join(lines)

    def to_pandas(self) -> Any:
        import pandas as pd

        return pd.DataFrame([attrs.asdict(row) for row in self.rows])

    def __str__(self) -> str:
        return self.to_markdown()


def refusal_row(area: str, check: str, refuse: Callable[[], None], works: str) -> CompatRow:
    """The row for one of the capture's own refusal checks: ``known_broken`` with its message, or ``pass``."""
    try:
        refuse()
    except UnsupportedError as exc:
        return CompatRow(area, check, "known_broken", str(exc))
    return CompatRow(area, check, "pass", works)


def report(model: Any, *args: Any, backend: str | None = None, **kwargs: Any) -> CompatReport:
    """Inspect ``model`` (called as ``model(*args, **kwargs)``) without running it."""
    name = getattr(model, "__name__", None) or type(model).__name__
    if backend is None:
        backend = claim_backend(model, args, kwargs)
    if backend is None:
        return CompatReport(
            None,
            name,
            (
                CompatRow(
                    "framework",
                    "backend",
                    "known_broken",
                    "no installed backend recognises the model or its inputs: pass backend= (tl.backends() lists them)",
                ),
            ),
        )
    try:
        info = resolve_backend(backend)
    except BackendNotFoundError as exc:
        return CompatReport(backend, name, (CompatRow("framework", "backend", "known_broken", str(exc)),))
    rows = [
        CompatRow(
            "framework",
            "backend",
            "pass",
            f"{info.name} backend, {info.framework} {info.framework_version}; capabilities: "
            f"{', '.join(sorted(info.capabilities))}",
        )
    ]
    if not callable(model):
        rows.append(
            CompatRow(
                "wrapper",
                "callable",
                "known_broken",
                f"a {type(model).__name__} is not callable: tl.trace needs a model or function",
            )
        )
    found = backend_named(info.name).compat(model, args, kwargs)
    if found is None:
        rows.append(
            CompatRow(
                "framework",
                "backend checks",
                "not_tested",
                f"the {info.name} backend inspects nothing of its own here; LIMITATIONS.md lists what is known for it",
            )
        )
    else:
        rows += found
    return CompatReport(info.name, name, tuple(rows))
