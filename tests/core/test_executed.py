"""executed: what ONNX Runtime runs after its optimisations — int8 kernels vs float compute,
the share of MACs and weights in int8, and the DequantizeLinear nodes it left (tiny QDQ graphs)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from conftest import parse

from onnxslim_kit.errors import UserError
from onnxslim_kit.executed import (executed, executed_line, executed_summary, has_quantized_ops,
                                   optimized_graph)
from onnxslim_kit.model import load_proto

C_IN, C_OUT, SIDE, K = 4, 8, 16, 3
CONV_MACS = C_OUT * SIDE * SIDE * C_IN * K * K  # |Y| · C_in · k · k (pads 1: Y is 16×16)
WEIGHTS = C_OUT * C_IN * K * K


def _ints(a: np.ndarray) -> str:
    return "{" + ", ".join(str(int(v)) for v in a.ravel()) + "}"


def _floats(a: np.ndarray) -> str:
    return "{" + ", ".join(f"{v:.6f}" for v in a.ravel()) + "}"


def qdq_conv(tail: str, batch: str = "1") -> onnx.ModelProto:
    """x → Q → DQ → Conv(DQ(int8 w)) → ``tail`` (which makes ``a`` from ``c``) → Q → DQ → y."""
    wq = np.random.default_rng(0).integers(-127, 128, (C_OUT, C_IN, K, K)).astype(np.int8)
    return parse(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[{batch}, {C_IN}, {SIDE}, {SIDE}] x) => (float[{batch}, {C_OUT}, {SIDE}, {SIDE}] y)
 <int8[{C_OUT}, {C_IN}, {K}, {K}] wq = {_ints(wq)}, float ws = {{0.02}}, int8 wz = {{0}}, float xs = {{0.02}},
  uint8 xz = {{128}}, float ys = {{0.05}}, uint8 yz = {{128}}> {{
  xq = QuantizeLinear(x, xs, xz)
  xd = DequantizeLinear(xq, xs, xz)
  wd = DequantizeLinear(wq, ws, wz)
  c = Conv<pads = [1, 1, 1, 1]>(xd, wd)
  {tail}
  yq = QuantizeLinear(a, ys, yz)
  y = DequantizeLinear(yq, ys, yz)
}}""")


FUSED = "a = Identity(c)"  # DQ → Conv → Q: ORT's QLinearConv pattern
HARDSWISH_AFTER_CONV = "a = HardSwish(c)"  # Q after the hard-swish (NNCF's placement): the Conv stays float
HARDSWISH_DETOUR = "cq = QuantizeLinear(c, ys, yz)\n  cd = DequantizeLinear(cq, ys, yz)\n  a = HardSwish(cd)"


def float_conv():
    w = np.random.default_rng(1).standard_normal((C_OUT, C_IN, K, K)).astype(np.float32)
    return parse(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, {C_IN}, {SIDE}, {SIDE}] x) => (float[1, {C_OUT}, {SIDE}, {SIDE}] y)
 <float[{C_OUT}, {C_IN}, {K}, {K}] w = {_floats(w)}> {{
  c = Conv<pads = [1, 1, 1, 1]>(x, w)
  y = Relu(c)
}}""")


def test_a_qdq_conv_that_ort_fuses_runs_all_its_macs_in_int8():
    summary = executed(qdq_conv(FUSED))
    assert summary["int8_ops"] == {"QLinearConv": 1}
    assert summary["float_ops"] == {}
    assert summary["macs_int8"] == CONV_MACS and summary["macs_float"] == 0
    assert summary["int8_mac_share"] == 1.0
    assert summary["weights_int8"] == WEIGHTS and summary["int8_weight_share"] == 1.0
    assert summary["macs_unresolved"] == 0
    assert summary["unfused"] == [] and summary["unfused_by_op"] == {}


def test_a_conv_whose_quantization_sits_after_the_hard_swish_runs_float_and_is_reported():
    summary = executed(qdq_conv(HARDSWISH_AFTER_CONV))
    assert summary["int8_ops"] == {}
    assert sum(summary["float_ops"].values()) == 1 and set(summary["float_ops"]) <= {"Conv", "FusedConv"}
    assert summary["macs_float"] == CONV_MACS and summary["int8_mac_share"] == 0.0
    assert summary["weights_float"] == WEIGHTS and summary["int8_weight_share"] == 0.0
    assert summary["float_ops_with_int8_weights"] == 1  # int8 weights, float compute
    by_tensor = {e["tensor"]: e for e in summary["unfused"]}
    assert set(by_tensor) == {"xq", "wq"}
    assert by_tensor["wq"]["kind"] == "weight" and by_tensor["xq"]["kind"] == "activation"
    assert {e["feeds"] for e in summary["unfused"]} <= {"Conv", "FusedConv"}
    for entry in summary["unfused"]:  # the float stretch: the Conv and the hard-swish before the Q
        assert entry["requantized"] and entry["detour"].startswith(f"DequantizeLinear → {entry['feeds']} → ")
        assert entry["detour"].endswith(" → QuantizeLinear")
    assert "DequantizeLinear left → " in executed_line(summary)


def test_a_hard_swish_between_dequantize_and_quantize_is_a_float_detour():
    summary = executed(qdq_conv(HARDSWISH_DETOUR))
    assert summary["int8_ops"] == {"QLinearConv": 1} and summary["int8_mac_share"] == 1.0
    detours = [e for e in summary["unfused"] if e["tensor"] == "cq"]
    assert detours and all(e["requantized"] and e["kind"] == "activation" for e in detours)
    assert {e["feeds"] for e in detours} <= {"HardSwish", "HardSigmoid", "Mul"}  # ORT may expand HardSwish
    for entry in detours:
        assert entry["detour"].startswith(f"DequantizeLinear → {entry['feeds']} → ")
        assert entry["detour"].endswith(" → QuantizeLinear")
    assert sum(summary["detours"].values()) == len(detours)


def test_a_float_model_runs_nothing_in_int8():
    summary = executed(float_conv())
    assert summary["int8_ops"] == {} and summary["qdq_ops"] == {}
    assert summary["macs_float"] == CONV_MACS and summary["int8_mac_share"] == 0.0
    assert summary["int8_weight_share"] == 0.0 and summary["unfused"] == []
    assert not has_quantized_ops(float_conv()) and has_quantized_ops(qdq_conv(FUSED))


def test_without_optimizations_a_qdq_conv_runs_float():
    summary = executed(qdq_conv(FUSED), opt_level="disable")
    assert summary["int8_ops"] == {} and summary["int8_mac_share"] == 0.0
    assert summary["qdq_ops"] == {"QuantizeLinear": 2, "DequantizeLinear": 3}


def test_dynamic_quantization_of_a_matmul_runs_in_an_int8_kernel():
    wq = np.random.default_rng(2).integers(-127, 128, (16, 8)).astype(np.int8)
    model = parse(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 16] x) => (float[2, 8] y) <int8[16, 8] wq = {_ints(wq)}, int8 wz = {{0}}, float ws = {{0.01}}> {{
  xq, xs, xz = DynamicQuantizeLinear(x)
  acc = MatMulInteger(xq, wq, xz, wz)
  accf = Cast<to = 1>(acc)
  s = Mul(xs, ws)
  y = Mul(accf, s)
}}""")
    summary = executed(model)
    assert sum(summary["int8_ops"].values()) == 1 and summary["float_ops"] == {}
    assert summary["macs_int8"] == 2 * 8 * 16 and summary["int8_mac_share"] == 1.0
    assert summary["weights_int8"] == 16 * 8


def test_a_file_with_external_data_gives_the_same_counts(tmp_path):
    model = qdq_conv(FUSED)
    for tensor in model.graph.initializer:  # raw bytes: only those go to external data
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
    from_proto = executed(model)
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    assert any(p.name != "m.onnx" for p in tmp_path.iterdir())  # the weights went to a data file
    assert executed(path) == from_proto
    assert executed(load_proto(path, lazy=True)) == from_proto  # weights left on disk, mapped by ORT


def test_the_optimized_graph_keeps_no_layout_rewrites():
    graph = optimized_graph(float_conv()).graph
    assert not any(n.domain == "com.microsoft.nchwc" for n in graph.node)


def test_the_report_summary_fixes_a_dynamic_batch_from_a_sample():
    model = qdq_conv(FUSED, batch="N")
    assert executed(model)["macs_unresolved"] == 1  # no shapes: the Conv's output is unknown
    summary = executed_summary(model)  # a sample generated from the input specs (batch 1)
    assert summary["macs_unresolved"] == 0 and summary["macs_int8"] == CONV_MACS
    sample = {"x": np.zeros((2, C_IN, SIDE, SIDE), np.float32)}
    assert executed_summary(model, sample)["macs_int8"] == 2 * CONV_MACS


def test_summary_of_a_model_ort_refuses_is_an_error_entry():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    node = onnx.helper.make_node("Frobnicate", ["x"], ["y"], domain="custom.unknown")
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "g", [x], [y]), opset_imports=[
        onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("custom.unknown", 1)])
    summary = executed_summary(model)
    assert summary["error"].startswith("ONNX Runtime: ")
    assert executed_line(summary).startswith("ORT runs: unknown")


def test_a_bad_opt_level_is_a_user_error():
    with pytest.raises(UserError, match="opt level 'fast'"):
        executed(float_conv(), opt_level="fast")
