"""``tl.options``: capture options as one object, ``tl.trace(model, x, capture=tl.options.CaptureOptions(...))``.

The same options ``tl.trace`` takes as keywords: ``save``, ``halt``,
``lookback``, ``lookback_payload_policy``, ``intervene``, ``save_grads``.
"""

from torchlens_core.capture.policy import CaptureOptions

__all__ = ["CaptureOptions"]
