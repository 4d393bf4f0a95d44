"""Integer-only inputs and outputs for the ``int8`` pass (``io=uint8|int8``, as TFLite's
full-integer mode): the caller feeds quantized inputs and reads quantized outputs.

Inputs — a float graph input ``x`` whose first quantization the plan already made::

    x(float) ─▶ Q(s, z) ─▶ DQ ─▶ …        becomes        x(uint8) ─▶ DQ(s, z) ─▶ …

with the Q removed; float readers of ``x`` that were not quantized get their own DQ. For
``io=int8`` on uint8 activations (or the reverse) the same values shift by 128:
``DQ(x_u8, s, z) = DQ(x_u8 − 128, s, z − 128)``. An input whose readers all stay float
keeps float (counted reason).

Outputs — a float graph output ``y`` is quantized over its calibrated range
(``activation_params``) and the integer tensor takes the output's name::

    … ─▶ y(float)        becomes        … ─▶ y'(float) ─▶ Q(s, z) ─▶ y(uint8)

(ORT then fuses the last ``DQ → op → Q`` into its integer kernel — when the types match:
with ``io=int8`` over uint8 activations the first and last layers mix int8 and uint8, and
ORT 1.32 leaves them as ``DQ → Conv → Q``, as it does for int8 activations on x86; so
``io=uint8`` is the fast choice there.) Encodings go into the
model's metadata (:data:`onnxslim_kit.runtime.INTEGER_IO_KEY`), which
:func:`onnxslim_kit.runtime.run` reads to quantize float samples and dequantize outputs, so
the verifier compares with the float model as usual.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.runtime import INTEGER_IO_KEY

from onnxslim_kit.passes._common.graph import consumers, new_constant
from onnxslim_kit.passes._quant.qdq import activation_params

DTYPES = {"uint8": np.uint8, "int8": np.int8}


def _shifted(zero: np.ndarray, dtype) -> np.ndarray:
    """The zero point of the same encoding in ``dtype`` (uint8 ↔ int8: ±128)."""
    z = int(zero)
    if np.dtype(dtype) == zero.dtype:
        return np.asarray(z, dtype)
    return np.asarray(z - 128 if dtype == np.int8 else z + 128, dtype)


def _integer_input(model, graph, tensor, dtype, result):
    quants = [n for n in consumers(tensor) if n.op == "QuantizeLinear" and n.inputs[0] is tensor]
    if not quants:
        result.skip("io: input kept float (its readers stay float)")
        return None
    q = quants[0]
    scale, zero = q.inputs[1].values, _shifted(np.asarray(q.inputs[2].values), dtype)
    s, z = new_constant(model, "int8/io_scale", scale), new_constant(model, "int8/io_zp", zero)
    for dq in list(consumers(q.outputs[0])):  # the plan's DQs (insert_qdq makes nothing else)
        for i, new in enumerate((tensor, s, z)):
            dq.inputs[i] = new
    others = [n for n in consumers(tensor) if n is not q and n.op != "DequantizeLinear"]
    q.inputs.clear()
    q.outputs.clear()
    if others:  # float readers of the input: one DQ for them
        dq_out = gs.Variable(model.fresh_name("int8/io_dq"), dtype=np.float32, shape=tensor.shape)
        graph.nodes.append(gs.Node("DequantizeLinear", name=model.fresh_name("int8/DequantizeLinear"),
                                   inputs=[tensor, s, z], outputs=[dq_out]))
        for node in others:
            for i, t in enumerate(node.inputs):
                if t is tensor:
                    node.inputs[i] = dq_out
    tensor.dtype = dtype
    result.rewrite("io: input integer")
    return [float(scale), int(zero)]


def _integer_output(model, graph, index, stats, dtype, calib, result):
    out = graph.outputs[index]
    if out.name not in stats or stats[out.name].count == 0:
        result.skip("io: output kept float (not calibrated)")
        return None
    lo, hi = calib(stats[out.name])
    scale, zero = activation_params(lo, hi, "uint8" if dtype == np.uint8 else "int8")
    name = out.name
    out.name = model.fresh_name(f"int8/{name}_float")
    q_out = gs.Variable(name, dtype=dtype, shape=out.shape)
    graph.nodes.append(gs.Node("QuantizeLinear", name=model.fresh_name("int8/QuantizeLinear"),
                               inputs=[out, new_constant(model, "int8/io_scale", np.asarray(scale)),
                                       new_constant(model, "int8/io_zp", np.asarray(zero))], outputs=[q_out]))
    graph.outputs[index] = q_out
    result.rewrite("io: output integer")
    return [float(scale), int(zero)]


def make_integer_io(model, mode: str, stats: dict, calib, result) -> dict:
    """Integer inputs/outputs in ``model.graph`` for ``mode`` (uint8 / int8); records the
    encodings in the model's metadata and returns them. ``calib(TensorStats) -> (lo, hi)``."""
    graph, dtype = model.graph, DTYPES[mode]
    io = {"inputs": {}, "outputs": {}}
    for tensor in list(graph.inputs):
        if tensor.dtype is not None and np.dtype(tensor.dtype) == np.float32:
            params = _integer_input(model, graph, tensor, dtype, result)
            if params:
                io["inputs"][tensor.name] = params
    for i, tensor in enumerate(list(graph.outputs)):
        if tensor.dtype is None or np.dtype(tensor.dtype) == np.float32:
            params = _integer_output(model, graph, i, stats, dtype, calib, result)
            if params:
                io["outputs"][graph.outputs[i].name] = params
    if io["inputs"] or io["outputs"]:
        model.metadata_props[INTEGER_IO_KEY] = json.dumps(io)
    return io
