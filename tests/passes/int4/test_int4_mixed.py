"""The mixed-precision choice of ``int4`` with a local proxy: the proxy is the layer's own
relative output error, classes follow the graph, the measured losses set each class's scale,
only the shortlist near the cut is measured, and the pass keeps its size budget."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from test_int4 import build, int4

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.model import Model
from onnxslim_kit.passes.int4 import awq as int4_awq
from onnxslim_kit.passes.int4 import mixed
from onnxslim_kit.passes.int4 import proxy
from onnxslim_kit.passes.int4 import quant as iq

RNG = np.random.default_rng(5)


def test_proxy_is_the_relative_output_error_of_the_layer():
    x = RNG.standard_normal((300, 96)).astype(np.float32) * np.linspace(0.1, 3, 96, dtype=np.float32)
    wt = RNG.standard_normal((40, 96)).astype(np.float32)
    deq = iq.dequantize(iq.quantize_rtn(wt, 32, False))
    h = (x.astype(np.float64).T @ x).astype(np.float32)
    expected = int4_awq.output_error(wt, deq, h) / int4_awq.output_error(wt, np.zeros_like(wt), h)
    assert proxy.output_error(wt, deq, x) == pytest.approx(expected, rel=1e-4)
    assert proxy.output_error(wt, wt, x) == 0.0 and 0 < expected < 0.05


def test_rows_are_rows_of_the_inputs_and_bounded(monkeypatch):
    model = build("h = MatMul(x, W1)\nr = Relu(h)\ny = MatMul(r, W2)", "float[32, 64] x",
                  {"W1": RNG.standard_normal((64, 48)).astype(np.float32),
                   "W2": RNG.standard_normal((48, 16)).astype(np.float32)})
    samples = CalibrationFeed(input_specs(model), None, num_samples=3).take(3)
    monkeypatch.setattr(proxy, "MIN_ROWS", 10)
    monkeypatch.setattr(proxy, "ROWS_BYTES", 10 * (64 + 48) * 4)
    rows = proxy.input_rows(Model.from_proto(model), {"x": 64, "r": 48}, samples)
    assert rows["x"].shape == (10, 64) and rows["r"].shape == (10, 48)
    every_x = np.concatenate([s["x"] for s in samples])
    every_r = np.concatenate([np.maximum(s["x"] @ onnx.numpy_helper.to_array(model.graph.initializer[0]), 0)
                              for s in samples])
    assert all((np.abs(every_x - row).max(axis=1) == 0).any() for row in rows["x"])
    assert all((np.abs(every_r - row).max(axis=1) < 1e-4).any() for row in rows["r"])


def test_classes_follow_what_the_layer_feeds():
    body = """
    q = MatMul(x, Wq)
    v = MatMul(x, Wv)
    s = Softmax(q)
    m = Mul(s, v)
    q2 = MatMul(m, Wq2)
    v2 = MatMul(m, Wv2)
    s2 = Softmax(q2)
    y = Mul(s2, v2)
    """
    inits = {k: RNG.standard_normal((32, 32)).astype(np.float32) for k in ("Wq", "Wv", "Wq2", "Wv2")}
    graph = Model.from_proto(build(body, "float[4, 32] x", inits)).graph
    layers = {n.inputs[1].name: n for n in graph.nodes if n.op == "MatMul"}
    ids = {id(n) for n in layers.values()}
    key = {name: proxy.role(node, ids, depth=2) for name, node in layers.items()}
    assert key["Wq"] != key["Wv"]  # Softmax then Mul vs Mul
    assert key["Wq"] == key["Wq2"]  # the same place in each block
    assert key["Wv"] == ("MatMul", ("Mul",), ("*",)) and key["Wv2"] == ("MatMul", ("Mul",))  # the walk stops at layers


def test_class_scales_predict_the_unmeasured_losses():
    proxies = {"a": 0.1, "b": 0.2, "c": 0.4, "d": 0.3}
    classes = {"a": 1, "b": 1, "c": 2, "d": 3}
    out = mixed.predicted({"a": 0.5, "c": 0.04}, proxies, classes)
    assert out["a"] == 0.5 and out["c"] == 0.04  # measured values are kept
    assert out["b"] == pytest.approx(1.0)  # class 1: 5 × proxy
    assert out["d"] == pytest.approx(0.3 * 0.54 / 0.5)  # no measured member: the overall scale
    assert mixed.predicted({}, proxies, classes) == proxies


def test_representatives_and_shortlist_near_the_cut():
    costs = {f"l{i}": (100, 200) for i in range(10)}  # 100 extra bytes each
    proxies = {f"l{i}": 1.0 - 0.1 * i for i in range(10)}
    classes = {f"l{i}": i % 3 for i in range(10)}
    assert mixed.representatives(costs, proxies, classes, 2) == ["l0", "l1"]  # classes 0 (4 layers), 1 (3)
    assert len(mixed.representatives(costs, proxies, classes, 9)) == 3
    # a budget of 4 layers: the cut lies between l3 and l4; 4 measured around it
    assert mixed.shortlist(costs, proxies, 400, 4) == ["l2", "l3", "l4", "l5"]
    assert mixed.shortlist(costs, proxies, 400, 4, done={"l3"}) == ["l1", "l2", "l4", "l5"]  # two on each side
    assert mixed.shortlist(costs, proxies, 400, 0) == []


def _stack(n: int, k: int = 64):
    body = "\n".join(f"h{i + 1} = MatMul(h{i}, W{i})" for i in range(n)).replace("h0", "x") + f"\ny = Relu(h{n})"
    inits = {f"W{i}": (RNG.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32) for i in range(n)}
    return build(body, f"float[8, {k}] x", inits)


@pytest.mark.parametrize("measured", [0, 2, 6])
def test_the_pass_measures_at_most_measured_and_keeps_the_budget(measured):
    model = _stack(6)
    out, report = int4(model, f"method=rtn,max_ratio=0.2,measured={measured}", samples=4)
    assert report.metrics["mixed_candidates"] == 6
    assert report.metrics["mixed_measured"] == min(measured, 6)
    assert report.metrics["weight_ratio"] <= 0.2
    bits = [next(a.i for a in n.attribute if a.name == "bits") for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert len(bits) == 6 and 1 <= bits.count(8) <= 2  # 2 extra layers at 8 bits fit 0.2×, 3 do not


def test_all_measured_when_no_more_candidates_than_measured():
    model = _stack(3)
    a, ra = int4(model, "method=rtn,max_ratio=0.2,measured=3", samples=4)
    b, rb = int4(model, "method=rtn,max_ratio=0.2,measured=50", samples=4)
    assert ra.metrics["mixed_measured"] == rb.metrics["mixed_measured"] == 3
    assert "mixed_classes" not in ra.metrics  # no proxy pass at all
    assert a.SerializeToString() == b.SerializeToString()
