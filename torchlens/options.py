"""``tl.options``: capture options as one object, and where progress bars go.

``tl.trace(model, x, capture=tl.options.CaptureOptions(...))`` takes the same
options ``tl.trace`` takes as keywords: ``save``, ``halt``, ``lookback``,
``lookback_payload_policy``, ``intervene``, ``save_grads``.

``tl.options.set_progress("auto" | "always" | "never")``: bars for captures,
saves, loads, audits and comparisons that run longer than two seconds; on a
terminal or in Jupyter only (``"auto"``, the default), wherever stderr goes, or
nowhere. In a ``with`` statement it holds for the block. The environment
variable ``TORCHLENS_PROGRESS`` sets the default.
"""

from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.ir.progress import current_mode as progress_mode
from torchlens_core.ir.progress import set_progress

__all__ = ["CaptureOptions", "progress_mode", "set_progress"]
