"""``plan``'s per-layer mix: dynamic int8 where a layer tolerates it, float where it does not.

The graph has three 32×32 MatMuls; the middle one reads an activation whose channel 0 is scaled
by 1000 (and that channel's weight row is 0, so the float model ignores it): per-tensor dynamic
quantization of that input wipes out the other channels, so ``fuse,dynamic`` misses cos:0.99,
and only that layer needs to stay float.
"""

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxslim_kit.cli import main
from onnxslim_kit.plan import mix, plan
from onnxslim_kit.plan.candidates import Candidate
from onnxslim_kit.plan.sensitivity import dynamic_layers, dynamic_quantize, layer_errors, quantize_columns

GRAPH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 32] x) => (float[1, 32] y) {
    a = MatMul (x, w1)
    b = Mul (a, s)
    c = MatMul (b, w2)
    y = MatMul (c, w3)
}
"""
NAMES = ["first", "scale", "outlier", "last"]


def _model(outlier: float = 1000.0) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1, w2, w3 = (rng.standard_normal((32, 32)).astype(np.float32) / 6 for _ in range(3))
    w2[0, :] = 0.0
    s = np.ones(32, np.float32)
    s[0] = outlier
    proto = onnx.parser.parse_model(GRAPH)
    proto.graph.initializer.extend(numpy_helper.from_array(v, n) for n, v in
                                   (("w1", w1), ("s", s), ("w2", w2), ("w3", w3)))
    for node, name in zip(proto.graph.node, NAMES):
        node.name = name
    onnx.checker.check_model(proto, full_check=True)
    return proto


@pytest.fixture
def files(tmp_path):
    model, calib = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(_model(), model)
    np.savez(calib, x=np.random.default_rng(1).standard_normal((16, 1, 32)).astype(np.float32))
    return model, calib


# --- the estimate ---------------------------------------------------------------------------

def test_dynamic_quantize_is_ort_dynamicquantizelinear_and_back():
    graph = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 8] x) => (float[4, 8] y) {
        q, s, z = DynamicQuantizeLinear (x)
        y = DequantizeLinear (q, s, z)
    }""")
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    for x in (np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32) * 3,
              np.abs(np.random.default_rng(3).standard_normal((4, 8))).astype(np.float32),  # min > 0: 0 in range
              -np.abs(np.random.default_rng(4).standard_normal((4, 8))).astype(np.float32)):
        np.testing.assert_allclose(dynamic_quantize(x), session.run(None, {"x": x})[0], rtol=0, atol=1e-6)


def test_quantize_columns_is_exact_on_the_int8_grid_and_per_column():
    w = np.array([[127, -3], [1, 127], [-127, 0]], np.float32) * np.array([0.5, 2.0], np.float32)
    np.testing.assert_array_equal(quantize_columns(w), w)
    coarse = np.array([[1.0, 100.0], [0.004, 0.004]], np.float32)
    assert quantize_columns(coarse)[1, 0] != 0.0  # column 0's scale is its own, not column 1's
    assert quantize_columns(coarse)[1, 1] == 0.0


def test_dynamic_layers_follow_the_dynamic_pass_conditions():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 32] x) => (float[2, 32] y, float[2, 4] z, float[2, 32] v) {
        y = MatMul (x, big)
        z = MatMul (x, small)
        t = Gemm <transB = 1> (x, bigT)
        v = MatMul (t, big)
    }"""
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    big, bigT = rng.standard_normal((32, 32)).astype(np.float32), rng.standard_normal((32, 32)).astype(np.float32)
    proto.graph.initializer.extend([numpy_helper.from_array(big, "big"), numpy_helper.from_array(bigT, "bigT"),
                                    numpy_helper.from_array(np.ones((32, 4), np.float32), "small")])
    for node, name in zip(proto.graph.node, ["y", "z", "gemm", ""]):
        node.name = name
    layers = dynamic_layers(proto)
    assert [name for name, _, _ in layers] == ["y", "gemm"]  # small: < 1024 weights; the unnamed one: no selector
    np.testing.assert_array_equal(layers[1][2], bigT.T)  # transB: W as [K, N]


def test_the_outlier_layer_has_the_largest_error_and_a_grid_exact_layer_none():
    proto = _model()
    samples = [{"x": x} for x in np.random.default_rng(1).standard_normal((4, 1, 32)).astype(np.float32)]
    errors = layer_errors(proto, samples)
    assert set(errors) == {"first", "outlier", "last"}
    assert mix.ranked_layers(errors, ["first", "outlier", "last"])[0] == "outlier"
    assert errors["outlier"] > 10 * max(errors["first"], errors["last"])
    # the lossless limit: integer activations in [0, 255] and weights on the int8 grid quantize exactly
    exact = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3, 32] x) => (float[3, 32] y) { y = MatMul (x, w) }""")
    w = np.random.default_rng(5).integers(-127, 128, (32, 32)).astype(np.float32)
    w[0, :] = 127.0
    exact.graph.initializer.append(numpy_helper.from_array(w, "w"))
    exact.graph.node[0].name = "m"
    x = np.random.default_rng(6).integers(0, 256, (3, 32)).astype(np.float32)
    x[0, 0], x[0, 1] = 0.0, 255.0
    assert layer_errors(exact, [{"x": x}]) == {"m": 0.0}


# --- the search -----------------------------------------------------------------------------

@pytest.mark.parametrize("count", [2, 3, 7, 36])
@pytest.mark.parametrize("needed", [1, 2, 5, 35, None])
def test_bisect_finds_the_fewest_float_layers_in_at_most_log2_trials(count, needed):
    calls = []

    def holds(k):
        calls.append(k)
        return needed is not None and k >= needed

    found, trace = mix.bisect(count, holds)
    expected = needed if needed is not None and needed < count else None
    assert found == expected
    assert count not in calls and 0 not in calls
    assert len(trace) == len(calls) <= math.ceil(math.log2(count))


def test_bisect_stops_when_told_to():
    found, trace = mix.bisect(8, lambda k: None)
    assert (found, trace) == (None, [])


@pytest.mark.parametrize("name, ok", [("/encoder/layer.0/MatMul", True), ("a;b", False), ("f(x)", False),
                                      ("a,b", False), ("k=v", False), ("all", False), ("re:x", False),
                                      (" padded", False), ("", False)])
def test_only_names_a_selector_can_hold_are_chosen(name, ok):
    assert mix.nameable(name) is ok


def test_plan_adds_the_mix_that_keeps_only_the_outlier_layer_float(files):
    model, calib = files
    result = plan(model, calib=str(calib), pipelines="fuse;fuse,dynamic", runs=3, warmup=1)
    by = {c.pipeline: c for c in result.candidates}
    assert not by["fuse,dynamic"].met
    assert "fuse,dynamic(exclude=outlier)" in by
    found = by["fuse,dynamic(exclude=outlier)"]
    assert found.met and found.usable and found.label == "fuse,dynamic mix: 1 of 3 float"
    assert found.timing is not None  # timed with the others
    assert any("tried" in n and "k=1 met" in n for n in found.notes)
    assert sum(1 for c in result.candidates if c.pipeline.startswith("fuse,dynamic(")) == 1
    layers = result.sensitivity["layers"]
    assert len(layers) == 3 and [r["layer"] for r in layers if r["float"]] == ["outlier"]
    assert max(layers, key=lambda r: r["loss"])["layer"] == "outlier"


def test_the_page_plots_the_sensitivity_with_the_float_layers_apart(files):
    from onnxslim_kit.plan import html

    model, calib = files
    result = plan(model, calib=str(calib), pipelines="fuse;fuse,dynamic", runs=3, warmup=1)
    section = html._sensitivity(result)
    assert section.startswith("<svg") and section.count('class="mark"') == 3
    assert section.count('fill="#c0392b"') == 1 + 1  # the outlier's bar and its legend swatch
    result.sensitivity = {}
    assert "Not estimated" in html._sensitivity(result)


def test_no_mix_is_searched_when_dynamic_already_holds(files, tmp_path):
    model, calib = tmp_path / "mild.onnx", files[1]
    onnx.save(_model(outlier=1.0), model)
    result = plan(model, calib=str(calib), pipelines="fuse;fuse,dynamic", runs=3, warmup=1)
    assert [c.pipeline for c in result.candidates] == ["fuse", "fuse,dynamic"]
    assert result.candidates[1].met


def test_mix_search_off_and_without_dynamic(files):
    model, calib = files
    off = plan(model, calib=str(calib), pipelines="fuse;fuse,dynamic", runs=3, warmup=1, mix_search=False)
    assert [c.pipeline for c in off.candidates] == ["fuse", "fuse,dynamic"]
    assert mix.search(model, [Candidate("fuse")], {}, None, print) == []


def test_the_chosen_mix_replays_byte_identically(files, tmp_path, monkeypatch):
    """Forced choice (a timing that makes the mix the fastest): its recipe replays to the same bytes."""
    from onnxslim_kit.plan import local

    def fake_bench(self, model, protos, names, samples, machine, timing):
        rows = [{"name": "original", "latency_ms": {"median": 1.0}}]
        for name in names:
            ratio = 0.5 if name.startswith("fuse,dynamic(") else 0.9
            rows.append({"name": name, "latency_ratio_vs_first": ratio, "latency_ratio_spread": [ratio, ratio],
                         "latency_ms": {"median": ratio}})
        return rows

    monkeypatch.setattr(local.LocalExecutor, "bench", fake_bench)
    model, calib = files
    out, recipe = tmp_path / "out.onnx", tmp_path / "recipe.json"
    assert main(["plan", str(model), "--calib", str(calib), "--pipelines", "fuse;fuse,dynamic", "-o", str(out),
                 "--recipe", str(recipe), "--report", str(tmp_path / "plan.json"), "-q"]) == 0
    report = json.loads((tmp_path / "plan.json").read_text())
    assert report["chosen"] == "fuse,dynamic(exclude=outlier)"
    again = tmp_path / "again.onnx"
    assert main([str(model), "--recipe", str(recipe), "-o", str(again), "-q"]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_gated_model_with_every_gate_off_is_the_float_model_and_ranks_the_outlier_first():
    from onnxslim_kit.plan.gated import gated_model, layer_losses

    proto = _model()
    layers = dynamic_layers(proto)
    gated = gated_model(proto, layers)
    onnx.checker.check_model(gated, full_check=True)
    x = np.random.default_rng(7).standard_normal((1, 32)).astype(np.float32)
    plain = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    switched = ort.InferenceSession(gated.SerializeToString(), providers=["CPUExecutionProvider"])
    gates = gated.graph.input[-1].name
    np.testing.assert_array_equal(switched.run(None, {"x": x, gates: np.zeros(3, bool)})[0],
                                  plain.run(None, {"x": x})[0])
    losses = layer_losses(proto, [{"x": x}])
    assert max(losses, key=losses.get) == "outlier"
    assert losses["outlier"] > 100 * max(losses["first"], losses["last"]) and losses["first"] > 0
