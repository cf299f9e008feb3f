"""torchlens-numpy: a TorchLens backend for plain Python functions over NumPy arrays.

    import torchlens as tl
    trace = tl.trace(fn, x, w, backend="numpy")

The hooks live in :mod:`torchlens_numpy.plugin`, registered through the
``torchlens.backends`` entry point. Importing this package imports no NumPy.
"""

__version__ = "0.1.0"
