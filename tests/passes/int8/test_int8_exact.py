"""Static int8 weights on the grid ONNX Runtime's fused kernels compute exactly on every CPU
(``passes/_quant/qdq.py``): full Conv 7-bit, depthwise Conv 8-bit, MatMul/Gemm uint8 with zero
point 128. On an x86-64 CPU without VNNI, 8-bit int8 weights of a full Conv made ORT's
QLinearConv differ from the same QDQ graph computed in float by over a hundred output steps
(u8·s8 pairs saturating an int16); there the equality test below fails for the old grid."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.runtime import make_session, run

from test_int8 import build, optimized_ops, quantize, w

RNG = np.random.default_rng(11)


def conv_stack():
    """Full 3×3 Conv → depthwise 3×3 Conv → full 1×1 Conv → Relu (the Q after it fuses all three)."""
    return build("a = Conv <pads = [1, 1, 1, 1]> (x, w1)\nb = Conv <group = 16, pads = [1, 1, 1, 1]> (a, w2)\n"
                 "c = Conv (b, w3)\nd = Relu (c)\ny = Conv (d, w4)", "float[1, 16, 8, 8] x",
                 {"w1": w(16, 16, 3, 3, rng=RNG), "w2": w(16, 1, 3, 3, rng=RNG), "w3": w(16, 16, 1, 1, rng=RNG),
                  "w4": w(4, 16, 1, 1, rng=RNG)})


def matmul_stack():
    """Uniform weights (most codes near ±127) and a signed input (activation codes around 128)."""
    def uniform(*shape):
        return RNG.uniform(-1, 1, shape).astype(np.float32)
    return build("a = MatMul (x, w1)\nb = Relu (a)\ny = MatMul (b, w2)", "float[8, 256] x",
                 {"w1": uniform(256, 64), "w2": uniform(64, 16)})


def weight_codes(out) -> dict:
    """Per float layer's input name: (codes, zero point or None) of the DequantizeLinear feeding it."""
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    found = {}
    for node in out.graph.node:
        if node.op_type in ("Conv", "MatMul") and node.input[1] in producers:
            dq = producers[node.input[1]]
            found[node.name or node.output[0]] = (inits[dq.input[0]], inits[dq.input[2]] if len(dq.input) > 2 else None)
    return found


def test_weight_grids_per_layer_kind():
    conv, _ = quantize(conv_stack(), "target=none")
    codes = list(weight_codes(conv).values())
    full, depthwise, pointwise = codes[0][0], codes[1][0], codes[2][0]
    assert full.dtype == np.int8 and np.abs(full).max() == 63
    assert depthwise.dtype == np.int8 and np.abs(depthwise).max() == 127
    assert pointwise.dtype == np.int8 and np.abs(pointwise).max() == 63
    mm, _ = quantize(matmul_stack(), "target=none")
    for values, zero in weight_codes(mm).values():
        assert values.dtype == np.uint8 and zero.dtype == np.uint8 and np.all(zero == 128)
        assert np.abs(values.astype(np.int16) - 128).max() == 127  # the full int8 grid, shifted


def _fused_equals_float(model, fused_op: str, tmp_path) -> None:
    out, _ = quantize(model, "target=none")
    assert optimized_ops(out, tmp_path)[fused_op] >= 1  # ORT does run integer kernels here
    samples = CalibrationFeed(input_specs(model), None, num_samples=8).take(8)
    executed, emulated = make_session(out, "all", threads=1), make_session(out, "disable", threads=1)
    for sample in samples:
        got, want = run(executed, sample)["y"], run(emulated, sample)["y"]
        scale = float(np.abs(want).max())
        assert np.abs(got - want).max() <= 1e-2 * scale  # a rounding step here and there; saturation: 15 %


def test_fused_conv_kernels_equal_the_qdq_graph(tmp_path):
    _fused_equals_float(conv_stack(), "QLinearConv", tmp_path)


def test_fused_matmul_kernels_equal_the_qdq_graph(tmp_path):
    _fused_equals_float(matmul_stack(), "QLinearMatMul", tmp_path)
