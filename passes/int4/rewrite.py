"""Rewriting a quantized ``int4`` layer into the graph (and the opset upgrade ``format=qdq`` needs).

``format=nbits`` (:func:`rewrite_nbits`, ``bits`` 4 or 8)::

    Y = MatMul(A, W)   /   Y = Gemm(A, B, C)    →   Y = com.microsoft::MatMulNBits(A, Bq, S[, Z][, , β·C])

``format=qdq`` (:func:`rewrite_qdq`; opset 21, blocks along K)::

    W' = DequantizeLinear(Wq [K, N], S [n_blocks, N][, Z]; axis=0, block_size)
    Y  = MatMul(A, W')  (Gemm: MatMul then Add(β·C))

Kept layers with ``head=int8`` (:func:`rewrite_int8`): per-column symmetric int8,
``W' = DequantizeLinear(q [K, N], s [N]; axis=1)``, ``s = max|W[:, n]| / 127``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.model import Model
from onnxslim_kit.api import PassResult

import onnxslim_kit.passes.int4.mixed as _int4_mixed
import onnxslim_kit.passes.int4.quant as _int4_quant
from onnxslim_kit.passes.int4.target import Target, transposed
from onnxslim_kit.passes._common.graph import new_constant

QDQ_OPSET = 21


def upgrade(model: Model, allowed: bool, result: PassResult) -> bool:
    """Convert the model to opset 21 for INT4 DequantizeLinear; False (with a reason) if not possible."""
    if not allowed:
        result.skip(f"qdq needs opset {QDQ_OPSET}, model has {model.opset} (upgrade_opset=false)")
        return False
    try:
        converted = onnx.version_converter.convert_version(model.to_proto(), QDQ_OPSET)
        upgraded = Model.from_proto(converted)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types
        result.skip(f"qdq needs opset {QDQ_OPSET}; conversion from {model.opset} failed")
        result.notes.append(f"opset conversion failed: {str(exc).strip().splitlines()[0][:200]}")
        return False
    result.notes.append(f"opset {model.opset} → {QDQ_OPSET} for INT4 DequantizeLinear")
    model.graph = upgraded.graph
    model.commit()
    return True


def rewrite_nbits(model: Model, target: Target, consts: list, shape: tuple, opts: dict) -> None:
    """``shape`` = (K, N, bits, block_size); ``consts`` = [B, scales, zero points or None]."""
    b, scales, zeros = consts
    node = target.node
    inputs = [node.inputs[0], b, scales]
    if zeros is not None or target.bias is not None:
        inputs.append(zeros if zeros is not None else gs.Variable.empty())
    if target.bias is not None:
        inputs += [gs.Variable.empty(), new_constant(model, "int4/bias", target.bias.astype(target.dtype))]
    attrs = dict(zip(("K", "N", "bits", "block_size"), shape))
    if opts["accuracy_level"] and target.dtype == np.float32:  # with float16 A, level 4 measured far off on CPU
        attrs["accuracy_level"] = opts["accuracy_level"]
    outputs = list(node.outputs)
    node.outputs.clear()
    node.inputs.clear()
    model.graph.nodes.append(gs.Node("MatMulNBits", model.fresh_name("int4/MatMulNBits"), attrs, inputs,
                                     outputs, domain="com.microsoft"))


def rewrite_nbits8(model: Model, target: Target, opts: dict, encoded: tuple = None) -> None:
    """The layer as MatMulNBits ``bits=8`` (blocks of :func:`.mixed.int8_block`, symmetric);
    ``encoded``: its ``quantize_int8_blocks`` (codes, scales) when made already (the fidelity stop's)."""
    n, k = target.shape
    bs = _int4_mixed.int8_block(k)
    codes, scale = encoded if encoded is not None else _int4_quant.quantize_int8_blocks(target.load(), bs)
    consts = [new_constant(model, "int4/B8", codes), new_constant(model, "int4/scales8", scale.astype(target.dtype)),
              None]
    rewrite_nbits(model, target, consts, (k, n, 8, bs), opts)


def rewrite_encoded(model: Model, target: Target, encoded: tuple, fmt: str, opts: dict) -> None:
    """The layer from its :func:`.rounds.encode` result, in ``fmt``."""
    if fmt == "nbits":
        qw = encoded[0]
        rewrite_nbits(model, target, encoded[1], (qw.k, qw.n, 4, qw.block_size), opts)
    else:
        rewrite_qdq(model, target, encoded, opts["block_size"])


def stored_layout(target: Target, wt: np.ndarray) -> np.ndarray:
    """``Wt`` [N, K] back in the layout of the weight constant (MatMul W, Gemm B with α divided out)."""
    if target.transform[0] == "MatMul":
        return transposed(wt, target.dtype)
    _, trans_b, alpha = target.transform
    w = (wt if trans_b else wt.T) / np.float32(alpha)
    return np.ascontiguousarray(w, dtype=target.dtype)


def rewrite_qdq(model: Model, target: Target, encoded: tuple, block_size: int) -> None:
    qw, (w, scales, zeros), _ = encoded
    dq_inputs = [w, scales] + ([zeros] if zeros is not None else [])
    deq = gs.Variable(model.fresh_name("int4/w_dq"), target.dtype, [qw.k, qw.n])
    model.graph.nodes.append(gs.Node("DequantizeLinear", model.fresh_name("int4/DequantizeLinear"),
                                     {"axis": 0, "block_size": block_size}, dq_inputs, [deq]))
    replace_with_matmul(model, target, deq)


def rewrite_int8(model: Model, target: Target) -> None:
    q, scale = _int4_quant.quantize_int8_columns(target.load().T)
    deq = gs.Variable(model.fresh_name("int4/head_dq"), target.dtype, list(q.shape))
    inputs = [new_constant(model, "int4/head_q", q), new_constant(model, "int4/head_scale", scale.astype(target.dtype))]
    model.graph.nodes.append(gs.Node("DequantizeLinear", model.fresh_name("int4/DequantizeLinear"),
                                     {"axis": 1}, inputs, [deq]))
    replace_with_matmul(model, target, deq)


def replace_with_matmul(model: Model, target: Target, weight: gs.Variable) -> None:
    """``node`` becomes MatMul(A, weight) (+ bias for Gemm); the outputs keep their tensors."""
    node = target.node
    if node.op == "MatMul":
        node.inputs[1] = weight
        return
    a, outputs = node.inputs[0], list(node.outputs)
    node.outputs.clear()
    node.inputs.clear()
    if target.bias is None:
        model.graph.nodes.append(gs.Node("MatMul", model.fresh_name("int4/MatMul"), {}, [a, weight], outputs))
        return
    mid = gs.Variable(model.fresh_name("int4/mm"), target.dtype)
    bias = new_constant(model, "int4/bias", target.bias.astype(target.dtype))
    model.graph.nodes.append(gs.Node("MatMul", model.fresh_name("int4/MatMul"), {}, [a, weight], [mid]))
    model.graph.nodes.append(gs.Node("Add", model.fresh_name("int4/Add"), {}, [mid, bias], outputs))
