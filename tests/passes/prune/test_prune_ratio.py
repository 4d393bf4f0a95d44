"""prune(ratio=…): importance criteria, group-wise selection, re-fit, im2col."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import random_feeds, run_ort
from onnx import helper
from test_prune_strip import build, conv, conv_weight, run_prune, weight

from onnxslim_kit.metrics import cosine
from onnxslim_kit.passes.prune.refit import im2col_rows
from onnxslim_kit.passes._common.layer_stats import conv_geometry
from onnxslim_kit.passes.prune import CRITERIA


def net():
    """Residual pair, depthwise, Concat with a second branch, 3×3 conv, GAP → Gemm head."""
    nodes = [
        conv("c1", "x", weight(32, 3, 3, 3), weight(32), pads=1), helper.make_node("Relu", ["c1"], ["a"]),
        conv("c2", "a", weight(32, 32, 3, 3), weight(32), pads=1), helper.make_node("Relu", ["c2"], ["b"]),
        conv("c3", "b", weight(32, 32, 1, 1), weight(32)), helper.make_node("Add", ["a", "c3"], ["s"]),
        conv("dw", "s", weight(32, 1, 3, 3), weight(32), pads=1, group=32), helper.make_node("Relu", ["dw"], ["d"]),
        conv("c4", "d", weight(16, 32, 1, 1), weight(16)), helper.make_node("Relu", ["c4"], ["e"]),
        helper.make_node("Concat", ["e", "d"], ["cat"], axis=1),
        conv("c5", "cat", weight(24, 48, 3, 3), weight(24)), helper.make_node("Relu", ["c5"], ["f"]),
        helper.make_node("GlobalAveragePool", ["f"], ["p"]), helper.make_node("Flatten", ["p"], ["fl"]),
        helper.make_node("Gemm", ["fl", "fc.w", "fc.b"], ["y"], name="fc", transB=1),
    ]
    shapes = {"c1": (32, 3, 3, 3), "c2": (32, 32, 3, 3), "c3": (32, 32, 1, 1), "dw": (32, 1, 3, 3),
              "c4": (16, 32, 1, 1), "c5": (24, 48, 3, 3), "fc": (10, 24)}
    inits = {}
    for name, shape in shapes.items():
        inits[f"{name}.w"] = weight(*shape)
        inits[f"{name}.b"] = weight(shape[0])
    return build(nodes, inits, [1, 3, 12, 12], {"y": 2})


NET = net()
FEEDS = [random_feeds(NET, seed) for seed in (11, 12, 13)]
REFERENCE = [run_ort(NET, f)[0] for f in FEEDS]


def min_cosine(model) -> float:
    return min(cosine(ref, run_ort(model, f)[0]) for ref, f in zip(REFERENCE, FEEDS))


@pytest.mark.parametrize("criterion", CRITERIA)
def test_every_criterion_prunes_to_valid_smaller_model(criterion):
    out, result = run_prune(NET, ratio=0.4, criterion=criterion, multiple=4, min_channels=4)
    assert result.rewrites["prune channel"] > 0
    c1, c2, c5 = conv_weight(out, "c1"), conv_weight(out, "c2"), conv_weight(out, "c5")
    assert c1.shape[0] < 32 and c1.shape[0] % 4 == 0
    assert conv_weight(out, "c3").shape[0] == c1.shape[0]  # residual partner cut alike
    assert conv_weight(out, "dw").shape[0] == c1.shape[0]  # depthwise follows its input
    assert c2.shape[1] == c1.shape[0]
    assert c5.shape[1] == conv_weight(out, "c4").shape[0] + c1.shape[0]  # concat ranges
    assert conv_weight(out, "fc").shape == (10, c5.shape[0])  # graph output width kept
    assert min_cosine(out) > 0.9


def test_layer_scope_cuts_each_group_by_the_ratio():
    out, _ = run_prune(NET, ratio=0.5, scope="layer", criterion="l2", multiple=8, min_channels=8)
    assert conv_weight(out, "c1").shape[0] == 16  # residual group of 32 → 16
    assert conv_weight(out, "c2").shape[0] == 16
    assert conv_weight(out, "c4").shape[0] == 8
    assert conv_weight(out, "c5").shape[0] == 16  # 24 − 12 = 12, rounded up to a multiple of 8


def test_min_channels_and_multiple_hold():
    out, result = run_prune(NET, ratio=0.9, scope="layer", multiple=8, min_channels=16)
    assert conv_weight(out, "c1").shape[0] == 16
    assert conv_weight(out, "c4").shape[0] == 16  # already at the minimum: kept whole
    assert result.skipped["group kept whole (min_channels / multiple)"] >= 1


def test_refit_brings_the_outputs_closer():
    plain, _ = run_prune(NET, ratio=0.5, criterion="l1", refit=False, multiple=4, min_channels=4)
    fitted, result = run_prune(NET, ratio=0.5, criterion="l1", refit=True, multiple=4, min_channels=4)
    assert result.rewrites["refit layer"] >= 3
    assert all(r < 1.0 for r in result.metrics["refit_error_ratio"])
    assert 1 - min_cosine(fitted) < 0.7 * (1 - min_cosine(plain))
    assert min_cosine(fitted) > 0.98


@pytest.mark.parametrize("target", ["none", "0"])
def test_target_none_strips_only_and_is_lossless(target):
    """Without ratio= the pass searches the amount under its target; target=none (or 0) is strip only."""
    from onnxslim_kit.passes.prune import PrunePass

    out, result = run_prune(NET, target=target)
    assert not result.modified
    assert conv_weight(out, "c1").shape == (32, 3, 3, 3)
    options = {k: o.default for k, o in PrunePass.options.items()}
    assert PrunePass().is_lossless(options | {"target": PrunePass.options["target"].convert(target, "t")})
    assert not PrunePass().is_lossless(options)  # bare prune: strip, then as much as the budget allows
    assert not PrunePass().is_lossless(options | {"ratio": 0.3, "target": "none"})


@pytest.mark.parametrize("auto_pad,strides,dilations,pads", [
    ("NOTSET", [1, 1], [1, 1], [1, 1, 1, 1]),
    ("NOTSET", [2, 1], [1, 2], [0, 2, 1, 0]),
    ("SAME_UPPER", [2, 2], [1, 1], None),
    ("SAME_LOWER", [2, 2], [1, 1], None),
])
def test_im2col_rows_reproduce_conv(auto_pad, strides, dilations, pads):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 5, 3, 3)).astype(np.float32)
    attrs = dict(strides=strides, dilations=dilations, kernel_shape=[3, 3])
    attrs.update(auto_pad=auto_pad) if pads is None else attrs.update(pads=pads)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    y = run_ort(model, {"x": x})[0]
    gs_node = gs.import_onnx(model).nodes[0]
    grid = np.stack(np.meshgrid(*[np.arange(d) for d in (y.shape[0],) + y.shape[2:]], indexing="ij"), -1).reshape(-1, 3)
    rows = im2col_rows(x, conv_geometry(gs_node, x.shape), grid)
    expected = y[grid[:, 0], :, grid[:, 1], grid[:, 2]]
    np.testing.assert_allclose(rows @ w.reshape(4, -1).T, expected, rtol=1e-4, atol=1e-4)


def test_unit_costs_count_macs_of_producer_and_consumers():
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.model import Model
    from onnxslim_kit.passes.prune.importance import unit_costs
    from onnxslim_kit.passes.prune import analyse_model
    from onnxslim_kit.pipeline import PassContext

    feed = CalibrationFeed(input_specs(NET), None, num_samples=1)
    model = Model.from_proto(NET)
    cg = analyse_model(model, PassContext(options={}, feed=feed, original=NET))
    costs = unit_costs(cg)
    c4_units = cg.units_of(next(s.node.outputs[0].name for s in cg.sources if s.node.name == "c4"))
    # c4: 1×1 conv 32→16 on 12×12; each channel then feeds c5 (3×3, 24 out, no padding: 10×10)
    expected = 12 * 12 * 32 + 10 * 10 * 24 * 9
    assert {costs[u] for u in c4_units.tolist()} == {expected}


def test_cost_option_prunes_by_compute_share():
    out, result = run_prune(NET, ratio=0.3, cost="macs", multiple=4, min_channels=4)
    assert result.rewrites["prune channel"] > 0
    assert min_cosine(out) > 0.9


def test_max_ratio_caps_each_group():
    out, result = run_prune(NET, ratio=0.45, max_ratio=0.25, multiple=1, min_channels=1)
    assert result.rewrites["prune channel"] > 0
    for name, full in (("c1", 32), ("c4", 16), ("c5", 24)):
        width = conv_weight(out, name).shape[0]
        assert full - width <= int(0.25 * full)
