"""TorchLens backend for JAX: plain functions, flax.nnx and equinox modules.

Capture turns the call into a jaxpr (``jax.make_jaxpr``) with module scopes and
output markers added around submodule calls, then walks the jaxpr eagerly,
binding every primitive equation once and recording it as an op. Importing
this package never imports JAX.
"""
