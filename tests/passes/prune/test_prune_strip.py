"""prune with no options: strip provably constant channels, outputs unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import assert_same_outputs, random_feeds
from onnx import TensorProto, helper, numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.model import Model
from onnxslim_kit.passes.prune import PrunePass
from onnxslim_kit.pipeline import PassContext

RNG = np.random.default_rng(0)


def weight(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def build(nodes, inits, in_shape, outputs, opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [f"{o}_{i}" for i in range(rank)])
         for o, rank in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def conv(name, x, w, b=None, pads=0, group=1):
    k = w.shape[-1]
    inputs = [x, f"{name}.w"] + ([f"{name}.b"] if b is not None else [])
    return helper.make_node("Conv", inputs, [name], name=name, pads=[pads] * 4, kernel_shape=[k, k], group=group)


def zero_channels(w, channels, axis=0):
    """ln_structured-style mask: the chosen output channels set to zero (a new array)."""
    w = w.copy()
    index = [slice(None)] * w.ndim
    index[axis] = list(channels)
    w[tuple(index)] = 0
    return w


def run_prune(proto, **options):
    pass_ = PrunePass()
    opts = {k: o.default for k, o in pass_.options.items()} | options
    feed = CalibrationFeed(input_specs(proto), None, num_samples=4)
    model = Model.from_proto(proto)
    result = pass_.run(model, PassContext(options=opts, feed=feed, original=proto))
    model.commit()
    out = model.to_proto()
    onnx.checker.check_model(out, full_check=True)
    return out, result


def inits_of(proto):
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def conv_weight(proto, node_name):
    node = next(n for n in proto.graph.node if n.name == node_name)
    return inits_of(proto)[node.input[1]]


def assert_equivalent(a, b):
    for seed in range(3):
        assert_same_outputs(a, b, random_feeds(a, seed), rtol=1e-5, atol=1e-5)


def residual_model(bias1=0.0):
    w1 = zero_channels(weight(16, 8, 3, 3), [1, 5, 9])
    b1 = weight(16)
    b1[[1, 5, 9]] = bias1
    w2 = zero_channels(weight(16, 16, 3, 3), [1, 5, 9])
    b2 = weight(16)
    b2[[1, 5, 9]] = 0
    nodes = [
        conv("c1", "x", w1, b1, pads=1), helper.make_node("Relu", ["c1"], ["a"]),
        conv("c2", "a", w2, b2, pads=1), helper.make_node("Add", ["a", "c2"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        conv("c3", "r", weight(16, 16, 1, 1), weight(16)),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], name="fc", transB=1),
    ]
    inits = {"c1.w": w1, "c1.b": b1, "c2.w": w2, "c2.b": b2, "c3.w": weight(16, 16, 1, 1),
             "c3.b": weight(16), "fc.w": weight(10, 16), "fc.b": weight(10)}
    return build(nodes, inits, [1, 8, 10, 10], {"y": 2})


def test_residual_zero_channels_are_stripped():
    proto = residual_model()
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 3
    assert conv_weight(out, "c1").shape == (13, 8, 3, 3)
    assert conv_weight(out, "c2").shape == (13, 13, 3, 3)
    assert conv_weight(out, "c3").shape == (16, 13, 1, 1)
    assert_equivalent(proto, out)


def test_residual_only_one_side_zero_is_kept():
    """Channel 1 of c2 has weights: the residual unit is not constant, nothing is stripped."""
    proto = residual_model()
    inits = inits_of(proto)
    inits["c2.w"] = inits["c2.w"].copy()
    inits["c2.w"][1, 0, 0, 0] = 0.5
    for t in proto.graph.initializer:
        if t.name == "c2.w":
            t.CopyFrom(numpy_helper.from_array(inits["c2.w"], "c2.w"))
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 2
    assert conv_weight(out, "c1").shape == (14, 8, 3, 3)
    assert_equivalent(proto, out)


def test_constant_nonzero_channel_into_padded_conv_is_kept():
    proto = residual_model(bias1=0.7)  # relu(0.7) ≠ 0 enters c2 with padding 1
    out, result = run_prune(proto, target="none")
    assert "strip constant channel" not in result.rewrites
    assert result.skipped["constant channel feeds a padded Conv"] == 3
    assert conv_weight(out, "c1").shape == (16, 8, 3, 3)
    assert_equivalent(proto, out)


def test_concat_with_constant_channels_folds_into_bias():
    wa = zero_channels(weight(8, 3, 3, 3), [0, 7])
    ba = weight(8)
    ba[[0, 7]] = [0.4, -0.3]  # relu → 0.4 and 0
    wb = zero_channels(weight(8, 3, 3, 3), [2])
    bb = weight(8)
    bb[2] = 1.5
    nodes = [
        conv("ca", "x", wa, ba, pads=1), helper.make_node("Relu", ["ca"], ["ra"]),
        conv("cb", "x", wb, bb, pads=1), helper.make_node("Sigmoid", ["cb"], ["rb"]),
        helper.make_node("Concat", ["ra", "rb"], ["cat"], axis=1),
        conv("head", "cat", weight(4, 16, 1, 1)),
    ]
    proto = build(nodes, {"ca.w": wa, "ca.b": ba, "cb.w": wb, "cb.b": bb, "head.w": weight(4, 16, 1, 1)},
                  [1, 3, 9, 9], {"head": 4})
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 3
    assert conv_weight(out, "ca").shape == (6, 3, 3, 3)
    assert conv_weight(out, "cb").shape == (7, 3, 3, 3)
    assert conv_weight(out, "head").shape == (4, 13, 1, 1)
    head = next(n for n in out.graph.node if n.name == "head")
    assert len(head.input) == 3  # a bias now carries the constants
    assert_equivalent(proto, out)


def depthwise_model(dw_zero=(3,)):
    w1 = zero_channels(weight(16, 4, 1, 1), [0, 6])
    b1 = weight(16)
    b1[[0, 6]] = 0
    wd = zero_channels(weight(16, 1, 3, 3), dw_zero)
    nodes = [
        conv("pw", "x", w1, b1), helper.make_node("Clip", ["pw", "lo", "hi"], ["a"]),
        conv("dw", "a", wd, weight(16), pads=1, group=16), helper.make_node("HardSwish", ["dw"], ["h"]),
        conv("out", "h", weight(8, 16, 1, 1), weight(8)),
    ]
    inits = {"pw.w": w1, "pw.b": b1, "lo": np.float32(0), "hi": np.float32(6), "dw.w": wd, "dw.b": weight(16),
             "out.w": weight(8, 16, 1, 1), "out.b": weight(8)}
    return build(nodes, inits, [1, 4, 7, 7], {"out": 4})


def test_depthwise_group_follows():
    proto = depthwise_model()
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 3  # 0, 6 (zero input) and 3 (zero dw filter)
    dw = next(n for n in out.graph.node if n.name == "dw")
    assert helper.get_attribute_value(next(a for a in dw.attribute if a.name == "group")) == 13
    assert conv_weight(out, "dw").shape == (13, 1, 3, 3)
    assert conv_weight(out, "pw").shape == (13, 4, 1, 1)
    assert conv_weight(out, "out").shape == (8, 13, 1, 1)
    assert_equivalent(proto, out)


@pytest.mark.parametrize("head", ["gemm", "matmul"])
def test_flatten_head_maps_channel_blocks(head):
    w = zero_channels(weight(8, 3, 3, 3), [2, 5])
    b = weight(8)
    b[2] = 0.25
    b[5] = -1.0
    fc = weight(8 * 4 * 4, 10)
    nodes = [conv("c", "x", w, b), helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"])]
    if head == "gemm":
        nodes.append(helper.make_node("Gemm", ["f", "fc.w"], ["y"], name="fc", alpha=0.5))
    else:
        nodes.append(helper.make_node("MatMul", ["f", "fc.w"], ["y"], name="fc"))
    proto = build(nodes, {"c.w": w, "c.b": b, "fc.w": fc}, [1, 3, 6, 6], {"y": 2})
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 2
    assert conv_weight(out, "c").shape == (6, 3, 3, 3)
    assert conv_weight(out, "fc").shape == (6 * 16, 10)
    assert_equivalent(proto, out)


def test_graph_output_and_transpose_block_with_reasons():
    w = zero_channels(weight(8, 3, 1, 1), [1])
    nodes = [
        conv("c", "x", w), helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["y"]),
    ]
    proto = build(nodes, {"c.w": w, "shape": np.array([1, -1], np.int64)}, [1, 3, 5, 5], {"y": 2, "c": 4})
    out, result = run_prune(proto, target="none")
    assert not result.modified
    assert result.skipped["unprunable: reaches a graph output"] == 8
    assert conv_weight(out, "c").shape == (8, 3, 1, 1)
    assert_equivalent(proto, out)


def test_is_lossless_only_with_target_none_and_nothing_asked():
    p = PrunePass()
    base = {k: o.default for k, o in p.options.items()} | {"target": "none"}
    assert p.is_lossless(base)
    assert p.is_lossless(base | {"explain": True})
    assert not p.is_lossless(base | {"target": ""})  # bare prune: searches the amount under the budget
    assert not p.is_lossless(base | {"ratio": 0.3})
    assert not p.is_lossless(base | {"sparsity": 0.5})
    assert not p.is_lossless(base | {"nm": "2:4"})


def test_explain_describes_groups():
    out, result = run_prune(residual_model(), explain=True, target="none")
    text = "\n".join(result.notes)
    assert "source   Conv 'c1' (16 out)" in text
    assert "source   Conv 'c2' (16 out)" in text
    assert "consumer Gemm 'fc'" in text
    assert "through  Add 's'" in text
    assert "10/10 units blocked: reaches a graph output" in text  # fc's own outputs
    assert result.metrics["groups"] == 3  # {c1, c2 residual}, {c3 → fc}, {fc → y}


@pytest.mark.parametrize("shape_kind", ["fixed", "computed"])
def test_reshape_head_fixed_or_computed_shape(shape_kind):
    """GAP → Reshape → MatMul: a fixed [-1, 16] target is rewritten to [0, -1]; a target
    computed from Shape(x)[0:1] (batch only) needs nothing."""
    w = zero_channels(weight(16, 3, 3, 3), [3, 4, 10])
    nodes = [conv("c", "x", w), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"])]
    inits = {"c.w": w, "fc.w": weight(16, 5)}
    if shape_kind == "fixed":
        inits["target"] = np.array([-1, 16], np.int64)
    else:
        inits.update(s0=np.array([0], np.int64), s1=np.array([1], np.int64), minus=np.array([-1], np.int64))
        nodes += [helper.make_node("Shape", ["p"], ["shp"]), helper.make_node("Slice", ["shp", "s0", "s1", "s0"], ["n"]),
                  helper.make_node("Concat", ["n", "minus"], ["target"], axis=0)]
    nodes += [helper.make_node("Reshape", ["p", "target"], ["f"]), helper.make_node("MatMul", ["f", "fc.w"], ["y"], name="fc")]
    proto = build(nodes, inits, [1, 3, 8, 8], {"y": 2})
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 3
    assert conv_weight(out, "fc").shape == (13, 5)
    assert_equivalent(proto, out)


def test_shape_reading_the_channel_count_blocks():
    w = zero_channels(weight(8, 3, 1, 1), [0])
    nodes = [conv("c", "x", w), helper.make_node("Shape", ["c"], ["shp"]),
             helper.make_node("Cast", ["shp"], ["shp_f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["shp_f"], ["total"], keepdims=0),
             helper.make_node("Conv", ["c", "k.w"], ["y"], name="k", kernel_shape=[1, 1])]
    proto = build(nodes, {"c.w": w, "k.w": weight(4, 8, 1, 1)}, [1, 3, 4, 4], {"y": 4, "total": 0})
    out, result = run_prune(proto, target="none")
    assert not result.modified
    assert result.skipped["unprunable: Shape of the channels used"] == 8


@pytest.mark.parametrize("by", ["scales", "sizes"])
def test_fpn_resize_add_couples_levels(by):
    """Top-down FPN step: upsampled coarse level + lateral fine level → one unit per channel."""
    wc = zero_channels(weight(16, 3, 3, 3), [2, 9])
    wf = zero_channels(weight(16, 3, 1, 1), [2, 9])
    resize_in = ["coarse", "", "scales"] if by == "scales" else ["coarse", "", "", "sizes"]
    nodes = [
        helper.make_node("Conv", ["x", "c.w"], ["coarse"], name="c", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        helper.make_node("Resize", resize_in, ["up"], mode="nearest"),
        conv("f", "x", wf), helper.make_node("Add", ["up", "f"], ["s"]),
        conv("out", "s", weight(8, 16, 3, 3), pads=1),
    ]
    inits = {"c.w": wc, "f.w": wf, "out.w": weight(8, 16, 3, 3), "scales": np.array([1, 1, 2, 2], np.float32),
             "sizes": np.array([1, 16, 8, 8], np.int64)}
    proto = build(nodes, inits, [1, 3, 8, 8], {"out": 4})
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 2
    assert conv_weight(out, "c").shape[0] == 14 and conv_weight(out, "f").shape[0] == 14
    assert conv_weight(out, "out").shape[1] == 14
    assert_equivalent(proto, out)


def test_layers_inside_if_bodies_are_counted_as_skipped(rng):
    """Only the main graph is pruned; a Conv/MatMul inside an If body is reported, not touched."""
    from test_int8_bodies import if_model

    model = if_model(rng)
    out, result = run_prune(model, ratio=0.3)
    assert result.skipped["layer in an If/Loop body (only the main graph is pruned)"] == 2
    assert out.graph.node[0].attribute[0].g.initializer[0].dims == model.graph.node[0].attribute[0].g.initializer[0].dims
