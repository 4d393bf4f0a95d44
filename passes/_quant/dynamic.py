"""Dynamic-range int8 MatMul, shared by the ``dynamic`` pass and the ``int8`` fallback ladder.

::

    x ──▶ MatMul(B) (+ C) ──▶ y
    x ──▶ DynamicQuantizeLinear ──▶ (x_q, s_x, z_x)
          MatMulInteger(x_q, B_q, z_x, 0) ──▶ Cast(float) ──▶ Mul(s_x · s_B) (──▶ Add(C)) ──▶ y

``B_q = round(B / s_B)`` symmetric int8 (``B`` as [K, N], ``s_B`` per output column or per
tensor). ONNX Runtime fuses this pattern into DynamicQuantizeMatMul. The activation range is
the tensor's own min/max at every run (uint8, asymmetric), so no calibration is needed and
outlier-free inputs keep their full resolution.

Weight encoding in the file: the int8 codes are stored as **uint8 with zero point 128**,
``B_u = B_q + 128``, ``z_B = 128`` (``B_u − z_B = B_q``: the same values, the same grid, no
rounding of its own). Why: with uint8 activations and int8 weights ONNX Runtime's MLAS runs
u8·s8 GEMMs on x86-64 CPUs with AVX2 or AVX-512 but without (AVX-)VNNI through
``vpmaddubsw``, which adds two products ``x_q·B_q`` into a *saturating* int16 —
``2 · 255 · 127 = 64770 > 32767`` — so the result depends on the CPU: cos 0.984 against float
on a [64, 768]·[768, 768] MatMul with uniform data on an AVX2 EPYC, where the same codes
computed exactly give 1 − 1.5e−5 (``benchmarks/results/int8-saturation-2026-12-02.md``).
u8·u8 takes MLAS's widening kernel (int16 operands, ``vpmaddwd`` into int32): exact on every
CPU. The alternatives measured: 7-bit weights (``reduce_range``, ``[−63, 63]``) are exact too
and as fast as int8, but double ``1 − cos`` on every CPU (one bit of weight resolution less);
detecting the CPU would make the output file depend on the machine that wrote it. The price:
the integer GEMM is 10–17 % slower than u8·s8 on AVX2 (still ~1.6× faster than float), and
ConvInteger with int8 weights falls to a slow path, about 7× slower than with uint8 (9.1 vs 1.3 ms).
The encoding is decided here, in :func:`integer_op`, so every caller gets it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import new_constant

WEIGHT_OFFSET = 128  # int8 code + 128 = uint8 code (zero point 0 → 128): u8·u8 kernels, exact on every CPU


def unsigned_weight(w_q: np.ndarray, w_zero) -> tuple:
    """(uint8 codes, uint8 zero point) with the same values ``w_q − w_zero`` as int8 ``w_q``;
    uint8 input is returned unchanged."""
    w_q, w_zero = np.asarray(w_q), np.asarray(w_zero)
    if w_q.dtype != np.int8:
        return w_q, w_zero
    return ((w_q.astype(np.int16) + WEIGHT_OFFSET).astype(np.uint8),
            (w_zero.astype(np.int16) + WEIGHT_OFFSET).astype(np.uint8))


def integer_op(model, graph, op: str, x, w_q, w_zero, attrs=None, prefix: str = "dynamic",
               signed: bool = False) -> tuple:
    """``DynamicQuantizeLinear(x)`` and the integer op; returns (int32 output, x scale, quantize node).
    int8 weights (``w_q``, ``w_zero``) are written as uint8 with the zero point moved by 128
    (:func:`unsigned_weight`, see the module docstring) unless ``signed`` (the ``dynamic`` pass's
    ``weights=s8``: int8 as given, u8·s8 kernels)."""
    if not signed:
        w_q, w_zero = unsigned_weight(w_q, w_zero)
    fresh = model.fresh_name
    x_q = gs.Variable(fresh(f"{prefix}/x_q"), dtype=np.uint8)
    x_scale = gs.Variable(fresh(f"{prefix}/x_scale"), dtype=np.float32, shape=[])
    x_zero = gs.Variable(fresh(f"{prefix}/x_zp"), dtype=np.uint8, shape=[])
    quantize = gs.Node("DynamicQuantizeLinear", name=fresh(f"{prefix}/DynamicQuantizeLinear"), inputs=[x],
                       outputs=[x_q, x_scale, x_zero])
    graph.nodes.append(quantize)
    y = gs.Variable(fresh(f"{prefix}/y_int32"), dtype=np.int32)
    graph.nodes.append(gs.Node(op, name=fresh(f"{prefix}/{op}"), attrs=attrs or {},
                               inputs=[x_q, new_constant(model, f"{prefix}/w_q", w_q), x_zero,
                                       new_constant(model, f"{prefix}/w_zp", w_zero)], outputs=[y]))
    return y, x_scale, quantize


def rescale(model, graph, y, x_scale, w_scale, bias, node, prefix: str = "dynamic") -> None:
    """``out = float(y) · (s_x · s_w) (+ bias)`` written to ``node``'s output; ``node`` loses it."""
    fresh = model.fresh_name
    y_f = gs.Variable(fresh(f"{prefix}/y_float"), dtype=np.float32)
    scale = gs.Variable(fresh(f"{prefix}/scale"), dtype=np.float32)
    graph.nodes.append(gs.Node("Cast", name=fresh(f"{prefix}/Cast"), attrs={"to": onnx.TensorProto.FLOAT},
                               inputs=[y], outputs=[y_f]))
    graph.nodes.append(gs.Node("Mul", name=fresh(f"{prefix}/Mul"),
                               inputs=[x_scale, new_constant(model, f"{prefix}/w_scale", w_scale)], outputs=[scale]))
    out = node.outputs[0]
    node.outputs.clear()
    if bias is None:
        graph.nodes.append(gs.Node("Mul", name=fresh(f"{prefix}/Mul"), inputs=[y_f, scale], outputs=[out]))
        return
    scaled = gs.Variable(fresh(f"{prefix}/scaled"), dtype=np.float32)
    graph.nodes.append(gs.Node("Mul", name=fresh(f"{prefix}/Mul"), inputs=[y_f, scale], outputs=[scaled]))
    graph.nodes.append(gs.Node("Add", name=fresh(f"{prefix}/Add"),
                               inputs=[scaled, new_constant(model, f"{prefix}/bias", bias)], outputs=[out]))


def dynamic_matmul(model, graph, node, x, w_q, w_scale, bias=None, prefix: str = "dynamic", signed: bool = False):
    """Replace ``node`` (MatMul / Gemm reading ``x``) by the dynamic chain; ``w_q`` [K, N] int8
    (symmetric, stored as uint8 with zero point 128 unless ``signed``), ``w_scale`` per column or
    scalar. ``node`` is left without outputs (dead; removed from ``graph.nodes``). Returns the
    DynamicQuantizeLinear node (the new reader of ``x``)."""
    zero = (np.full(np.shape(w_scale), WEIGHT_OFFSET, np.uint8) if np.asarray(w_q).dtype == np.uint8
            else np.zeros(np.shape(w_scale), np.int8))  # uint8 codes: the static MatMul encoding's, shared
    y, x_scale, quantize = integer_op(model, graph, "MatMulInteger", x, w_q, zero, prefix=prefix, signed=signed)
    rescale(model, graph, y, x_scale, np.asarray(w_scale, np.float32), bias, node, prefix=prefix)
    node.inputs.clear()
    graph.nodes.remove(node)
    return quantize
