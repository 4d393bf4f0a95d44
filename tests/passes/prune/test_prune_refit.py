"""prune re-fit (ridge toward W₀ with α chosen on held-out rows) and cost=latency."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import random_feeds, run_ort
from onnx import helper, numpy_helper
from test_prune_ratio import NET, min_cosine
from test_prune_strip import build, conv, conv_weight, run_prune, weight

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.passes.prune.groups import analyse
from onnxslim_kit.passes.prune.latency import node_times, unit_latency
from onnxslim_kit.passes.prune.ratio import within_budget
from onnxslim_kit.model import Model
from onnxslim_kit.passes.prune.refit import ALPHAS, conv_rows_geometry, im2col_rows, ridge, ridge_held_out
from onnxslim_kit.passes.prune.student import truncate, waves


def _linear_problem(rows: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal((rows, d)), np.ones((rows, 1))], axis=1)
    w_true = rng.standard_normal((d + 1, 6))
    w0 = w_true + 0.3 * rng.standard_normal(w_true.shape)  # the pruned layer: close, not right
    return x, x @ w_true, w0, w_true


def test_ridge_toward_w0_helps_with_fewer_rows_than_unknowns():
    x, y, w0, w_true = _linear_problem(rows=16, d=40)  # 16 rows, 41 unknowns per output
    held = np.arange(16) % 2 == 1
    alpha, after, before = ridge_held_out(x, y, w0, held, 40)
    assert alpha in ALPHAS
    assert after < 0.8 * before  # moves toward the truth in the rows' span, keeps W₀ elsewhere
    fitted = ridge(x, y, w0, 40, alpha)
    assert np.linalg.norm(fitted - w_true) < np.linalg.norm(w0 - w_true)


def test_ridge_with_many_rows_recovers_the_weights():
    x, y, w0, w_true = _linear_problem(rows=400, d=20)
    alpha, after, before = ridge_held_out(x, y, w0, np.arange(400) % 2 == 1, 20)
    assert alpha == min(ALPHAS) and after < 1e-4 * before
    np.testing.assert_allclose(ridge(x, y, w0, 20, alpha), w_true, atol=1e-2)


def test_gemm_head_with_few_samples_is_refitted():
    """The Gemm head sees one row per sample (4 here, 24+1 unknowns): re-fitted all the same."""
    fitted, result = run_prune(NET, ratio=0.5, criterion="l1", multiple=4, min_channels=4)
    assert result.rewrites["refit layer"] >= 4
    assert "refit: fewer calibration rows than unknowns" not in result.skipped
    assert all(r < 1.0 for r in result.metrics["refit_error_ratio"])
    assert min_cosine(fitted) > 0.98


def _chain():
    """conv a (8 out) → Relu → conv b (reads 8) → Relu → dw (8) → conv c."""
    nodes = [conv("a", "x", weight(8, 3, 3, 3), weight(8), pads=1), helper.make_node("Relu", ["a"], ["r"], name="relu"),
             conv("b", "r", weight(8, 8, 1, 1), weight(8)), helper.make_node("Relu", ["b"], ["s"], name="relu2"),
             conv("dw", "s", weight(8, 1, 3, 3), weight(8), pads=1, group=8),
             conv("c", "dw", weight(4, 8, 1, 1), weight(4))]
    inits = {f"{n}.{k}": v for n, shape in {"a": (8, 3, 3, 3), "b": (8, 8, 1, 1), "dw": (8, 1, 3, 3),
                                             "c": (4, 8, 1, 1)}.items()
             for k, v in (("w", weight(*shape)), ("b", weight(shape[0])))}
    return build(nodes, inits, [1, 3, 8, 8], {"c": 4})


def test_unit_latency_splits_each_node_time_over_its_channels():
    graph = gs.import_onnx(_chain())
    graph.toposort()
    shapes = {t.name: tuple(t.shape) for t in graph.tensors().values() if t.shape is not None}
    cg = analyse(graph, shapes)
    times = [float(i + 1) for i in range(len(graph.nodes))]  # node k takes k + 1 "seconds"
    costs = unit_latency(cg, times)
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    t = {name: times[i] for name, i in pos.items()}
    a_units = set(cg.units_of("a").tolist())
    b_units = set(cg.units_of("b").tolist())
    # a's output channel: a (source), relu (pass-through), b (consumer) — 8 channels each
    for u in a_units:
        assert costs[u] == pytest.approx((t["a"] + t["relu"] + t["b"]) / 8)
    # b's output channel: b (source), relu2, dw (depthwise), c (consumer)
    for u in b_units:
        assert costs[u] == pytest.approx((t["b"] + t["relu2"] + t["dw"] + t["c"]) / 8)


def test_node_times_measures_every_node():
    proto = _chain()
    sample = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    times = node_times(proto, sample, runs=3)
    assert len(times) == len(proto.graph.node)
    assert all(t >= 0 for t in times) and sum(times) > 0


def test_cost_latency_prunes_to_a_valid_model():
    out, result = run_prune(NET, ratio=0.4, cost="latency", multiple=4, min_channels=4)
    assert result.rewrites["prune channel"] > 0 and result.metrics["profiled_ms"] > 0
    assert conv_weight(out, "c1").shape[0] < 32
    assert min_cosine(out) > 0.9


def test_truncated_student_computes_the_same_tensor_with_fewer_nodes():
    proto = _chain()
    sample = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    cut = truncate(proto, ["s"])
    assert [n.name for n in cut.graph.node] == ["a", "relu", "b", "relu2"]
    full = next(iter_activations(proto, ["s"], [sample]))["s"]
    np.testing.assert_array_equal(next(iter_activations(cut, ["s"], [sample]))["s"], full)


def test_waves_keep_dependent_consumers_apart():
    """b and a parallel 1×1 conv p both read r: one wave; c reads dw ← b: the next wave."""
    proto = _chain()
    proto.graph.node.append(conv("p", "r", weight(2, 8, 1, 1)))
    proto.graph.initializer.append(numpy_helper.from_array(weight(2, 8, 1, 1), "p.w"))
    graph = gs.import_onnx(proto)
    nodes = {n.name: n for n in graph.nodes}
    split = waves(proto, ["b", "p", "c"], lambda name: nodes[name])
    assert split == [["b", "p"], ["c"]]


class _Result:
    def __init__(self):
        self.skipped = {}

    def skip(self, reason, count=1):
        self.skipped[reason] = self.skipped.get(reason, 0) + count


@pytest.mark.parametrize("multiple,expected", [(1, 2), (2, 2), (3, 1)])
def test_error_budget_cuts_only_the_low_importance_mass(multiple, expected):
    importance = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 4.0}  # total 5.0; budget 0.1 → mass ≤ 0.5
    result = _Result()
    # the 4 lowest hold 1.0, 3 hold 0.6, 2 hold 0.3, 1 holds 0.1; steps of `multiple` down from 4
    n = within_budget([0, 1, 2, 3, 4], 4, list(importance), importance, 0.1, multiple, result)
    assert n == expected
    assert result.skipped == {"group cut less (max_loss)": 1}


def test_max_loss_spares_groups_and_keeps_the_model_closer():
    free, r_free = run_prune(NET, ratio=0.5, multiple=4, min_channels=4, refit=False, alloc="rank")
    tight, r_tight = run_prune(NET, ratio=0.5, multiple=4, min_channels=4, refit=False, alloc="rank", max_loss=0.15)
    assert r_tight.metrics["units_pruned"] < r_free.metrics["units_pruned"]
    assert r_tight.skipped["group cut less (max_loss)"] + r_tight.skipped.get("group kept whole (max_loss)", 0) >= 1
    assert min_cosine(tight) > min_cosine(free)
    _, r_same = run_prune(NET, ratio=0.5, multiple=4, min_channels=4, refit=False, alloc="rank", max_loss=1.0)
    assert r_same.metrics["units_pruned"] == r_free.metrics["units_pruned"]


def _conv1d_net():
    """x [1, 4, 40] → Conv1d a (16, k 3, stride 2) → Relu → Conv1d b (12, k 5, dilation 2) → Relu → Conv1d c (6, k 1)."""
    def conv1d(name, x, shape, **attrs):
        return helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], name=name,
                                kernel_shape=[shape[2]], **attrs)

    shapes = {"a": (16, 4, 3), "b": (12, 16, 5), "c": (6, 12, 1)}
    nodes = [conv1d("a", "x", shapes["a"], pads=[1, 1], strides=[2]), helper.make_node("Relu", ["a"], ["r"]),
             conv1d("b", "r", shapes["b"], pads=[4, 4], dilations=[2]), helper.make_node("Relu", ["b"], ["s"]),
             conv1d("c", "s", shapes["c"])]
    inits = {f"{n}.{k}": v for n, shape in shapes.items() for k, v in (("w", weight(*shape)), ("b", weight(shape[0])))}
    return build(nodes, inits, [1, 4, 40], {"c": 3})


def test_conv1d_consumers_are_refitted():
    """A 1-D Conv is re-fitted as a 2-D one over a height of 1: same rows, same solve."""
    net = _conv1d_net()
    feeds = [random_feeds(net, seed) for seed in (21, 22, 23)]
    want = [run_ort(net, f)[0] for f in feeds]

    def worst(model):
        return min(float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))
                   for a, b in zip(want, (run_ort(model, f)[0] for f in feeds)))

    fitted, result = run_prune(net, ratio=0.4, criterion="l1", multiple=4, min_channels=4)
    plain, _ = run_prune(net, ratio=0.4, criterion="l1", multiple=4, min_channels=4, refit=False)
    assert result.rewrites["refit layer"] >= 1
    assert not [r for r in result.skipped if r.startswith("refit: Conv not")]
    assert all(r < 1.0 for r in result.metrics["refit_error_ratio"])
    assert worst(fitted) > worst(plain)


def test_conv1d_rows_times_the_weights_are_the_conv_output():
    """im2col rows of the lifted 1-D input reproduce ONNX Runtime's Conv1d: stride and pads (a),
    dilation and pads (b), at every output step."""
    net = _conv1d_net()
    probe = onnx.ModelProto()
    probe.CopyFrom(net)
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in "arb")
    x = random_feeds(net, 5)["x"]
    _, a_out, r_out, b_out = run_ort(probe, {"x": x})
    nodes = {n.name: n for n in Model.from_proto(net).graph.nodes}
    for name, inp, out in (("a", x, a_out), ("b", r_out, b_out)):
        node = nodes[name]
        w, b = node.inputs[1].values, node.inputs[2].values
        positions = np.array([(0, 0, step) for step in range(out.shape[2])])
        got = im2col_rows(*conv_rows_geometry(node, inp), positions) @ w.reshape(w.shape[0], -1).T + b
        np.testing.assert_allclose(got, out[0].T, rtol=1e-4, atol=1e-5)
