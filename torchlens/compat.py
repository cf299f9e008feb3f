"""``tl.compat``: ``tl.compat.report(model, x)`` says what is known about tracing a model here, before tracing it.

``report(...).to_markdown()`` gives one row per check: the model's wrapper,
modules, parameters, inputs, devices and framework, each ``pass``,
``known_broken``, ``scope`` or ``not_tested`` with the reason
(torchlens_core/views/compat.py; LIMITATIONS.md has the full matrix).
"""

from torchlens_core.views.compat import CompatReport, CompatRow, report

__all__ = ["CompatReport", "CompatRow", "report"]
