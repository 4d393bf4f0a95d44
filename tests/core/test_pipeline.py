"""Pass-list parsing, option validation, verification and rollback in the run loop."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse, scale_constants

import onnxslim_kit
from onnxslim_kit.errors import UserError, VerificationError
from onnxslim_kit.pipeline import Option, Pass, PassResult, parse_pass_list, register_pass

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,4] y) <float[4] b = {1.0, 2.0, 3.0, 4.0}> {
  y = Add (x, b)
}
"""


@register_pass
class _BreakBias(Pass):
    """Test pass: claims to be lossless but scales the bias (or, lossy, does the same honestly)."""

    name = "test_break_bias"
    options = {"lossy": Option(bool, False, "declare the pass lossy"),
               "factor": Option(float, 2.0, "bias multiplier")}

    def is_lossless(self, options):
        return not options["lossy"]

    def run(self, model, ctx):
        return scale_constants(model, ctx.options["factor"], "bias scaled")


@register_pass
class _BreakGraph(Pass):
    """Test pass: produces an invalid graph (Add with one input)."""

    name = "test_break_graph"
    lossless = False

    def run(self, model, ctx):
        result = PassResult()
        model.graph.nodes[0].inputs.pop()
        result.rewrite("broken")
        return result


def test_parse_pass_list():
    specs = parse_pass_list("fuse, prune(ratio=0.3,criterion=l2),int8(target=cos:0.99)")
    assert [s.name for s in specs] == ["fuse", "prune", "int8"]
    assert specs[1].options == {"ratio": "0.3", "criterion": "l2"}
    assert specs[2].options == {"target": "cos:0.99"}


@pytest.mark.parametrize("text,match", [
    ("fuse(", "unbalanced"), ("fuse)", "unbalanced"), ("", "no pass"), ("prune(ratio)", "key=value"),
])
def test_parse_errors(text, match):
    with pytest.raises(UserError, match=match):
        parse_pass_list(text)


def test_unknown_pass_and_option_list_what_exists():
    with pytest.raises(UserError, match="available: .*fuse"):
        onnxslim_kit.optimize(parse(MODEL), "nosuchpass")
    with pytest.raises(UserError, match="its options: .*lossy"):
        onnxslim_kit.optimize(parse(MODEL), "test_break_bias(nope=1)")
    with pytest.raises(UserError, match="expected true/false"):
        onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=maybe)")


def test_lossless_pass_that_changes_outputs_is_rolled_back():
    proto, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias")
    entry = report.passes[0]
    assert entry.rolled_back and entry.verification["status"] == "failed"
    assert not report.ok
    bias = [t for t in proto.graph.initializer if t.name == "b"][0]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(bias), [1, 2, 3, 4])


def test_strict_raises_on_changed_outputs():
    with pytest.raises(VerificationError, match="test_break_bias"):
        onnxslim_kit.optimize(parse(MODEL), "test_break_bias", strict=True)


def test_tiny_change_within_tolerance_passes():
    _, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(factor=1.0000001)")
    assert report.passes[0].verification["status"] == "ok"


def test_lossy_pass_records_drift_and_keeps_result():
    proto, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=true)")
    entry = report.passes[0]
    assert not entry.rolled_back and entry.verification["status"] == "drift"
    drift = entry.verification["outputs"]["y"]
    assert drift["max_abs"] == pytest.approx(4.0, rel=1e-5) and drift["cosine"] < 1.0
    bias = [t for t in proto.graph.initializer if t.name == "b"][0]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(bias), [2, 4, 6, 8])


def test_lossless_pass_after_a_lossy_one_is_checked_against_the_pass_before():
    """After a lossy pass, an exact lossless pass is accepted (compared with the model it got,
    not failed for the drift already made), and a lossless pass that changes the outputs
    further is still rolled back."""
    proto, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=true),test_break_bias(factor=1.0)")
    assert not report.passes[1].rolled_back
    assert report.passes[1].verification["against"] == "previous"
    _, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=true),test_break_bias(factor=3.0)")
    assert report.passes[1].rolled_back and report.passes[1].verification["status"] == "failed"
    assert "vs the pass before" in report.table()


def test_lossless_passes_in_a_row_are_each_checked_against_the_original():
    """Lossless passes after lossless ones keep the original as reference: two changes each
    within the tolerance of the model before them cannot add up past it unnoticed."""
    _, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(factor=1.00007),test_break_bias(factor=1.00007)")
    assert [p.verification["against"] for p in report.passes] == ["original", "original"]
    assert not report.passes[0].rolled_back and report.passes[1].rolled_back


def test_invalid_result_is_rolled_back_even_for_lossy_pass():
    proto, report = onnxslim_kit.optimize(parse(MODEL), "test_break_graph")
    assert report.passes[0].rolled_back
    assert report.passes[0].verification["status"] == "invalid"
    assert len(proto.graph.node[0].input) == 2


@pytest.mark.parametrize("passes", ["test_break_graph,test_break_bias(lossy=true)",
                                    "test_break_bias(lossy=true),test_break_graph"])
def test_rollback_restores_the_model_before_the_pass(passes):
    """The pass after a rollback, and the returned model, see the model as it was before the
    rolled-back pass (a snapshot sharing the arrays, not a re-import)."""
    proto, report = onnxslim_kit.optimize(parse(MODEL), passes)
    assert [p.rolled_back for p in report.passes] == [name.startswith("test_break_graph") for name in passes.split(",")]
    assert len(proto.graph.node[0].input) == 2
    bias = [t for t in proto.graph.initializer if t.name == "b"][0]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(bias), [2, 4, 6, 8])


def test_report_json_and_table():
    _, report = onnxslim_kit.optimize(parse(MODEL), "fuse,test_break_bias(lossy=true)")
    data = report.to_dict()
    assert [p["name"] for p in data["passes"]] == ["fuse", "test_break_bias"]
    assert data["before"]["params"] == 4
    table = report.table()
    assert "test_break_bias" in table and "drift" in table


def test_held_out_evaluation_samples_are_used_for_verification():
    calib = [{"x": np.zeros((2, 4), np.float32)}]
    held_out = [{"x": np.full((2, 4), 10.0, np.float32)}]
    _, on_calib = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=true)", calib=calib)
    _, on_eval = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=true)", calib=calib, eval_data=held_out)
    assert on_calib.verified_on == "calibration samples" and "pass --eval" in on_calib.table()
    assert on_eval.verified_on == "held-out evaluation samples" and "pass --eval" not in on_eval.table()
    # y = x + b vs x + 2b: parallel (cosine 1) where x = 0, not where x = 10
    cos_calib = on_calib.passes[0].verification["outputs"]["y"]["cosine"]
    cos_eval = on_eval.passes[0].verification["outputs"]["y"]["cosine"]
    assert cos_calib == pytest.approx(1.0) and cos_eval < 0.999


def test_lossy_pass_on_generated_data_says_so():
    _, report = onnxslim_kit.optimize(parse(MODEL), "test_break_bias(lossy=true)")
    assert report.verified_on == "generated random samples"
    assert "generated random inputs" in report.table()
    _, lossless = onnxslim_kit.optimize(parse(MODEL), "fuse")
    assert "generated random inputs" not in lossless.table()


def test_weights_a_pass_replaced_are_freed_when_the_run_returns(monkeypatch):
    """The snapshot (a graph: a reference cycle) would keep the replaced array alive."""
    import gc
    import weakref

    from onnxslim_kit import pipeline

    monkeypatch.setattr(pipeline, "COLLECT_MIN_BYTES", 0)
    big = np.arange(4096, dtype=np.float32).reshape(1, 4096)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Add", ["x", "b"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4096])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4096])],
            [onnx.numpy_helper.from_array(big, "b")]),
        opset_imports=[onnx.helper.make_opsetid("", 13)])
    seen = []
    original_run = _BreakBias.run

    def spy(self, model, ctx):
        for tensor in model.graph.tensors().values():
            if isinstance(tensor, gs.Constant):
                seen.append(weakref.ref(tensor.values))
        return original_run(self, model, ctx)

    monkeypatch.setattr(_BreakBias, "run", spy)
    gc.collect()
    gc.disable()  # only the pipeline's own collection may free it
    try:
        # the first pass leaves an array the second pass's snapshot holds
        out, report = onnxslim_kit.optimize(
            proto, passes="test_break_bias(lossy=true,factor=1.5),test_break_bias(lossy=true)")
        alive = seen[1]() is not None
    finally:
        gc.enable()
    assert not alive  # the array from before the pass is gone
    assert len(seen) == 2 and not any(p.rolled_back for p in report.passes)


@register_pass
class _TypedTensor(Pass):
    """Test pass: inserts ``Relu`` before the output through a new tensor that carries a type."""

    name = "test_typed_tensor"

    def run(self, model, ctx):
        result = PassResult()
        add = model.graph.nodes[0]
        middle = gs.Variable("middle", dtype=np.float32, shape=[2, 4])
        out = add.outputs[0]
        add.outputs[0] = middle
        model.graph.nodes.append(gs.Node("Identity", inputs=[middle], outputs=[out]))
        result.rewrite("identity added")
        return result


def test_output_gets_no_value_info_the_input_did_not_have():
    annotated = MODEL.replace("  y = Add (x, b)", "  s = Add (x, b)\n  y = Identity (s)")
    model = onnx.shape_inference.infer_shapes(parse(annotated))
    assert [v.name for v in model.graph.value_info] == ["s"]
    proto, report = onnxslim_kit.optimize(model, "test_typed_tensor")
    assert "middle" in [n.output[0] for n in proto.graph.node]
    assert [v.name for v in proto.graph.value_info] == ["s"]  # the input's annotation stays, the new one goes
    assert report.passes[0].verification["status"] == "ok"
