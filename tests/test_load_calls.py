"""Each backend rebuilds only pure array operations from a file: global-state, I/O and crashing calls are refused.

One section per backend, each skipped where its framework is not installed
(TensorFlow and Paddle never share a process). The numpy plugin's refusals are
in tests/test_saving.py; every zoo model still replays after loading
(conformance ``round_trip``).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from saving_checks import rehash

import torchlens as tl
from torchlens_core.backend.manager import backend_named


def decode(backend: str, data: Any) -> Any:
    return backend_named(backend).decode_call(data)


def swap_call(path: pathlib.Path, index: int, call: Any, **fields: Any) -> None:
    records = json.loads((path / "trace.json").read_text())
    records["ops"][index]["call"] = call
    records["ops"][index].update(fields)
    (path / "trace.json").write_text(json.dumps(records))
    rehash(path)


# -- torch -----------------------------------------------------------------------------------------
# Functions that change process-wide state (or run code, or reach other processes): never rebuilt.
TORCH_STATE = [
    ("torch", "use_deterministic_algorithms"),
    ("torch", "set_default_dtype"),
    ("torch", "set_default_device"),
    ("torch", "set_default_tensor_type"),
    ("torch", "manual_seed"),
    ("torch", "seed"),
    ("torch", "initial_seed"),
    ("torch", "set_rng_state"),
    ("torch", "get_rng_state"),
    ("torch", "set_num_threads"),
    ("torch", "set_num_interop_threads"),
    ("torch", "init_num_threads"),
    ("torch", "set_grad_enabled"),
    ("torch", "set_printoptions"),
    ("torch", "set_flush_denormal"),
    ("torch", "set_anomaly_enabled"),
    ("torch", "set_autocast_enabled"),
    ("torch", "autocast_increment_nesting"),
    ("torch", "autocast_decrement_nesting"),
    ("torch", "clear_autocast_cache"),
    ("torch", "set_float32_matmul_precision"),
    ("torch", "set_deterministic_debug_mode"),
    ("torch", "set_warn_always"),
    ("torch", "set_vital"),
    ("torch", "import_ir_module"),
    ("torch", "import_ir_module_from_buffer"),
    ("torch", "fork"),
    ("torch", "wait"),
    ("torch", "vmap"),
    ("torch", "cond"),
    ("torch", "while_loop"),
    ("torch", "prepare_multiprocessing_environment"),
    ("torch", "compile"),
    ("torch", "load"),
    ("torch", "save"),
    ("torch", "from_file"),
    ("torch._C._VariableFunctions", "_cufft_set_plan_cache_max_size"),
    ("torch._C._VariableFunctions", "_cufft_clear_plan_cache"),
    ("torch._C._VariableFunctions", "_print"),
    ("torch._C._VariableFunctions", "_assert_async"),
    ("torch.Tensor", "backward"),
    ("torch.Tensor", "register_hook"),
    ("torch.Tensor", "share_memory_"),
    ("torch.Tensor", "pin_memory"),
    ("torch.Tensor", "record_stream"),
    ("torch.Tensor", "untyped_storage"),
    ("torch.Tensor", "__reduce_ex__"),
    ("torch.Tensor", "__setstate__"),
    ("torch.nn.functional", "handle_torch_function"),
    ("torch.backends", "cudnn"),
    ("torch.cuda", "manual_seed_all"),
    ("os", "system"),
]


@pytest.mark.parametrize("ns, name", TORCH_STATE, ids=[f"{ns}:{name}" for ns, name in TORCH_STATE])
def test_torch_state_setters_are_not_rebuilt(ns: str, name: str) -> None:
    pytest.importorskip("torch")
    with pytest.raises(tl.TraceFileError):
        decode("torch", {"ns": ns, "name": name})


def test_torch_a_crafted_op_cannot_flip_a_global_flag(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    t = tl.trace(lambda x: torch.relu(x) + 1, torch.ones(3))
    path = tl.save(t, tmp_path / "t")
    swap_call(path, 1, {"ns": "torch", "name": "use_deterministic_algorithms"}, args=[True], parent_indices=[])
    before = torch.are_deterministic_algorithms_enabled()
    with pytest.raises(tl.TraceFileError, match="use_deterministic_algorithms"):
        tl.load(path)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_torch_tensor_computations_are_rebuilt() -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    for ns, name, expected in [
        ("torch", "zeros", torch.zeros),
        ("torch.nn.functional", "hardswish", F.hardswish),
        ("torch.Tensor", "add_", torch.Tensor.add_),
        ("torch.linalg", "norm", torch.linalg.norm),
        ("torch._C._VariableFunctions", "_transformer_encoder_layer_fwd", torch._transformer_encoder_layer_fwd),
    ]:
        assert decode("torch", {"ns": ns, "name": name}) is expected


def test_torch_a_value_that_disagrees_with_its_record_stops_replay_before_use(tmp_path: pathlib.Path) -> None:
    # torch.lstm given a hidden state of the wrong batch size reads out of bounds (a crash, or garbage):
    # replay must stop at the torch.zeros that made it, before lstm runs.
    torch = pytest.importorskip("torch")
    lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)

    def model(x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(2, 2, 16), torch.zeros(2, 2, 16)
        return lstm(x, h)[0]

    path = tl.save(tl.trace(model, torch.randn(2, 5, 8)), tmp_path / "t")
    records = json.loads((path / "trace.json").read_text())
    zeros = next(i for i, o in enumerate(records["ops"]) if o["func_name"] == "zeros")
    records["ops"][zeros]["args"] = [2, 3, 16]
    (path / "trace.json").write_text(json.dumps(records))
    rehash(path)
    loaded = tl.load(path)
    with pytest.raises(tl.ReplayError, match="shape"):
        loaded.replay()
    assert not loaded.audit()


# -- TensorFlow ------------------------------------------------------------------------------------
# Op types a file must never make replay run: crashes, clocks, I/O, Python, devices, control state.
TF_REFUSED = [
    "Abort",
    "Timestamp",
    "MlirPassthroughOp",
    "ImmutableConst",
    "PrintV2",
    "Print",
    "ReadFile",
    "WriteFile",
    "MatchingFiles",
    "EagerPyFunc",
    "PyFunc",
    "PyFuncStateless",
    "DebugIdentity",
    "DebugNumericSummary",
    "CopyHost",
    "Copy",
    "Save",
    "SaveV2",
    "Restore",
    "RestoreV2",
    "ShardedFilename",
    "Assert",
    "RandomStandardNormal",
    "VarHandleOp",
    "DestroyResourceOp",
    "AnonymousIteratorV3",
    "IteratorGetNext",
    "WriteScalarSummary",
    "CreateSummaryFileWriter",
    "CollectiveReduceV2",
    "NcclAllReduce",
    "XlaLaunch",
    "TPUExecute",
    "StatelessIf",
    "PartitionedCall",
    "StatefulPartitionedCall",
    "Enter",
    "Barrier",
    "QueueDequeueV2",
    "LookupTableFindV2",
    "DecodeProtoV2",
    "BatchFunction",
    "NoOp",
    "ControlTrigger",
    "Empty",
    "CheckNumerics",
    "DecodeCSV",
    "_Send",
    "AssignVariableOp",
    "ReadVariableOp",
]


def _tf_outputs(op_type: str) -> int:
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    return 0 if op_def is None else sum(1 for a in op_def.output_arg if not (a.number_attr or a.type_list_attr))


@pytest.mark.parametrize("op_type", TF_REFUSED)
def test_tf_dangerous_op_types_are_refused(op_type: str) -> None:
    pytest.importorskip("tensorflow")
    data = {
        "op_type": op_type,
        "attrs": [],
        "num_outputs": _tf_outputs(op_type),
        "kind": "op",
        "variables": [],
        "writes": [],
    }
    with pytest.raises(tl.TraceFileError, match="cannot be replayed|not a TensorFlow op type"):
        decode("tf", data)


def test_tf_output_counts_and_attribute_types_are_checked(tmp_path: pathlib.Path) -> None:
    tf = pytest.importorskip("tensorflow")
    t = tl.trace(lambda x: tf.unstack(tf.nn.relu(x), axis=0), tf.ones((3, 2)))
    path = tl.save(t, tmp_path / "t")
    records = json.loads((path / "trace.json").read_text())
    index, call = next((i, o["call"]) for i, o in enumerate(records["ops"]) if o["func_name"] == "unstack")
    assert call["num_outputs"] == 3
    float_num = list(call["attrs"])
    float_num[float_num.index("num") + 1] = 3.5  # an int attribute given a float
    for bad in (
        {**call, "num_outputs": 4},
        {**call, "num_outputs": 0},
        {**call, "attrs": float_num},
        {**call, "attrs": [*call["attrs"], "no_such_attr", 1]},
        {**call, "op_type": "Abort", "num_outputs": 0},
    ):
        swap_call(path, index, bad)
        with pytest.raises(tl.TraceFileError):
            tl.load(path)


def test_tf_an_extra_input_is_a_replay_error_not_a_crash(tmp_path: pathlib.Path) -> None:
    # TensorFlow's eager executor does not count inputs and crashes on one too many.
    tf = pytest.importorskip("tensorflow")
    t = tl.trace(lambda x: tf.nn.relu(x) * 2.0, tf.ones(3))
    path = tl.save(t, tmp_path / "t")
    records = json.loads((path / "trace.json").read_text())
    index = next(i for i, o in enumerate(records["ops"]) if o["func_name"] == "relu")
    records["ops"][index]["args"].append({"ref": [0, []]})
    records["ops"][index]["parent_indices"] = [0, 0]
    (path / "trace.json").write_text(json.dumps(records))
    rehash(path)
    with pytest.raises(tl.ReplayError, match="inputs"):
        tl.load(path).replay()


# -- Paddle ----------------------------------------------------------------------------------------
PADDLE_REFUSED = [
    "print",
    "read_file",
    "all_reduce",
    "all_reduce_",
    "c_allreduce_sum",
    "barrier",
    "send_v2",
    "recv_v2",
    "sync_calc_stream",
    "sync_comm_stream",
    "memcpy",
    "memcpy_d2h",
    "set_parameter",
    "share_var",
    "global_gather",
    "partial_allgather",
    "mp_allreduce_sum",
    "sync_batch_norm_",
    "distributed_fused_lamb_init",
    "_run_program",
    "seed",
]


@pytest.mark.parametrize("name", PADDLE_REFUSED)
def test_paddle_communication_io_and_scope_ops_are_refused(name: str) -> None:
    pytest.importorskip("paddle")
    with pytest.raises(tl.TraceFileError):
        decode("paddle", {"ns": "paddle._C_ops", "name": name})


def test_paddle_ops_that_read_unchecked_positions_check_their_count_first() -> None:
    # pool2d and conv2d given fewer arguments than they read crash the process (segfault): a left-out trailing
    # argument gets the type stub's default (as Paddle's Python API leaves it to the binding: F.gelu calls
    # gelu(x)), one without a default is refused
    paddle = pytest.importorskip("paddle")
    conv2d = decode("paddle", {"ns": "paddle._C_ops", "name": "conv2d"})
    x, w = paddle.ones([1, 1, 4, 4]), paddle.ones([1, 1, 3, 3])
    full = [x, w, [1, 1], [0, 0], "EXPLICIT", [1, 1], 1, "NCHW"]
    expected = conv2d(*full)
    assert expected.shape == [1, 1, 2, 2]
    assert bool((conv2d(*full[:-1]) == expected).all())  # data_format: the stub's "NCHW"
    assert bool((conv2d(x, w) == expected).all())  # every default
    with pytest.raises(TypeError, match="reads 8 arguments .*filter not given"):
        conv2d(x)
    assert conv2d(*full[:-1], data_format="NCHW").shape == [1, 1, 2, 2]  # by name
    assert decode("paddle", {"ns": "paddle._C_ops", "name": "relu"}) is not None
    gelu = decode("paddle", {"ns": "paddle._C_ops", "name": "gelu"})
    exact = paddle.nn.functional.gelu(x)
    assert bool((gelu(x) == exact).all()) and bool((gelu(x, approximate=False) == exact).all())
    assert bool((gelu(x, True) == paddle.nn.functional.gelu(x, approximate=True)).all())


# -- tinygrad --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "manual_seed",
        "backward",
        "gradient",
        "custom_kernel",
        "call",
        "from_url",
        "fetch",
        "_apply_uop",
        "_rand",
        "__reduce__",
        "schedule_linear",
    ],
)
def test_tinygrad_methods_beyond_their_tensors_are_refused(name: str) -> None:
    pytest.importorskip("tinygrad")
    with pytest.raises(tl.TraceFileError):
        decode("tinygrad", {"method": name})


# -- JAX -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "psum",
        "ppermute",
        "psend",
        "new_ref",
        "swap",
        "box_get",
        "check",
        "inspect_sharding",
        "debug_callback",
        "rng_uniform",
        "pure_callback",
    ],
)
def test_jax_primitives_outside_array_computation_are_refused(name: str) -> None:
    pytest.importorskip("jax")
    from torchlens_jax.saving import _all_primitives

    if name not in _all_primitives() and "callback" not in name:
        assert decode("jax", {"primitive": name, "params": {}}) is None  # this JAX lacks it: not replayable
        return
    with pytest.raises(tl.TraceFileError):
        decode("jax", {"primitive": name, "params": {}})


@pytest.mark.parametrize("precision", [1, "HIGHEST", [1, 2], True, {"dtype": "float32"}])
def test_jax_a_precision_of_another_type_is_refused(precision: Any) -> None:
    # Lowered to MLIR unchecked: dot_general or conv with precision=1 aborts the process.
    pytest.importorskip("jax")
    with pytest.raises(tl.TraceFileError, match="precision"):
        decode("jax", {"primitive": "dot_general", "params": {"precision": precision}})
