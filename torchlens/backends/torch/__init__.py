"""``torchlens.backends.torch.wrappers.wrap_torch()``: kept for old scripts (see wrappers.py)."""
