"""int8 storage for the weights of If/Loop/Scan bodies (the bodies compute in float32).

``int8`` calibrates and quantizes main-graph layers; a model whose weights live in subgraph
bodies (silero-vad keeps every weight in the two branches of an ``If`` on the sample rate)
would keep its file size. Inside each body, a float32 weight ``W`` of a Conv, ConvTranspose,
MatMul, Gemm, LSTM, GRU or RNN becomes the ``weights`` rung's encoding
(:func:`._quant_qdq.scaled_cast`)::

    W:f32  ⇒  Mul(Cast(W_q:int8, float), s)     W_q = round(W / s), s = max|W_row| / 127

with one symmetric scale per slice along the weight's output axis (per row of an RNN's
``[directions, gates·hidden, input]`` weight). ONNX Runtime folds the Cast and the Mul at
load, so the body runs the float layer it had, on ``s · W_q``; the file holds int8 (≈ 0.25×),
one encoding per weight and body.

Weights under ``MIN_ELEMENTS`` stay float (the nodes would cost more than they save). The
int8 pass scores the model with every body weight stored this way against its fidelity
target and restores them all when it is missed (:func:`store_body_weights`, ``undo``).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._quant.qdq import quantize_weight, scaled_cast, weight_scales

MIN_ELEMENTS = 1024
# op type -> weight input positions
WEIGHT_INPUTS = {"Conv": (1,), "ConvTranspose": (1,), "MatMul": (1,), "Gemm": (1,),
                 "LSTM": (1, 2), "GRU": (1, 2), "RNN": (1, 2)}


def output_axis(node: gs.Node, values: np.ndarray) -> int:
    """The axis with one scale per slice: Conv/ConvTranspose 0, MatMul's last (columns),
    Gemm's ``N`` axis, RNN weights' gate rows (1)."""
    if node.op in ("LSTM", "GRU", "RNN"):
        return 1
    if node.op == "MatMul":
        return values.ndim - 1
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    return 0


def body_weights(model):
    """(body, node, input index) of every float32 constant weight in If/Loop/Scan bodies."""
    for body in list(model.all_graphs())[1:]:
        for node in body.nodes:
            for i in WEIGHT_INPUTS.get(node.op, ()) if not node.domain else ():
                if i < len(node.inputs) and isinstance(node.inputs[i], gs.Constant):
                    values = np.asarray(node.inputs[i].values)
                    if values.dtype == np.float32 and values.size >= MIN_ELEMENTS and values.ndim >= 2:
                        yield body, node, i


def store_body_weights(model, result) -> list:
    """Rewrite every body weight as int8 + Cast + Mul; returns the undo list of
    ``(node, input index, original constant)`` (empty: nothing stored)."""
    undo = []
    encoded: dict = {}  # id(constant) -> (int8 values, scales), computed once
    per_body: dict = {}  # (id(body), id(constant)) -> the float tensor the body reads
    touched: dict = {}
    for body, node, i in list(body_weights(model)):
        tensor = node.inputs[i]
        values = np.asarray(tensor.values)
        if id(tensor) not in encoded:
            axis = output_axis(node, values)
            scales = weight_scales(values, axis)
            shape = [1] * values.ndim
            shape[axis] = -1
            encoded[id(tensor)] = (quantize_weight(values, scales, axis), scales.reshape(shape))
        key = (id(body), id(tensor))
        if key not in per_body:
            q, scales = encoded[id(tensor)]
            per_body[key] = scaled_cast(model, body, q, scales)
        undo.append((node, i, tensor))
        touched[id(body)] = body
        node.inputs[i] = per_body[key]
        result.rewrite(f"{node.op} body weight→int8 storage")
    for body in touched.values():
        body.toposort()  # the Cast/Mul were appended; ONNX Runtime wants bodies in order
    return undo


def restore_body_weights(undo: list) -> None:
    """Put the original float constants back (the Cast/Mul nodes go with the next cleanup)."""
    for node, i, tensor in undo:
        node.inputs[i] = tensor
