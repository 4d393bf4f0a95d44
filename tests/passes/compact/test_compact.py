"""``compact``: short internal names, model interface kept, outputs bit-identical."""

import numpy as np
import onnx
import pytest
from conftest import parse, run_ort

import onnxslim_kit
from onnxslim_kit.errors import UserError
from onnxslim_kit.passes.compact import short_names

MODEL = """<ir_version: 8, opset_import: ["" : 17]>
q (float[4, 8] the_input, bool the_flag) => (float[4, 8] the_output, float[4, 8] side_output)
  <float[8, 8] encoder_layer_0_attention_weight = {W}> {
    encoder_layer_0_attention_matmul_out = MatMul(the_input, encoder_layer_0_attention_weight)
    encoder_layer_0_relu_out = Relu(encoder_layer_0_attention_matmul_out)
    the_output = If(the_flag) <
        then_branch = then_branch_graph () => (float[4, 8] then_branch_result) {
            then_branch_result = Add(encoder_layer_0_relu_out, the_input) },
        else_branch = else_branch_graph () => (float[4, 8] else_branch_result) {
            else_branch_result = Mul(encoder_layer_0_relu_out, encoder_layer_0_attention_matmul_out) }
    >
    side_output = Neg(encoder_layer_0_relu_out)
}"""


def model_text():
    w = np.arange(64, dtype=np.float32).reshape(8, 8) / 64 - 0.5
    return parse(MODEL.replace("{W}", "{" + ", ".join(f"{v:.7g}" for v in w.ravel()) + "}"))


def all_names(graph):
    names = {t.name for t in graph.initializer} | {n.name for n in graph.node}
    for node in graph.node:
        names.update(node.input, node.output)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= all_names(attr.g) | {o.name for o in attr.g.output}
    return names - {""}


def test_short_names_are_identifiers_shortest_first_and_skip_taken():
    names = short_names({"b"})
    first = [next(names) for _ in range(40)]
    assert first[:3] == ["a", "c", "d"] and len(first[24]) == 1 and len(first[25]) == 2
    assert all(n[0].isalpha() and n.isalnum() for n in first) and len(set(first)) == 40


@pytest.mark.parametrize("flag", [True, False])
def test_compact_keeps_outputs_bit_identical_and_the_interface(flag):
    model = model_text()
    out, report = onnxslim_kit.optimize(model, "compact")
    entry = report.passes[0]
    assert not entry.rolled_back and entry.verification["status"] == "ok"
    onnx.checker.check_model(out, full_check=True)
    assert [i.name for i in out.graph.input] == ["the_input", "the_flag"]
    assert [o.name for o in out.graph.output] == ["the_output", "side_output"]
    internal = all_names(out.graph) - {"the_input", "the_flag", "the_output", "side_output"}
    assert internal and max(len(n) for n in internal) <= 2
    assert out.ByteSize() < model.ByteSize() - 250 and entry.metrics["name_bytes_saved"] > 250
    feeds = {"the_input": np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8), "the_flag": np.array(flag)}
    for want, got in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert want.tobytes() == got.tobytes()


def test_node_names_drop_and_keep():
    model = model_text()
    dropped, _ = onnxslim_kit.optimize(model, "compact(node_names=drop)")
    assert all(n.name == "" for n in dropped.graph.node)
    kept, _ = onnxslim_kit.optimize(model, "compact(node_names=keep)")
    assert [n.name for n in kept.graph.node] == [n.name for n in model.graph.node]


def test_bad_node_names_option_is_a_user_error():
    with pytest.raises(UserError, match="node_names"):
        onnxslim_kit.optimize(model_text(), "compact(node_names=tiny)")


def test_the_callers_model_is_not_renamed():
    """Constants exported from their source tensors (lazy values) must not rename the
    caller's proto when the pass renames them."""
    model = model_text()
    before = model.SerializeToString()
    onnxslim_kit.optimize(model, "compact")
    assert model.SerializeToString() == before
