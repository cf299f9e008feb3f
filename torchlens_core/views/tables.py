"""Traces as pandas tables: one row per op, per parameter, per module.

pandas stays optional: it is imported only when a table is asked for. The
columns and their dtypes are listed here, in one place, and in docs/tables.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchlens_core.ir.errors import MissingDependencyError

if TYPE_CHECKING:
    from torchlens_core.ir.records import ModuleRecord, ParamRecord
    from torchlens_core.ir.trace import Trace

# column -> pandas dtype ("object" columns hold tuples or lists)
OP_COLUMNS = {
    "label": "string",
    "layer_label": "string",
    "kind": "string",
    "func_name": "string",
    "position": "int64",
    "pass_num": "int64",
    "num_passes": "int64",
    "module": "string",
    "modules": "object",
    "module_outputs": "object",
    "shape": "object",
    "dtype": "string",
    "device": "string",
    "parents": "object",
    "children": "object",
    "params": "object",
    "num_params": "int64",
    "source": "string",
    "in_place": "bool",
    "saved": "bool",
    "file": "string",
    "line": "Int64",
    "code_function": "string",
    "num_bytes": "Int64",
    "elapsed": "Float64",
    "flops": "Float64",
    "macs": "Float64",
    "min_distance_from_input": "Int64",
    "max_distance_from_input": "Int64",
    "min_distance_to_output": "Int64",
    "max_distance_to_output": "Int64",
    "conditions": "object",
    "config": "object",
}
PARAM_COLUMNS = {
    "name": "string",
    "module": "string",
    "shape": "object",
    "dtype": "string",
    "numel": "int64",
    "trainable": "bool",
    "is_buffer": "bool",
}
MODULE_COLUMNS = {
    "path": "string",
    "type": "string",
    "num_passes": "int64",
    "num_ops": "int64",
    "num_params": "int64",
    "output_shapes": "object",
}


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as error:
        raise MissingDependencyError(
            f"tables need pandas, which is not installed ({error}): "
            f'pip install "torchlens[tables]" (or pip install pandas)'
        ) from None
    return pandas


def frame(rows: list[dict[str, Any]], columns: dict[str, str]) -> Any:
    pandas = _pandas()
    frame = pandas.DataFrame(rows, columns=list(columns))
    return frame.astype(columns)


def ops_frame(trace: Trace) -> Any:
    rows = []
    distances = trace.distances()
    for op in trace.ops:
        site = op.code_site
        d = distances[op.index]
        rows.append(
            {
                "label": op.label,
                "layer_label": op.layer_label,
                "kind": op.kind,
                "func_name": op.func_name,
                "position": op.index,
                "pass_num": op.pass_num,
                "num_passes": op.num_passes,
                "module": op.module,
                "modules": tuple(op.modules),
                "module_outputs": tuple(op.module_outputs),
                "shape": op.shape,
                "dtype": op.dtype,
                "device": op.device,
                "parents": tuple(op.parents),
                "children": tuple(op.children),
                "params": tuple(op.params),
                "num_params": sum(trace.params[p].numel for p in op.params if p in trace.params),
                "source": op.source,
                "in_place": op.in_place,
                "saved": op.saved,
                "file": site and site.file,
                "line": site and site.line_number,
                "code_function": site and site.func_name,
                "num_bytes": op.num_bytes,
                "elapsed": op.elapsed,
                "flops": op.flops,
                "macs": op.macs,
                "min_distance_from_input": d.min_from_input,
                "max_distance_from_input": d.max_from_input,
                "min_distance_to_output": d.min_to_output,
                "max_distance_to_output": d.max_to_output,
                "conditions": tuple(op.conditions),
                "config": op.config,
            }
        )
    return frame(rows, OP_COLUMNS)


def params_frame(params: dict[str, ParamRecord]) -> Any:
    return frame(
        [
            {
                "name": p.name,
                "module": p.module,
                "shape": p.shape,
                "dtype": p.dtype,
                "numel": p.numel,
                "trainable": p.trainable,
                "is_buffer": p.is_buffer,
            }
            for p in params.values()
        ],
        PARAM_COLUMNS,
    )


def modules_frame(modules: dict[str, ModuleRecord]) -> Any:
    rows = []
    for m in modules.values():
        rows.append(
            {
                "path": m.path,
                "type": m.type_name,
                "num_passes": m.num_passes,
                "num_ops": sum(len(mp.ops) for mp in m.passes),
                "num_params": m.num_params,
                "output_shapes": tuple(m.passes[-1].output_shapes) if m.passes else (),
            }
        )
    return frame(rows, MODULE_COLUMNS)
