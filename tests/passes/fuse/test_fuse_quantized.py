"""``fuse`` on models that arrive quantized (issue 15 item 13): QAT-style Q/DQ, ONNX Runtime's
quantize_static (QDQ and QOperator: QLinearConv) and quantize_dynamic (DynamicQuantizeLinear +
ConvInteger / MatMulInteger). They must come out verified equal, checker-valid, with their
integer weights and quantize ops kept.

A quantizer rounds: QuantizeLinear ``q = round(x/s) + z``, DynamicQuantizeLinear the same with
``s = (max x − min x)/255`` taken from ``x`` itself. A rewrite that is exact in real numbers but
not bit for bit (BatchNormalization as Mul + Add, a layer fold, HardSwish chains) moves ``x``
by an ulp, which can move an integer a step and the output by ``s``: measured below, a BN
before a DynamicQuantizeLinear rewritten as Mul + Add moves ``y`` by 7.4 and verification
rolls the whole pass back (the dynamically quantized PP-OCRv4 recognizer: 0.023 at the
softmax, nothing simplified)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

RNG = np.random.default_rng(5)


def weight(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def fuse(model, samples=2):
    feed = CalibrationFeed(input_specs(model), None, num_samples=samples)
    out, report = run_pipeline(model, parse_pass_list("fuse"), feed, verify_samples=samples)
    onnx.checker.check_model(out, full_check=True)
    return out, report.passes[-1]


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
             "QLinearConv", "QLinearMatMul"}


def quant_ops(model) -> Counter:
    return Counter({op: n for op, n in ops(model).items() if op in QUANT_OPS})


def integer_weights(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) and len(t.dims) >= 2}


def assert_equal_outputs(a, b, shape, seeds=3, exact=True):
    """Outputs bit-equal (``exact``) or within the lossless tolerance on ``seeds`` inputs."""
    for seed in range(seeds):
        x = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
        for want, got in zip(run_ort(a, x), run_ort(b, x)):
            if exact:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def float_model(xshape="N, 3, 16, 16", yshape="N, 10") -> onnx.ModelProto:
    """Conv → BN → Relu → Conv → Relu → GlobalAveragePool → Flatten → MatMul + Add (a small
    classifier with a foldable BN, symbolic batch)."""
    text = f"""<ir_version: 8, opset_import: ["" : 13]>
    g (float[{xshape}] x) => (float[{yshape}] y) {{
      c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
      n1 = BatchNormalization (c1, g1, be1, mu1, va1)
      r1 = Relu (n1)
      c2 = Conv (r1, w2, b2)
      r2 = Relu (c2)
      p = GlobalAveragePool (r2)
      f = Flatten (p)
      m = MatMul (f, w3)
      y = Add (m, b3)
    }}"""
    model = onnx.parser.parse_model(text)
    inits = {"w1": weight(8, 3, 3, 3), "b1": weight(8), "g1": 1 + weight(8), "be1": weight(8), "mu1": weight(8),
             "va1": 1 + np.abs(weight(8)), "w2": weight(16, 8, 1, 1), "b2": weight(16), "w3": weight(16, 10),
             "b3": weight(10)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_quantized(tmp_path, kind) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static

    src, dst = tmp_path / "f.onnx", tmp_path / f"{kind}.onnx"
    onnx.save(float_model(), src)
    if kind.startswith("dynamic"):
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8 if kind == "dynamic_u8" else QuantType.QInt8)
    else:
        class Reader(CalibrationDataReader):
            def __init__(self):
                rng = np.random.default_rng(1)
                self.data = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

            def get_next(self):
                return next(self.data, None)

        quantize_static(str(src), str(dst), Reader(),
                        quant_format=QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator)
    model = onnx.load(str(dst))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("kind", ["dynamic", "dynamic_u8", "qdq", "qoperator"])
def test_ort_quantized_models_pass_through_equal(tmp_path, kind):
    model = ort_quantized(tmp_path, kind)
    assert quant_ops(model)
    out, rep = fuse(model)
    assert rep.verification["status"] == "ok"
    assert quant_ops(out) == quant_ops(model)
    before, after = integer_weights(model), integer_weights(out)
    assert sorted(map(str, (v.shape for v in after.values()))) == sorted(map(str, (v.shape for v in before.values())))
    assert all(any(np.array_equal(v, w) for w in before.values()) for v in after.values())
    assert [tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim) for v in out.graph.output] == \
        [tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim) for v in model.graph.output]
    assert_equal_outputs(model, out, (1, 3, 16, 16), exact=False)  # bit-equal: test_quantize_dynamic_output_is_bit_equal


QAT = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] y) <float s = {0.05}, uint8 z = {128}, float sw = {0.01},
                                                 int8 zw = {0}> {
  q = QuantizeLinear (x, s, z)
  d = DequantizeLinear (q, s, z)
  wd = DequantizeLinear (wq, sw, zw)
  c = Conv <pads = [1, 1, 1, 1]> (d, wd, b)
  i = Identity (c)
  r = Relu (i)
  q2 = QuantizeLinear (r, s, z)
  y = DequantizeLinear (q2, s, z)
}"""


def test_qat_export_keeps_its_integer_weights():
    """DequantizeLinear of a constant int8 weight is not folded to float (the model would grow 4×
    and ORT would lose its QLinearConv); the Identity goes, outputs are bit-equal."""
    model = onnx.parser.parse_model(QAT)
    wq = RNG.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    model.graph.initializer.extend([numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(weight(8), "b")])
    onnx.checker.check_model(model, full_check=True)
    out, rep = fuse(model)
    assert rep.rewrites["identity removed"] == 1
    assert quant_ops(out) == quant_ops(model)
    assert np.array_equal(integer_weights(out)["wq"], wq)
    assert_equal_outputs(model, out, (1, 4, 8, 8))


BN_BEFORE_DQL = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 16, 32, 32] x) => (float[1, 16, 32, 32] y) {
  b = BatchNormalization (x, g, be, mu, va)
  q, s, z = DynamicQuantizeLinear (b)
  c = ConvInteger (q, wq, z)
  f = Cast <to = 1> (c)
  y = Mul (f, s)
}"""


def test_inexact_rewrite_before_a_dynamic_quantizer_is_not_made():
    """BN with nothing to fold into, before DynamicQuantizeLinear: as Mul + Add it differs by an
    ulp, the quantizer moves integers a step (y by 7.4) and fuse was rolled back. Now the BN
    stays (counted reason) and the pass verifies equal, bit for bit."""
    model = onnx.parser.parse_model(BN_BEFORE_DQL)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in {
        "g": (rng.random(16) + 0.5).astype(np.float32), "be": rng.standard_normal(16).astype(np.float32),
        "mu": rng.standard_normal(16).astype(np.float32), "va": (rng.random(16) + 0.5).astype(np.float32),
        "wq": rng.integers(-127, 128, (16, 16, 1, 1)).astype(np.int8)}.items())
    onnx.checker.check_model(model, full_check=True)
    out, rep = fuse(model, samples=4)
    assert rep.verification is None or rep.verification["status"] == "ok"  # None: nothing to verify
    assert ops(out)["BatchNormalization"] == 1 and not rep.rewrites
    assert sum(n for reason, n in rep.skipped.items() if "quantizer" in reason) == 1
    assert_equal_outputs(model, out, (1, 16, 32, 32))


def test_quantize_dynamic_output_is_bit_equal(tmp_path):
    """quantize_dynamic leaves the BN after a ConvInteger (nothing to fold into); as Mul + Add
    before the next DynamicQuantizeLinear it moved the output by an ulp (within tolerance
    here, a quantization step on larger models). It stays, and the outputs are bit-equal."""
    model = ort_quantized(tmp_path, "dynamic_u8")
    out, rep = fuse(model)
    assert ops(out)["BatchNormalization"] == ops(model)["BatchNormalization"] == 1
    assert_equal_outputs(model, out, (1, 3, 16, 16))


def test_shapeless_value_info_of_an_output_does_not_unshape_it(tmp_path):
    """The OCR model of issue 15: a ``value_info`` entry naming the graph output, with a type and
    no shape (valid: the checker reads the output's own type). onnx-graphsurgeon let it override
    the output's type, the written output had no shape, and the checker rejected every result
    ("Field 'shape' of 'type' is required but missing"): fuse rolled back, nothing simplified."""
    model = ort_quantized(tmp_path, "dynamic")
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(model.graph.output[0].name,
                                                                     onnx.TensorProto.FLOAT, None))
    onnx.checker.check_model(model, full_check=True)
    out, rep = fuse(model)
    assert rep.verification["status"] == "ok", rep.verification["message"]
    assert [d.dim_param or d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == ["N", 10]
