"""Which ops and modules of different frameworks compute the same thing: the equivalence table.

Each framework names its ops its own way: a torch ``linear`` is a JAX
``dot_general`` (plus an ``add`` for the bias), TensorFlow's ``MatMul`` and
``BiasAdd``, Paddle's ``linear``. The aligner (:mod:`.align`) reads an op's
*class* from this table as one piece of evidence that two ops correspond.
Names are matched after :func:`normalized` (case, dunder and in-place
underscores, version suffixes dropped), so ``__add__``, ``add_``, ``AddV2``
and ``add`` are one name.

A decomposed op has no single name on the side that decomposed it (JAX's
``LayerNorm`` is ten primitives): the class of a module's *output* then comes
from the module's type (:data:`MODULE_CLASSES`), and JAX's custom-derivative
functions (``jax.nn.relu``...) name the class of the ops they ran
(``op.meta["custom_rule"]``).

The table is versioned (:data:`TABLE_VERSION`, raised on every change that
can change an alignment) and extended with :func:`register_equivalence` — a
backend or a user adds the names of their framework's ops to a class.
"""

from __future__ import annotations

import re

from torchlens_core.ir.errors import ArgumentTypeError
from torchlens_core.ir.records import OpRecord

TABLE_VERSION = 1

# class -> op names, any framework (before normalization).
OP_CLASSES: dict[str, set[str]] = {
    "input": {"input"},
    "output": {"output"},
    "conv": {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_general_dilated",
        "Conv1D",
        "Conv2D",
        "Conv3D",
        "convolution",
        "DepthwiseConv2dNative",
        "depthwise_conv2d",
        "_convolution",
        "conv2d_transpose",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "Conv2DBackpropInput",
        "conv3d_transpose",
    },
    "matmul": {
        "linear",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "dot_general",
        "MatMul",
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "einsum",
        "Einsum",
        "dot",
        "tensordot",
        "Tensordot",
    },
    "add": {"add", "iadd", "radd", "AddV2", "Add", "BiasAdd", "bias_add", "elementwise_add", "AddN"},
    "sub": {"sub", "rsub", "isub", "Sub", "subtract", "elementwise_sub"},
    "mul": {"mul", "imul", "rmul", "Mul", "multiply", "elementwise_mul"},
    "div": {"div", "truediv", "rtruediv", "RealDiv", "divide", "elementwise_div"},
    "relu": {"relu", "Relu", "relu6", "Relu6"},
    "gelu": {"gelu", "Gelu"},
    "silu": {"silu", "swish", "Swish"},
    "sigmoid": {"sigmoid", "Sigmoid", "logistic"},
    "tanh": {"tanh", "Tanh"},
    "softmax": {"softmax", "Softmax", "log_softmax", "LogSoftmax"},
    "max_pool": {
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "reduce_window_max",
        "MaxPool",
        "MaxPool2D",
        "MaxPoolV2",
        "MaxPool3D",
        "max_pool2d_with_indices",
        "adaptive_max_pool2d",
    },
    "avg_pool": {
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "AvgPool",
        "AvgPool3D",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool3d",
    },
    "layer_norm": {"layer_norm", "LayerNorm", "rms_norm"},
    "batch_norm": {"batch_norm", "FusedBatchNorm", "FusedBatchNormV3", "batch_norm_"},
    "group_norm": {"group_norm", "instance_norm"},
    "dropout": {"dropout", "Dropout", "feature_alpha_dropout", "alpha_dropout"},
    # draws: a pair whose ops include one on one side only is reported as randomness
    "random": {
        "random_bits",
        "random_wrap",
        "random_unwrap",
        "random_seed",
        "random_split",
        "random_fold_in",
        "threefry2x32",
        "stateless_random_uniform",
        "StatelessRandomUniformV2",
        "stateless_random_normal",
        "StatelessRandomNormalV2",
        "RandomUniform",
        "RandomStandardNormal",
        "random_uniform",
        "bernoulli",
        "rand",
        "randn",
        "rand_like",
        "randn_like",
        "randint",
        "multinomial",
        "normal",
        "uniform",
        "uniform_random",
        "gaussian",
        "randperm",
    },
    "reshape": {
        "reshape",
        "view",
        "flatten",
        "Reshape",
        "squeeze",
        "unsqueeze",
        "expand_dims",
        "ExpandDims",
        "Squeeze",
        "unflatten",
    },
    "transpose": {"permute", "transpose", "Transpose", "swapaxes", "moveaxis"},
    "concat": {"cat", "concat", "concatenate", "ConcatV2", "stack", "Pack"},
    "mean": {"mean", "Mean", "reduce_mean"},
    "sum": {"sum", "Sum", "reduce_sum"},
    "embedding": {"embedding", "Embedding", "take", "gather", "GatherV2", "ResourceGather"},
    "attention": {"scaled_dot_product_attention", "dot_product_attention", "multi_head_attention_forward"},
}

# class -> module type names (lowercased): the class of the op a module returns.
MODULE_CLASSES: dict[str, set[str]] = {
    "conv": {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv",
        "convtranspose",
        "convtranspose2d",
        "conv2dtranspose",
        "depthwiseconv2d",
        "conv1dtranspose",
        "conv3dtranspose",
    },
    "linear": {"linear", "dense", "linearlayer", "einsumdense"},
    "layer_norm": {"layernorm", "layernormalization", "rmsnorm"},
    "batch_norm": {"batchnorm", "batchnorm1d", "batchnorm2d", "batchnorm3d", "batchnormalization"},
    "group_norm": {"groupnorm", "groupnormalization", "instancenorm2d"},
    "relu": {"relu"},
    "gelu": {"gelu"},
    "max_pool": {"maxpool1d", "maxpool2d", "maxpool3d", "maxpooling1d", "maxpooling2d", "maxpooling3d"},
    "avg_pool": {
        "avgpool1d",
        "avgpool2d",
        "avgpool3d",
        "averagepooling1d",
        "averagepooling2d",
        "adaptiveavgpool2d",
        "globalaveragepooling2d",
    },
    "embedding": {"embedding", "embed"},
    "softmax": {"softmax"},
    "dropout": {"dropout"},
    "attention": {"multiheadattention", "multiheadattentionlayer"},
}

_SUFFIX = re.compile(r"(v\d+)$")


def normalized(name: str) -> str:
    """``name`` as the table matches it: lowercase, no dunders, in-place underscores or ``V2``-style suffixes."""
    base = name.strip().lower()
    if base.startswith("__") and base.endswith("__"):
        base = base[2:-2]
    base = base.strip("_") if base.endswith("_") else base
    return _SUFFIX.sub("", base)


def _reverse(table: dict[str, set[str]]) -> dict[str, str]:
    return {normalized(name): cls for cls, names in table.items() for name in names}


_OPS = _reverse(OP_CLASSES)
_MODULES = {name.lower(): cls for cls, names in MODULE_CLASSES.items() for name in names}


def register_equivalence(cls: str, funcs: tuple[str, ...] = (), module_types: tuple[str, ...] = ()) -> None:
    """Add op names and module type names to a class (a new class when ``cls`` is new).

    ``register_equivalence("matmul", funcs=("my_gemm",))`` makes a backend's
    ``my_gemm`` align with torch's ``linear`` and JAX's ``dot_general``.
    """
    if not isinstance(cls, str) or not cls:
        raise ArgumentTypeError(f"an equivalence class is named by a non-empty string, not {cls!r}")
    for name in (*funcs, *module_types):
        if not isinstance(name, str) or not name:
            raise ArgumentTypeError(f"op and module type names are non-empty strings, not {name!r}")
    OP_CLASSES.setdefault(cls, set()).update(funcs)
    MODULE_CLASSES.setdefault(cls, set()).update(m.lower() for m in module_types)
    _OPS.update({normalized(f): cls for f in funcs})
    _MODULES.update({m.lower(): cls for m in module_types})


def op_class(op: OpRecord) -> str | None:
    """The class of ``op`` by its function's name, or of the custom-derivative function it ran inside (JAX)."""
    found = _OPS.get(normalized(op.func_name))
    if found is not None:
        return found
    rule = op.meta.get("custom_rule") if isinstance(op.meta, dict) else None
    return _OPS.get(normalized(rule)) if isinstance(rule, str) else None


def module_class(type_name: str) -> str | None:
    """The class of what a module of this type returns (``Dense`` and ``Linear`` are both ``linear``)."""
    return _MODULES.get(type_name.lower())
