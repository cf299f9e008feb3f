"""Comparison: runs and traces set side by side, with one set of metrics (:mod:`.metrics`).

``tl.bundle`` (:mod:`.bundle`) compares named runs of one model (a clean run
and its patched variants) site by site; ``tl.compare`` (:mod:`.report`) aligns
any two traces op by op — two frameworks, two implementations, two versions,
two dtypes — with :mod:`.points` (what each op offers as evidence),
:mod:`.evidence` (the evidence matrices), :mod:`.align` (which op is which),
:mod:`.classes` (the cross-framework equivalence table) and :mod:`.layout`
(NCHW vs NHWC, merged axes, broadcasts, what a flatten carries).
"""
