"""TorchLens backend for Paddle: ``paddle.nn.Layer`` models and functions, in dynamic-graph mode.

Capture replaces the entries of ``paddle._C_ops`` (and their aliases) and the
Tensor operators with recording wrappers for the length of one forward, and
hooks every sublayer for layer paths and passes; everything is put back in a
``finally``. Importing this package never imports Paddle.
"""
