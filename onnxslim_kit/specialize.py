"""Fix model inputs to constant values (``--fix-input sr=16000``) before the passes run.

A model that takes a mode flag or a configuration value as an input (silero VAD's sample rate
``sr`` chooses between a 16 kHz and an 8 kHz network through an ``If``) carries every branch,
and ONNX Runtime evaluates the condition on every run. With the input fixed, the input becomes
an initializer of that name, so ``fuse`` folds what depends on it: the ``If`` is inlined, the
other branch and its weights go. Measured on silero_vad 6.2.3 with ``sr=16000``: 689 → 73
nodes, 2.2 MB → 1.2 MB, outputs equal (``tests/core/test_specialize.py`` has the real-model check).

The result no longer has that input; the report says so. Values are given as numbers,
comma-separated for a vector; their element type is the input's, their shape its static shape
(a scalar for rank 0, ``[n]`` for a rank-1 input of dynamic length).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import UserError


def parse_input_values(items: Iterable[str]) -> dict:
    """``["sr=16000", "k=1,2"]`` → ``{"sr": ["16000"], "k": ["1", "2"]}``."""
    values = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not sep or not name.strip() or not parts:
            raise UserError(f"--fix-input {item!r}: expected NAME=VALUE or NAME=V1,V2,... (e.g. sr=16000)")
        values[name.strip()] = parts
    return values


def fix_inputs(proto: onnx.ModelProto, values: dict) -> list:
    """Turn the inputs named in ``values`` into initializers of ``proto`` (in place); returns
    one note per input for the report."""
    inputs = {i.name: i for i in proto.graph.input}
    initializers = {t.name for t in proto.graph.initializer}
    notes = []
    for name, texts in values.items():
        if name not in inputs or name in initializers:
            raise UserError(f"--fix-input {name}: not an input of the model "
                            f"(inputs: {', '.join(i for i in inputs if i not in initializers)})")
        array = _array(inputs[name], texts)
        proto.graph.initializer.append(numpy_helper.from_array(array, name))
        proto.graph.input.remove(inputs[name])
        notes.append(f"input {name!r} fixed to {array.tolist()} ({array.dtype}) and removed from the model's inputs")
    return notes


def _array(value_info: onnx.ValueInfoProto, texts: list) -> np.ndarray:
    name = value_info.name
    tensor_type = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type") or not tensor_type.elem_type:
        raise UserError(f"--fix-input {name}: the input is not a typed tensor")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    try:
        flat = np.array([_number(t, dtype) for t in texts], dtype=dtype)
    except (ValueError, OverflowError):
        raise UserError(f"--fix-input {name}: {','.join(texts)} are not {dtype} values") from None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if not tensor_type.HasField("shape") or (len(dims) == 1 and dims[0] is None):
        shape = [flat.size] if len(dims) == 1 or flat.size > 1 else []
    elif None in dims:
        raise UserError(f"--fix-input {name}: shape {dims} is not static; only scalars and vectors can be fixed")
    else:
        shape = dims
    if int(np.prod(shape, dtype=np.int64)) != flat.size:
        raise UserError(f"--fix-input {name}: {flat.size} value(s) given, the input holds {int(np.prod(shape))} "
                        f"(shape {shape})")
    return flat.reshape(shape)


def _number(text: str, dtype: np.dtype):
    if dtype == np.bool_:
        if text.lower() not in ("0", "1", "true", "false"):
            raise ValueError(text)
        return text.lower() in ("1", "true")
    return int(text, 0) if np.issubdtype(dtype, np.integer) else float(text)
