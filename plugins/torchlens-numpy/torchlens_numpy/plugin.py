"""The numpy backend's hooks. Importing this module does not import NumPy.

Registered by this distribution's entry point ``torchlens.backends: numpy``,
exactly as any third-party backend is; it uses only TorchLens's public core.

This plugin is the template for a new backend (docs/writing-a-backend.md):
copy the distribution, rename the package and ``NAME`` (here and in
capture.py), and replace the NumPy parts. The hooks are the methods of a
:class:`~torchlens.backend.Backend`, each answering for ``NAME``
only (the guide's table lists every method, and what it needs); the methods
not written here keep the base's defaults (no modules to observe, no
autograd, NumPy arrays need no conversion for a file). TorchLens imports this
module for every listing of backends, with or without the framework, so code
that imports it is declared with :func:`~torchlens.backend.lazy`:
its module is imported on first use.
"""

from __future__ import annotations

from typing import Any

from torchlens.backend import Backend, BackendInfo, hooks_of, lazy

NAME = "numpy"  # the name users pass as backend= (rename it in capture.py too)


class NumpyBackend(Backend):
    name = NAME

    # Who this backend is: the distribution whose installed version makes it available (read from package
    # metadata, nothing imported), the command that installs it, and what it honours (tl.trace refuses an
    # option, save= or intervene= say, whose capability is not declared; manager.CAPABILITIES lists them all).
    def info(self) -> BackendInfo:
        # NumPy is a dependency of torchlens itself; this plugin is its own distribution.
        # "intervene" at op sites; no "splice": plain functions have no module calls to replace.
        # "new_inputs": every conversion of a Tracked array to a Python value is reported.
        return BackendInfo(
            contract=4,
            name=NAME,
            framework="numpy",
            install="pip install torchlens-numpy",
            capabilities=frozenset(
                {"functions", "in_place", "random", "control_flow", "save", "halt", "timing", "intervene", "new_inputs"}
            ),
        )

    # tl.trace(model, x) without backend= asks claim() (from sys.modules and types only). Never here: every
    # framework's users pass NumPy arrays around, so owning a call because its inputs are ndarrays would steal
    # it from the backend that should trace it. Ask for this backend by name: tl.trace(fn, x, backend="numpy").
    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return False

    # tl.trace: run the function once, recording every op into a TraceBuilder, and return builder.finish().
    # Leave nothing patched, whatever happens (capture.py's finally). The heart of a backend.
    capture = lazy("torchlens_numpy.capture:capture")
    # trace.replay() and trace.audit(): every op's value again, by index (replay.py sets NumPy up around the
    # core's interpreter); run_op is one op on resolved arguments.
    replay_graph = lazy("torchlens_numpy.replay:replay_graph")
    replay_op = lazy("torchlens_numpy.replay:run_op")
    # What everything that reads values (the audit, tables, saving) asks of one array: (shape, dtype name,
    # device name), None for anything else; a NumPy copy; max |a - e| / (1 + |e|), how parity checks compare.
    array_info = lazy("torchlens_numpy.arrays:array_info")
    to_numpy = lazy("torchlens_numpy.arrays:to_numpy")
    array_error = lazy("torchlens_numpy.arrays:array_error")
    # With the "intervene" capability: the array operations the steering helpers use (zeros, means, copies...).
    array_ops = lazy("torchlens_numpy.arrays:ARRAY_OPS")
    # op.flops / op.macs: {func_name: formula} over shapes and constants (unknown without).
    flop_formulas = lazy("torchlens_numpy.flops:FORMULAS")
    # tl.save: JSON naming op.call, so that a loaded trace can replay (None: not replayable); tl.load: the call
    # it named, looked up among allow-listed namespaces only (the file may be hostile).
    encode_call = lazy("torchlens_numpy.saving:encode_op")
    decode_call = lazy("torchlens_numpy.saving:decode_call")
    # The model zoo the conformance suite runs (pytest --torchlens-backend numpy): a list of Case.
    conformance_cases = lazy("torchlens_numpy.zoo:cases")

    # tl.compare: NumPy's op names that its built-in equivalence table does not know.
    def op_classes(self) -> dict[str, list[str]]:
        return {"matmul": ["vdot", "inner"], "concat": ["hstack", "vstack", "dstack"]}

    # tl.extract_dataset: one batch from same-shaped samples, stacked along a new leading axis. The core checks
    # shapes and dtypes first, and other frameworks' samples reach a model through from_numpy: here every
    # sample is an ndarray already.
    def stack(self, samples: list[Any]) -> Any:
        import numpy as np

        return np.stack(samples)


backend = NumpyBackend()
# The entry point names this module (``torchlens_numpy.plugin``), whose hook functions pluggy registers: the
# instance's. (An entry point may name the instance instead: ``torchlens_numpy.plugin:backend``.)
globals().update(hooks_of(backend))
