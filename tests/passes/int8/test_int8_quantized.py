"""``int8`` and ``dynamic`` on models that arrive quantized (issue 15 item 13): they pass through
untouched, with the counted reason and a note naming the quantized ops found — whatever the
kind: Q/DQ (QAT exports, quantize_static), quantize_dynamic's DynamicQuantizeLinear + ConvInteger
/ MatMulInteger, QLinearConv, com.microsoft ops such as DynamicQuantizeLSTM or MatMulNBits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import helper, numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

RNG = np.random.default_rng(7)
REASON = "already quantized (has Q/DQ or integer ops)"


def weight(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def run(model, spec):
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    out, report = run_pipeline(model, parse_pass_list(spec), feed, verify_samples=2)
    return out, report.passes[-1]


def assert_untouched(model, out, rep, note):
    assert not rep.modified and rep.skipped[REASON] == 1
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert any(n == note for n in rep.notes), rep.notes
    x = {i.name: np.random.default_rng(0).standard_normal(
        [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
    for want, got in zip(run_ort(model, x), run_ort(out, x)):
        np.testing.assert_array_equal(got, want)


def conv_mlp(tmp_path) -> str:
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 8, 8] x) => (float[1, 10] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
      r = Relu (c)
      p = GlobalAveragePool (r)
      f = Flatten (p)
      y = MatMul (f, w2)
    }"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in
                                   {"w1": weight(16, 3, 3, 3), "b1": weight(16), "w2": weight(16, 10)}.items())
    path = tmp_path / "f.onnx"
    onnx.save(model, path)
    return str(path)


@pytest.mark.parametrize("spec", ["int8(target=none)", "dynamic(conv=true,min_weights=0)"])
def test_quantize_dynamic_output_is_left_as_it_is_and_named(tmp_path, spec):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst = tmp_path / "q.onnx"
    quantize_dynamic(conv_mlp(tmp_path), str(dst), weight_type=QuantType.QInt8)
    model = onnx.load(str(dst))
    out, rep = run(model, spec)
    assert_untouched(model, out, rep, "already quantized: 2 DynamicQuantizeLinear, 1 ConvInteger, 1 MatMulInteger "
                     "— left as it is (start from the float model to quantize it again)")


LSTM_MATMUL = """<ir_version: 8, opset_import: ["" : 13]>
g (float[5, 1, 32] x) => (float[5, 1, 1, 64] y) {
  h = LSTM <hidden_size = 64> (x, wl, rl, bl)
  y = MatMul (h, wm)
}"""


@pytest.mark.parametrize("spec", ["int8(target=none)", "dynamic(min_weights=0)"])
def test_a_quantized_lstm_alone_counts_as_quantized(tmp_path, spec):
    """quantize_dynamic of the LSTM only: its one quantized op is com.microsoft
    DynamicQuantizeLSTM; the float MatMul after it was left float on purpose and stays so."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.parser.parse_model(LSTM_MATMUL)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in {
        "wl": weight(1, 256, 32), "rl": weight(1, 256, 64), "bl": weight(1, 512), "wm": weight(64, 64)}.items())
    model.graph.node[0].name = "lstm"
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, nodes_to_quantize=["lstm"])
    quantized = onnx.load(str(dst))
    assert {n.op_type for n in quantized.graph.node} == {"DynamicQuantizeLSTM", "MatMul"}
    out, rep = run(quantized, spec)
    assert_untouched(quantized, out, rep, "already quantized: 1 DynamicQuantizeLSTM — left as it is (start from "
                     "the float model to quantize it again)")


QAT = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] y) <float s = {0.05}, uint8 z = {128}, float sw = {0.01},
                                                 int8 zw = {0}> {
  q = QuantizeLinear (x, s, z)
  d = DequantizeLinear (q, s, z)
  wd = DequantizeLinear (wq, sw, zw)
  c = Conv <pads = [1, 1, 1, 1]> (d, wd, b)
  r = Relu (c)
  y = Conv (r, w2)
}"""


@pytest.mark.parametrize("spec", ["int8(target=none)", "dynamic(conv=true,min_weights=0)"])
def test_qat_export_with_a_float_layer_is_left_as_it_is(spec):
    """A QAT export keeping its last Conv float (on purpose, as QAT recipes do): not re-quantized."""
    model = onnx.parser.parse_model(QAT)
    model.graph.initializer.extend([
        numpy_helper.from_array(RNG.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "wq"),
        numpy_helper.from_array(weight(8), "b"), numpy_helper.from_array(weight(8, 8, 1, 1), "w2")])
    onnx.checker.check_model(model, full_check=True)
    out, rep = run(model, spec)
    assert_untouched(model, out, rep, "already quantized: 2 DequantizeLinear, 1 QuantizeLinear — left as it is "
                     "(start from the float model to quantize it again)")


def test_ms_domain_quantized_op_is_found():
    """A com.microsoft QLinear op (QLinearSigmoid) is a quantized op too."""
    from onnxslim_kit.model import Model
    from onnxslim_kit.passes._quant.qdq import quantized_ops

    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("QLinearSigmoid", ["q", "s", "z", "s", "z"], ["qs"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["qs", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    found = quantized_ops(Model.from_proto(model).all_graphs())
    assert dict(found) == {"QuantizeLinear": 1, "QLinearSigmoid": 1, "DequantizeLinear": 1}
    assert not quantized_ops(Model.from_proto(onnx.parser.parse_model(LSTM_MATMUL)).all_graphs())
