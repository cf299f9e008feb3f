"""Gradients: ``save_grads=`` and ``trace.log_backward(loss)`` (:mod:`.backward`).

A backend gives the gradients through its ``torchlens_backward`` hook: torch
from the real backward pass (tensor hooks placed as ops are recorded), the
others by replaying the recorded graph under their framework's autodiff
with a zero added at every selected op (:func:`.backward.perturbed`): the
gradient with respect to that zero is the gradient at the op's output.
"""
