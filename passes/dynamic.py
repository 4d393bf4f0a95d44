"""``dynamic`` — dynamic-range int8: weights quantized offline, activations at run time.

MatMul with a constant 2-D weight ``B`` (Gemm with ``transA = 0`` likewise, ``B`` transposed
when ``transB``; ``alpha`` folded into the scale, ``beta·C`` added after)::

    x ──▶ MatMul(B) ──▶ y
    x ──▶ DynamicQuantizeLinear ──▶ (x_q, s_x, z_x)
          MatMulInteger(x_q, B_q, z_x, 0) ──▶ Cast(float) ──▶ Mul(s_x · s_B) ──▶ y

``B_q = round(B / s_B)`` symmetric int8, ``s_B`` per output column (or per tensor). ONNX
Runtime fuses this exact pattern into DynamicQuantizeMatMul (checked by the tests). This
pays off on MatMul-heavy models (transformers, RNN-like heads).

Conv only with ``conv=true``: ``ConvInteger`` + Cast + per-channel Mul + bias Add. ONNX
Runtime's CPU ConvInteger is slow (3–7× slower than float on conv nets, measured), hence off
by default.

Conditions: weight a float constant, activation a float tensor, main graph or subgraph alike
(no calibration is needed); weights with fewer than ``min_weights`` elements are left float.
Models already quantized pass through untouched.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.pipeline import Option, Pass, PassResult, register_pass

from ._graph import attr, const_value, is_onnx_op, new_constant
from ._quant_qdq import is_quantized, quantize_weight, weight_scales


@register_pass
class DynamicPass(Pass):
    name = "dynamic"
    summary = "dynamic-range int8 for MatMul/Gemm weights (MatMulInteger); Conv only on request"
    lossless = False
    options = {
        "per_channel": Option(bool, True, "per-output-column weight scales"),
        "conv": Option(bool, False, "also Conv via ConvInteger (slow on ORT's CPU provider)"),
        "min_weights": Option(int, 1024, "leave weights with fewer elements float"),
    }

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        if any(is_quantized(g) for g in model.all_graphs()):
            result.skip("already quantized (has Q/DQ or integer ops)")
            return result
        if model.opset < 10:
            result.skip("opset < 10 has no MatMulInteger")
            return result
        opts = ctx.options
        if opts["conv"]:
            result.notes.append("conv=true: ConvInteger runs slowly on ONNX Runtime's CPU provider "
                                "(often several times slower than float); prefer int8 for conv nets")
        for graph in list(model.all_graphs()):
            for node in list(graph.nodes):
                if is_onnx_op(node, "MatMul", "Gemm"):
                    self._matmul(model, graph, node, opts, result)
                elif is_onnx_op(node, "Conv"):
                    if opts["conv"]:
                        self._conv(model, graph, node, opts, result)
                    else:
                        result.skip("Conv left float (conv=false; ConvInteger is slow on CPU)")
        return result

    # --- MatMul / Gemm --------------------------------------------------------------------
    def _matmul(self, model, graph, node, opts, result) -> None:
        x, w = node.inputs[0], const_value(node.inputs[1])
        if const_value(x) is not None or w is None or w.ndim != 2 or w.dtype != np.float32:
            return result.skip(f"{node.op}: weight not a 2-D float constant")
        if w.size < opts["min_weights"]:
            return result.skip(f"{node.op}: weight below min_weights")
        alpha, bias = 1.0, None
        if node.op == "Gemm":
            if attr(node, "transA", 0):
                return result.skip("Gemm: transA")
            w = w.T if attr(node, "transB", 0) else w
            alpha = float(attr(node, "alpha", 1.0))
            if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name:
                c = const_value(node.inputs[2])
                if c is None:
                    return result.skip("Gemm: C not constant")
                bias = (float(attr(node, "beta", 1.0)) * c).astype(np.float32)
        axis = 1 if opts["per_channel"] else None
        scales = weight_scales(w, axis)
        w_q = quantize_weight(w, scales, axis)
        y, x_scale = self._integer_op(model, graph, "MatMulInteger", x, w_q,
                                      np.zeros(w.shape[1] if axis is not None else (), np.int8))
        scale = (scales * alpha).astype(np.float32)
        self._rescale(model, graph, y, x_scale, scale, bias, node)
        result.rewrite(f"{node.op}→MatMulInteger")

    # --- Conv -----------------------------------------------------------------------------
    def _conv(self, model, graph, node, opts, result) -> None:
        x, w = node.inputs[0], const_value(node.inputs[1])
        if const_value(x) is not None or w is None or w.dtype != np.float32:
            return result.skip("Conv: weight not a float constant")
        bias = None
        if len(node.inputs) > 2:
            bias = const_value(node.inputs[2])
            if bias is None:
                return result.skip("Conv: bias not constant")
        axis = 0 if opts["per_channel"] else None
        scales = weight_scales(w, axis)
        w_q = quantize_weight(w, scales, axis)
        attrs = {k: v for k, v in node.attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape",
                                                            "pads", "strides")}
        y, x_scale = self._integer_op(model, graph, "ConvInteger", x, w_q, np.zeros((), np.int8), attrs)
        shape = [1, -1] + [1] * (w.ndim - 2)
        scale = scales.reshape(shape) if axis is not None else scales
        bias = bias.reshape(shape).astype(np.float32) if bias is not None else None
        self._rescale(model, graph, y, x_scale, scale, bias, node)
        result.rewrite("Conv→ConvInteger")

    # --- shared ---------------------------------------------------------------------------
    def _integer_op(self, model, graph, op, x, w_q, w_zero, attrs=None) -> tuple:
        """``DynamicQuantizeLinear(x)`` and the integer op; returns (int32 output, x scale)."""
        fresh = model.fresh_name
        x_q = gs.Variable(fresh("dynamic/x_q"), dtype=np.uint8)
        x_scale = gs.Variable(fresh("dynamic/x_scale"), dtype=np.float32, shape=[])
        x_zero = gs.Variable(fresh("dynamic/x_zp"), dtype=np.uint8, shape=[])
        graph.nodes.append(gs.Node("DynamicQuantizeLinear", name=fresh("dynamic/DynamicQuantizeLinear"),
                                   inputs=[x], outputs=[x_q, x_scale, x_zero]))
        y = gs.Variable(fresh("dynamic/y_int32"), dtype=np.int32)
        graph.nodes.append(gs.Node(op, name=fresh(f"dynamic/{op}"), attrs=attrs or {},
                                   inputs=[x_q, new_constant(model, "dynamic/w_q", w_q), x_zero,
                                           new_constant(model, "dynamic/w_zp", w_zero)], outputs=[y]))
        return y, x_scale

    def _rescale(self, model, graph, y, x_scale, w_scale, bias, node) -> None:
        """``out = float(y) · (s_x · s_w) (+ bias)``; ``node`` loses its output to the new chain."""
        fresh = model.fresh_name
        y_f = gs.Variable(fresh("dynamic/y_float"), dtype=np.float32)
        scale = gs.Variable(fresh("dynamic/scale"), dtype=np.float32)
        graph.nodes.append(gs.Node("Cast", name=fresh("dynamic/Cast"), attrs={"to": onnx.TensorProto.FLOAT},
                                   inputs=[y], outputs=[y_f]))
        graph.nodes.append(gs.Node("Mul", name=fresh("dynamic/Mul"),
                                   inputs=[x_scale, new_constant(model, "dynamic/w_scale", w_scale)],
                                   outputs=[scale]))
        out = node.outputs[0]
        node.outputs.clear()
        if bias is None:
            graph.nodes.append(gs.Node("Mul", name=fresh("dynamic/Mul"), inputs=[y_f, scale], outputs=[out]))
            return
        scaled = gs.Variable(fresh("dynamic/scaled"), dtype=np.float32)
        graph.nodes.append(gs.Node("Mul", name=fresh("dynamic/Mul"), inputs=[y_f, scale], outputs=[scaled]))
        graph.nodes.append(gs.Node("Add", name=fresh("dynamic/Add"),
                                   inputs=[scaled, new_constant(model, "dynamic/bias", bias)], outputs=[out]))
