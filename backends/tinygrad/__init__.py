"""The tinygrad backend: every Tensor method wrapped for one capture, layers by attribute path."""
