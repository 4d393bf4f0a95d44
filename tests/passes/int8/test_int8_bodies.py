"""int8 storage of If/Loop/Scan body weights: int8 in the file, float compute, target-checked."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import run_ort
from onnx import numpy_helper
from test_int8 import quantize


def if_model(rng) -> onnx.ModelProto:
    """``y = If(c) {MatMul(x, W1) | Relu(x) · W2}`` with both weights only in the branches."""
    w1 = rng.standard_normal((64, 32)).astype(np.float32)
    w2 = rng.standard_normal((64, 32)).astype(np.float32)

    def branch(name, nodes, weight):
        out = onnx.helper.make_tensor_value_info(name + "_y", onnx.TensorProto.FLOAT, [4, 32])
        return onnx.helper.make_graph(nodes, name, [], [out], [numpy_helper.from_array(weight, name + "_W")])

    then_g = branch("t", [onnx.helper.make_node("MatMul", ["x", "t_W"], ["t_y"])], w1)
    else_g = branch("e", [onnx.helper.make_node("Relu", ["x"], ["r"]),
                          onnx.helper.make_node("MatMul", ["r", "e_W"], ["e_y"])], w2)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64]),
         onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 32])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def body_tensors(model, data_type) -> list:
    return [t for node in model.graph.node for a in node.attribute if a.type == onnx.AttributeProto.GRAPH
            for t in a.g.initializer if t.data_type == data_type]


def test_body_weights_are_stored_int8_and_computed_in_float(rng):
    model = if_model(rng)
    out, entry = quantize(model)
    assert entry.rewrites["MatMul body weight→int8 storage"] == 2
    assert len(body_tensors(out, onnx.TensorProto.INT8)) == 2
    assert not [t for t in body_tensors(out, onnx.TensorProto.FLOAT) if np.prod(t.dims) >= 1024]
    assert out.ByteSize() < 0.35 * model.ByteSize()
    x = rng.standard_normal((4, 64)).astype(np.float32)
    for cond in (True, False):
        want = run_ort(model, {"x": x, "c": np.array(cond)})[0]
        got = run_ort(out, {"x": x, "c": np.array(cond)})[0]
        cos = float((want * got).sum() / np.linalg.norm(want) / np.linalg.norm(got))
        assert 0.999 < cos < 1.0  # int8 rounding: close, not equal


def test_body_weights_stay_float_when_the_target_is_missed_or_off(rng):
    model = if_model(rng)
    strict, entry = quantize(model, "target=cos:0.9999999")
    assert not body_tensors(strict, onnx.TensorProto.INT8)
    assert any(reason.startswith("body weights kept float") for reason in entry.skipped)
    off, _ = quantize(model, "bodies=false")
    assert not body_tensors(off, onnx.TensorProto.INT8)


def test_onnx_runtime_folds_the_body_decoders(rng, tmp_path):
    """The Cast + Mul of a body weight are folded when the session starts: no per-run cost."""
    import onnxruntime as ort

    out, _ = quantize(if_model(rng))
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "opt.onnx"))
    body_ops = [n.op_type for node in optimized.graph.node for a in node.attribute
                if a.type == onnx.AttributeProto.GRAPH for n in a.g.node]
    assert "MatMul" in body_ops and "Cast" not in body_ops and "Mul" not in body_ops
