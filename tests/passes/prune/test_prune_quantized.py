"""prune's lossless strip on models that arrive quantized (issue 15 item 13): Q/DQ (QAT-style and
ONNX Runtime's quantize_static), quantize_dynamic's DynamicQuantizeLinear + ConvInteger /
MatMulInteger, and QLinearConv. The strip must leave them equal to the input (bit for bit here:
nothing it may touch is quantized), and a float layer whose constant channels reach a quantizer
(whose scale is computed over the whole tensor) must keep them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

RNG = np.random.default_rng(3)


def weight(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def float_model(zero=(1, 5)) -> onnx.ModelProto:
    """x → c1 (output channels ``zero`` all-zero weights, bias 0.5) → Relu → c2 → Relu → c3 → y."""
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 4, 8, 8] x) => (float[1, 6, 8, 8] y) {
      c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
      r1 = Relu (c1)
      c2 = Conv (r1, w2, b2)
      r2 = Relu (c2)
      y = Conv (r2, w3, b3)
    }"""
    model = onnx.parser.parse_model(text)
    w1, b1 = weight(8, 4, 3, 3), weight(8)
    w1[list(zero)] = 0
    b1[list(zero)] = 0.5
    inits = {"w1": w1, "b1": b1, "w2": weight(8, 8, 1, 1), "b2": weight(8), "w3": weight(6, 8, 1, 1),
             "b3": weight(6)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    for node, name in zip(model.graph.node, ("c1", "r1", "c2", "r2", "c3")):
        node.name = name
    onnx.checker.check_model(model, full_check=True)
    return model


def strip(model):
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    out, report = run_pipeline(model, parse_pass_list("prune"), feed, verify_samples=2)
    return out, report.passes[-1]


def feeds(seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((1, 4, 8, 8)).astype(np.float32)}


def assert_equal_outputs(a, b):
    for seed in range(3):
        for x, y in zip(run_ort(a, feeds(seed)), run_ort(b, feeds(seed))):
            np.testing.assert_array_equal(y, x)


def ort_quantized(tmp_path, kind, **kwargs) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static

    src, dst = tmp_path / "f.onnx", tmp_path / f"{kind}.onnx"
    onnx.save(float_model(), src)
    if kind == "dynamic":
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, **kwargs)
    else:
        class Reader(CalibrationDataReader):
            def __init__(self):
                self.data = iter([feeds(s) for s in range(4)])

            def get_next(self):
                return next(self.data, None)

        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ if kind == "qdq"
                        else QuantFormat.QOperator, **kwargs)
    model = onnx.load(str(dst))
    onnx.checker.check_model(model, full_check=True)
    return model


def test_float_model_strips():
    """The float model does strip (so the quantized cases below test something)."""
    out, rep = strip(float_model())
    assert rep.rewrites["strip constant channel"] == 2


@pytest.mark.parametrize("kind", ["dynamic", "qdq", "qoperator"])
def test_fully_quantized_passes_through_equal(tmp_path, kind):
    model = ort_quantized(tmp_path, kind)
    out, rep = strip(model)
    assert not rep.rewrites
    assert sorted(n.op_type for n in out.graph.node) == sorted(n.op_type for n in model.graph.node)
    assert_equal_outputs(model, out)


@pytest.mark.parametrize("kind", ["dynamic", "qdq"])
def test_constant_channels_feeding_a_quantizer_are_kept(tmp_path, kind):
    """c1 float, c2 and c3 quantized: the constant channels of c1 reach a quantizer whose range
    (hence scale) spans every channel, so removing them would change the integers."""
    model = ort_quantized(tmp_path, kind, nodes_to_quantize=["c2", "c3"])
    assert any(n.op_type == "Conv" and n.name == "c1" for n in model.graph.node)
    out, rep = strip(model)
    assert not rep.rewrites
    assert_equal_outputs(model, out)


QDQ_TEXT = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] y) <float s = {0.05}, uint8 z = {128}, float sw = {0.01},
                                                 int8 zw = {0}> {
  q = QuantizeLinear (x, s, z)
  d = DequantizeLinear (q, s, z)
  wd = DequantizeLinear (wq, sw, zw)
  c = Conv <pads = [1, 1, 1, 1]> (d, wd, b)
  r = Relu (c)
  q2 = QuantizeLinear (r, s, z)
  y = DequantizeLinear (q2, s, z)
}"""


def test_qat_text_model_with_zero_int_channels_passes_through():
    """A QAT-style export: the integer weight has all-zero channels behind a DequantizeLinear."""
    model = onnx.parser.parse_model(QDQ_TEXT)
    wq = RNG.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    wq[[2, 3]] = 0
    model.graph.initializer.extend([numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(weight(8), "b")])
    onnx.checker.check_model(model, full_check=True)
    out, rep = strip(model)
    assert not rep.rewrites
    assert_equal_outputs(model, out)


@pytest.mark.parametrize("kind", ["dynamic", "qdq"])
def test_strip_upstream_of_a_quantizer_is_exact(tmp_path, kind):
    """c1 and c2 float, c3 quantized: c1's constant channels fold into c2's bias, whose output
    reaches a quantizer; a float rounding change there moves integers by a step."""
    model = ort_quantized(tmp_path, kind, nodes_to_quantize=["c3"])
    out, rep = strip(model)
    assert rep.rewrites["strip constant channel"] == 2
    assert rep.verification["status"] == "ok"
    for seed in range(3):  # c2's sums are reordered: float rounding, no integer step
        for x, y in zip(run_ort(model, feeds(seed)), run_ort(out, feeds(seed))):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5)
