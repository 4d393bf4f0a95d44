"""Dynamic int8 is exact integer arithmetic on every x86 CPU: weights stored as uint8 with zero
point 128 (the int8 codes + 128), so ONNX Runtime runs u8·u8 kernels, never the u8·s8
``vpmaddubsw`` path that saturates int16 pair sums on AVX2 / AVX-512 CPUs without VNNI
(``benchmarks/results/int8-saturation-2026-12-02.md``). Data "large in range": uniform
activations and weights, whose codes fill [0, 255] and reach ±127 — the worst case for the
saturating kernel (cos ≈ 0.98 there with int8 weights)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import numpy_helper
from test_int8 import build, ops, optimized_ops

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.metrics import cosine
from onnxslim_kit.passes._quant.dynamic import WEIGHT_OFFSET, unsigned_weight
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline
from onnxslim_kit.runtime import make_session


def uniform(rng, *shape, scale=1.0):
    return (rng.uniform(-1.0, 1.0, shape) * scale).astype(np.float32)


def dynamic(model, options: str = ""):
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    out, report = run_pipeline(model, parse_pass_list(f"dynamic({options})" if options else "dynamic"), feed)
    return out, report.passes[-1]


def run_optimized(model, feeds):
    """ORT with its graph optimisations (DynamicQuantizeMatMul fused), one thread."""
    return make_session(model, "all", threads=1).run(None, feeds)


def exact_matmul(out: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The dynamic chain of a one-MatMul model computed exactly: DynamicQuantizeLinear in numpy
    (round half to even, saturate), the integer product in int64, the rescale in float64."""
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    node = next(n for n in out.graph.node if n.op_type == "MatMulInteger")
    w_q, w_zero = inits[node.input[1]].astype(np.int64), inits[node.input[3]].astype(np.int64)
    mul = next(n for n in out.graph.node if n.op_type == "Mul" and any(i in inits for i in n.input))
    w_scale = next(inits[i] for i in mul.input if i in inits).astype(np.float64)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    s_x = np.float32((hi - lo) / 255.0)
    z_x = int(np.clip(np.rint(-lo / s_x), 0, 255))
    x_q = np.clip(np.rint(x / s_x) + z_x, 0, 255).astype(np.int64)
    return ((x_q - z_x) @ (w_q - w_zero)).astype(np.float64) * float(s_x) * w_scale


@pytest.mark.parametrize("k", [64, 512])
def test_large_range_matmul_keeps_cosine(k, tmp_path):
    rng = np.random.default_rng(k)
    model = build("y = MatMul (x, w1)", f"float[32, {k}] x", {"w1": uniform(rng, k, 96)})
    out, rep = dynamic(model)
    assert rep.rewrites["MatMul→MatMulInteger"] == 1
    assert optimized_ops(out, tmp_path)["DynamicQuantizeMatMul"] == 1
    x = {"x": uniform(rng, 32, k, scale=4.0)}
    ref = run_ort(model, x)[0]
    for got in (run_ort(out, x)[0], run_optimized(out, x)[0]):  # MatMulInteger alone, and fused
        assert cosine(ref, got) >= 0.999
        assert np.abs(ref - got).max() < 0.02 * np.abs(ref).max()


@pytest.mark.parametrize("trans_b", [0, 1])
def test_large_range_gemm_with_bias_keeps_cosine(trans_b):
    rng = np.random.default_rng(7 + trans_b)
    weight = uniform(rng, 128, 64)
    model = build(f"y = Gemm <transB = {trans_b}, alpha = 0.5> (x, wg, bg)", "float[16, 128] x",
                  {"wg": weight.T.copy() if trans_b else weight, "bg": uniform(rng, 64)})
    out, rep = dynamic(model)
    assert rep.rewrites["Gemm→MatMulInteger"] == 1 and ops(out)["Gemm"] == 0
    x = {"x": uniform(rng, 16, 128, scale=3.0)}
    ref = run_ort(model, x)[0]
    assert cosine(ref, run_optimized(out, x)[0]) >= 0.999
    assert cosine(ref, run_ort(out, x)[0]) >= 0.999


def test_kernel_is_exact_integer_arithmetic():
    # the outputs equal the same codes multiplied exactly: no saturation on any CPU
    rng = np.random.default_rng(11)
    model = build("y = MatMul (x, w1)", "float[24, 256] x", {"w1": uniform(rng, 256, 80)})
    out, _ = dynamic(model)
    x = uniform(rng, 24, 256, scale=2.0)
    want = exact_matmul(out, x)
    for got in (run_ort(out, {"x": x})[0], run_optimized(out, {"x": x})[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_weights_are_uint8_with_zero_point_128_on_the_int8_grid():
    rng = np.random.default_rng(5)
    weight = uniform(rng, 64, 48)
    out, _ = dynamic(build("y = MatMul (x, w1)", "float[4, 64] x", {"w1": weight}))
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    node = next(n for n in out.graph.node if n.op_type == "MatMulInteger")
    w_q, w_zero = inits[node.input[1]], inits[node.input[3]]
    assert w_q.dtype == np.uint8 and w_zero.dtype == np.uint8 and np.all(w_zero == WEIGHT_OFFSET)
    codes = w_q.astype(np.int16) - WEIGHT_OFFSET  # the symmetric int8 codes, [−127, 127]
    assert codes.min() >= -127 and np.all(np.abs(codes).max(axis=0) == 127)
    scale = np.abs(weight).max(axis=0) / 127.0  # per output column
    assert np.abs(codes * scale - weight).max() <= scale.max() / 2 + 1e-7


def test_unsigned_weight_keeps_the_values():
    codes = np.array([[-128, -127, 0], [1, 126, 127]], np.int8)
    u, z = unsigned_weight(codes, np.zeros(3, np.int8))
    assert u.dtype == np.uint8 and z.dtype == np.uint8
    assert np.array_equal(u.astype(np.int16) - z.astype(np.int16), codes.astype(np.int16))
    u, z = unsigned_weight(codes, np.int8(-3))  # a non-zero int8 zero point moves with the codes
    assert z.shape == () and np.array_equal(u.astype(np.int16) - int(z), codes.astype(np.int16) + 3)
    same, zero = unsigned_weight(u, z)  # uint8 input is already the encoding
    assert same is u and zero.dtype == np.uint8 and int(zero) == int(z)


def test_conv_integer_gets_uint8_weights_and_one_zero_point():
    rng = np.random.default_rng(3)
    model = build("y = Conv <pads = [1, 1, 1, 1]> (x, wc, bc)", "float[1, 8, 6, 6] x",
                  {"wc": uniform(rng, 16, 8, 3, 3), "bc": uniform(rng, 16)})
    out, rep = dynamic(model, "conv=true,min_weights=0")
    assert rep.rewrites["Conv→ConvInteger"] == 1
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    node = next(n for n in out.graph.node if n.op_type == "ConvInteger")
    assert inits[node.input[1]].dtype == np.uint8 and inits[node.input[3]].shape == ()
    x = {"x": uniform(rng, 1, 8, 6, 6, scale=3.0)}
    ref = run_ort(model, x)[0]
    assert cosine(ref, run_ort(out, x)[0]) >= 0.999 and cosine(ref, run_optimized(out, x)[0]) >= 0.999
