"""Steering: interventions on a running model, and on a recorded trace.

``tl.when(selector, *helpers)`` (:mod:`.helpers`, with the built-in helpers)
is applied as the forward runs by the capture's editor
(:mod:`torchlens_core.capture.edits`, beside the save= policy: what a
capture changes is decided as ops arrive, like what it keeps); every edit is
recorded on the op it changed, so replay does it again.
"""
