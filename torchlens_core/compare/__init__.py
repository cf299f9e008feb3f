"""Comparison: runs and traces set side by side, with one set of metrics (:mod:`.metrics`).

``tl.bundle`` (:mod:`.bundle`) compares named runs of one model (a clean run
and its patched variants) site by site.
"""
