"""The ``fp16`` pass: Casts at the edges, block lists and ``exclude=``, the exact limit (everything blocked),
overflow and drift fallback, island merging, subgraphs, and a real model."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import cli_error, run_ort, run_zoo
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import cosine
from onnxslim_kit.pipeline import parse_pass_list, resolve, run_pipeline

RNG = np.random.default_rng(0)
F16 = onnx.TensorProto.FLOAT16


def build(body: str, inputs: str, inits: dict, outputs: str = "float y", opset: int = 17) -> onnx.ModelProto:
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\nq ({inputs}) => ({outputs}) {{\n{body}\n}}'
    model = onnx.parser.parse_model(text)
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items())
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def fp16(model, options: str = "", samples: int = 4):
    feed = CalibrationFeed(input_specs(model), None, num_samples=samples)
    out, report = run_pipeline(model, parse_pass_list(f"fp16({options})" if options else "fp16"), feed)
    return out, report.passes[0]


def feeds(model, seed=3):
    return CalibrationFeed(input_specs(model), None, seed=seed).take(1)[0]


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def elem(model, name) -> int:
    for v in list(model.graph.input) + list(model.graph.output):
        if v.name == name:
            return v.type.tensor_type.elem_type
    raise KeyError(name)


CONV_NET = """
c1 = Conv<pads=[1,1,1,1]>(x, W1, B1)
r1 = Relu(c1)
c2 = Conv<pads=[1,1,1,1]>(r1, W2)
s = Sigmoid(c2)
y = Mul(s, r1)
"""


def conv_net():
    return build(CONV_NET, "float[1, 16, 12, 12] x", {
        "W1": RNG.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1,
        "B1": RNG.standard_normal(16).astype(np.float32),
        "W2": RNG.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1,
    })


def test_conv_net_runs_in_half_with_casts_at_the_edges():
    model = conv_net()
    out, report = fp16(model)
    assert report.rewrites == {"node→float16": 5, "Cast inserted": 2}
    assert ops(out)["Cast"] == 2
    assert elem(out, "x") == onnx.TensorProto.FLOAT and elem(out, "y") == onnx.TensorProto.FLOAT
    assert {t.data_type for t in out.graph.initializer} == {F16}
    assert out.ByteSize() < 0.55 * model.ByteSize()
    x = feeds(model)
    a, b = run_ort(model, x)[0], run_ort(out, x)[0]
    assert cosine(a, b) > 0.9999 and np.abs(a - b).max() < 1e-2 * np.abs(a).max()
    assert report.verification["status"] == "drift"


def test_keep_io_false_gives_half_inputs_and_outputs():
    model = conv_net()
    out, report = fp16(model, "keep_io=false")
    assert elem(out, "x") == F16 and elem(out, "y") == F16
    assert ops(out)["Cast"] == 0 and report.rewrites == {"node→float16": 5}
    x = feeds(model)
    y = run_ort(out, {"x": x["x"].astype(np.float16)})[0]
    assert y.dtype == np.float16 and cosine(run_ort(model, x)[0], y) > 0.9999


@pytest.mark.parametrize("options", ["exclude=re:.*", "exclude=all", "exclude=op:Conv;op:Relu;op:Sigmoid;op:Mul"])
def test_everything_blocked_reproduces_float32_exactly(options):
    model = conv_net()
    out, report = fp16(model, options)
    assert not report.modified and report.skipped
    x = feeds(model)
    np.testing.assert_array_equal(run_ort(out, x)[0], run_ort(model, x)[0])


def test_user_block_list_keeps_those_nodes_float32():
    model = conv_net()
    out, report = fp16(model, "exclude=op:Sigmoid,merge_limit=-1")
    assert report.skipped["excluded (exclude=)"] == 1
    # x → Cast → … c2 → Cast(f32) → Sigmoid → Cast(f16) → Mul → Cast(f32) → y
    assert ops(out)["Cast"] == 4 and report.rewrites["node→float16"] == 4
    # with merging, Conv2 (2304 weights) and Mul join Sigmoid's float32 island: 2 Casts
    out, report = fp16(model, "exclude=op:Sigmoid")
    assert ops(out)["Cast"] == 2 and report.skipped["float32 to save Casts (island merge)"] == 2


def named_conv_net() -> onnx.ModelProto:
    model = conv_net()
    for node, name in zip(model.graph.node, ["conv1", "relu1", "conv2", "gate", "mul"]):
        node.name = name
    return model


@pytest.mark.parametrize("how", ["option", "global"])
def test_excluded_node_is_left_as_it_was(how):
    """The Conv ``exclude=`` (or the global ``--exclude``) selects keeps its float32 weight and
    computes in float32 (Casts around it); the other nodes go to float16."""
    model = named_conv_net()
    feed = CalibrationFeed(input_specs(model), None, num_samples=4)
    if how == "option":
        out, report = run_pipeline(model, parse_pass_list("fp16(exclude=conv2,merge_limit=-1)"), feed)
        reason = "excluded (exclude=)"
    else:
        out, report = run_pipeline(model, parse_pass_list("fp16(merge_limit=-1)"), feed, exclude="re:^conv2$")
        reason = "excluded (--exclude)"
    entry = report.passes[0]
    assert entry.skipped[reason] == 1 and entry.rewrites["node→float16"] == 4
    conv2 = next(n for n in out.graph.node if n.name == "conv2")
    weights = {t.name: t for t in out.graph.initializer}
    assert weights["W2"].data_type == onnx.TensorProto.FLOAT
    np.testing.assert_array_equal(numpy_helper.to_array(weights["W2"]),
                                  numpy_helper.to_array(model.graph.initializer[2]))
    assert conv2.op_type == "Conv" and conv2.input[1] == "W2"
    producer = {o: n for n in out.graph.node for o in n.output}
    feeding = producer[conv2.input[0]]
    assert feeding.op_type == "Cast" and feeding.attribute[0].i == onnx.TensorProto.FLOAT  # float32 in
    assert {t.data_type for t in out.graph.initializer if t.name != "W2"} == {F16}


def test_exclude_errors_are_one_line_user_errors():
    model = named_conv_net()
    with pytest.raises(UserError, match=r"fp16\(exclude=\.\.\.\): 'conv3' matches no node; closest: conv"):
        fp16(model, "exclude=conv3")
    with pytest.raises(UserError, match=r"'op:Sigmod' matches no node; closest op types: Sigmoid"):
        fp16(model, "exclude=op:Sigmod")
    with pytest.raises(UserError, match=r"has no option 'block_ops'.*renamed: use exclude=op:TYPE"):
        fp16(model, "block_ops=Sigmoid")
    with pytest.raises(UserError, match=r"has no option 'block_names'.*renamed: use exclude=re:REGEX"):
        fp16(model, "block_names=gate")
    with pytest.raises(UserError, match=r"fp16\(target=\.\.\.\): 'cosine': 'cosine' is not a number; expected cos:V"):
        resolve(parse_pass_list("fp16(target=cosine)"))  # a bare value reads as cos:V
    with pytest.raises(UserError, match=r"fp16\(target=\.\.\.\): unknown target 'cosine:0.9'; expected cos:V"):
        resolve(parse_pass_list("fp16(target=cosine:0.9)"))  # checked before any pass runs
    with pytest.raises(UserError, match=r"fp16\(target=\.\.\.\): 'cos:2': a cos target must lie in \(0, 1\]"):
        resolve(parse_pass_list("fp16(target=cos:2)"))


def test_cli_exclude_matching_nothing_exits_2_with_one_line(tmp_path, capsys):
    line = cli_error(tmp_path, named_conv_net(), "fp16(exclude=nope)", capsys)
    assert line.startswith("error: fp16(exclude=...): 'nope' matches no node")


def test_default_block_list_and_shape_computation():
    model = build(
        """
        h = Relu(x)
        r = Resize<mode="nearest">(h, , sc)
        sh = Shape(r)
        shf = Cast<to=1>(sh)
        half = Div(shf, two)
        hi = Cast<to=7>(half)
        y = Reshape(r, hi)
        """,
        "float[1, 2, 4, 4] x", {"sc": np.array([1, 1, 2, 2], np.float32), "two": np.array(1.0, np.float32)},
    )
    out, report = fp16(model, "target=none")
    assert report.skipped["block list: Resize"] == 1
    assert report.skipped["shape computation"] == 1  # Div of sizes stays exact
    assert report.skipped["block list: Cast"] == 2  # type-boundary ops keep their types
    x = feeds(model)
    np.testing.assert_allclose(run_ort(out, x)[0], run_ort(model, x)[0], rtol=1e-3, atol=1e-3)


def test_overflowing_values_stay_float32_and_no_inf_appears():
    w = np.full((16, 16), 300.0, np.float32)
    model = build("h = MatMul(x, W)\nr = Relu(h)\nm = Mul(r, k)\ny = Tanh(m)",
                  "float[4, 16] x", {"W": w, "k": np.array(1e-4, np.float32)})
    x = {"x": np.abs(feeds(model)["x"]) * 30}
    assert np.abs(run_ort(model, x)[0]).max() < np.inf
    feed = CalibrationFeed(input_specs(model), [x])
    out, report = run_pipeline(model, parse_pass_list("fp16(merge_limit=-1)"), feed)
    entry = report.passes[0]
    assert entry.skipped["values overflow float16"] == 3  # MatMul output, Relu in and out, Mul in
    assert entry.rewrites["node→float16"] == 1  # Tanh
    y = run_ort(out, x)[0]
    assert np.all(np.isfinite(y)) and cosine(run_ort(model, x)[0], y) > 0.999
    assert entry.verification["outputs"]["y"]["nonfinite_mismatch"] is False


def test_drift_target_moves_the_guilty_nodes_to_float32():
    # (x + 1000) − 1000 loses x's low bits in float16 (spacing 0.5 at 1000): cosine ≈ 0.98.
    # ORT's CPU provider computes Add/Sub in float32 (no float16 kernels) and hides this, so
    # the pass measures a float16-rounding emulation.
    model = build("a = Add(x, big)\nb = Sub(a, big)\nc = Mul(b, two)\ny = Relu(c)",
                  "float[1, 256] x", {"big": np.array(1000.0, np.float32), "two": np.array(2.0, np.float32)})
    _, loose = fp16(model, "target=none,merge_limit=-1")
    assert loose.metrics["cosine_fp16_emulated"] < 0.999
    assert loose.rewrites["node→float16"] == 4
    out, report = fp16(model, "target=cos:0.9999,merge_limit=-1")
    assert report.metrics["cosine_fp16_emulated"] >= 0.9999
    assert report.skipped["float32 for the drift target / NaN-Inf"] >= 1
    assert report.metrics["amp_evaluations"] >= 2
    assert 1 <= report.rewrites["node→float16"] <= 3  # not everything went back to float32
    half_outputs = {n.output[0] for n in out.graph.node if n.op_type in ("Add", "Sub", "Mul", "Relu")
                    and any(v.name == n.output[0] and v.type.tensor_type.elem_type == F16
                            for v in list(out.graph.value_info) + list(out.graph.output))}
    assert "a" not in half_outputs  # x + 1000 is where the bits are lost


def test_island_merge_removes_casts_between_float32_nodes():
    # Relu sits between two float32 (blocked) nodes: in float16 it costs two Casts, so it moves
    model = build("a = Sigmoid(x)\nb = Relu(a)\nc = Tanh(b)\nd = Conv(c, W)\ny = Relu(d)",
                  "float[1, 4, 8, 8] x", {"W": RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)})
    _out, report = fp16(model, "exclude=op:Sigmoid;op:Tanh")
    assert report.skipped["float32 to save Casts (island merge)"] == 1
    assert report.rewrites == {"node→float16": 2, "Cast inserted": 2}  # Conv, Relu; Cast in and out


def test_if_bodies_are_kept_float32_with_a_reason():
    then_g = onnx.parser.parse_graph("then_g () => (float t) { t = Relu(h) }")
    else_g = onnx.parser.parse_graph("else_g () => (float e) { e = Neg(h) }")
    model = build("h = Sigmoid(x)\ncond = ReduceMax<keepdims=0>(x)\nc = Greater(cond, zero)\ny = Identity(h)",
                  "float[4] x", {"zero": np.array(0.0, np.float32)})
    node = onnx.helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g)
    model.graph.node.append(node)
    model.graph.output.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None))
    out, report = fp16(model, "target=none")
    assert report.skipped.get("If/Loop/Scan kept float32 (bodies not converted)", 0) + \
        report.skipped.get("unknown tensor type", 0) >= 1
    x = feeds(model)
    for a, b in zip(run_ort(model, x), run_ort(out, x)):
        np.testing.assert_allclose(b, a, rtol=2e-3, atol=2e-3)


@pytest.mark.realmodel
def test_ppocr_cls_fp16():
    model, out, entry = run_zoo("ppocr_cls_v2", "fp16", {"x": [1, 3, 48, 192]}, num_samples=4)
    assert out.ByteSize() <= 0.53 * model.ByteSize()
    for drift in entry.verification["outputs"].values():
        assert drift["cosine"] >= 0.999 and not drift["nonfinite_mismatch"]


def test_equal_converted_constants_are_shared():
    three = np.array(3.0, np.float32)
    body = "a = Add(x, T1)\nb = Mul(a, T2)\nc = Add(b, T3)\ny = Mul(c, H)"
    model = build(body, "float[2, 8] x", {"T1": three, "T2": three, "T3": np.array(3.0001, np.float32),
                                          "H": np.array(0.5, np.float32)})
    out, _ = fp16(model)
    halves = [t for t in out.graph.initializer if t.data_type == F16]
    # 3.0 and 3.0001 round to the same float16: one scalar for the three, one for 0.5
    assert len(halves) == 2 and ops(out)["Cast"] == 2
    x = feeds(model)
    np.testing.assert_allclose(run_ort(out, x)[0], run_ort(model, x)[0], rtol=2e-3, atol=2e-3)


def test_if_body_weights_stored_as_float16_once():
    """Weights read inside both If branches become one float16 constant + a Cast per branch;
    the branches compute in float32 on fp32(fp16(W)), so the outputs are the float32 model's
    on the rounded weights; bodies=false leaves them float32."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    text = """<ir_version: 8, opset_import: ["" : 17]>
q (float[4, 32] x, bool c) => (float[4, 32] y) <float[32, 32] W = {W}> {
    y = If(c) <
        then_branch = t () => (float[4, 32] a) { a = MatMul(x, W) },
        else_branch = e () => (float[4, 32] b) { r = Relu(x)
                                                 b = MatMul(r, W) }
    >
}""".replace("{W}", "{" + ", ".join(f"{v:.7g}" for v in w.ravel()) + "}")
    model = onnx.parser.parse_model(text)
    out, rep = fp16(model)
    assert rep.rewrites["subgraph weight→float16 storage"] == 2  # one Cast per branch
    halves = [t for t in out.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    for branch in out.graph.node[0].attribute:
        halves += [t for t in branch.g.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert len(halves) == 1 and numpy_helper.to_array(halves[0]).tobytes() == w.astype(np.float16).tobytes()
    x = rng.standard_normal((4, 32)).astype(np.float32)
    rounded = w.astype(np.float16).astype(np.float32)
    for cond, want in ((True, x @ rounded), (False, np.maximum(x, 0) @ rounded)):
        got = run_ort(out, {"x": x, "c": np.array(cond)})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kept, rep = fp16(model, "bodies=false")
    assert "subgraph weight→float16 storage" not in rep.rewrites


def test_size_ratio_counts_body_weights():
    """The pass's size_ratio is measured against the model before the body weights were
    converted: a model whose only weights sit in If bodies reports about half its bytes."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
q (float[4, 64] x, bool c) => (float[4, 64] y) {
    y = If(c) <
        then_branch = t () => (float[4, 64] a) { a = Relu(x) },
        else_branch = e () => (float[4, 64] b) { r = Relu(x)
                                                 b = Mul(r, r) }
    >
}""")
    model.graph.node[0].attribute[0].g.initializer.append(numpy_helper.from_array(w, "W"))
    model.graph.node[0].attribute[0].g.node[0].input[0] = "x"
    then = model.graph.node[0].attribute[0].g
    then.node[0].op_type, then.node[0].input[:] = "MatMul", ["x", "W"]
    out, rep = fp16(model)
    assert rep.rewrites["subgraph weight→float16 storage"] == 1
    assert 0.45 < rep.metrics["size_ratio"] < 0.6
