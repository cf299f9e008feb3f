"""Storage: traces and activations on disk.

``tl.save`` / ``tl.load`` (:mod:`.saving`, with values encoded by
:mod:`.encoding`: no pickle), and dataset extraction (:mod:`.extract`) into a
Zarr activation store (:mod:`.activations`).
"""
