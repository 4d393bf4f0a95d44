"""Memory-saving steps of the int8 search: the same numbers as the plain forms."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnxslim_kit.passes._quant import qdq
from onnxslim_kit.passes.int8.fallback import SharedWeights, give_back, run
from test_int8 import build, w

from onnxslim_kit.model import Model
from onnxslim_kit.runtime import make_session

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_quantize_weight_by_rows_equals_at_once(monkeypatch, axis):
    weight = RNG.standard_normal((37, 11)).astype(np.float32)
    scales = qdq.weight_scales(weight, axis)
    shape = [1, 1]
    if axis is not None:
        shape[axis] = -1
    whole = np.clip(np.round(weight.astype(np.float64) / scales.reshape(shape).astype(np.float64)), -127, 127)
    monkeypatch.setattr(qdq, "ROWS_BYTES", 3 * 8 * 11)  # blocks of 3 rows, the last one short
    got = qdq.quantize_weight(weight, scales, axis)
    assert got.dtype == np.int8 and np.array_equal(got, whole.astype(np.int8))
    assert np.array_equal(qdq.by_rows(np.float32(2.5), np.int8, lambda x, _: np.round(x)), np.int8(2))


def table_model():
    return build("e = Gather (table, ids)\nf = Gather (small, ids)\ny = Add (e, f)", "int64[2, 5] ids",
                 {"table": w(300, 8), "small": w(300, 8)})


def test_gather_then_dequantize_gives_the_same_outputs():
    model = Model.from_proto(table_model())
    graph = model.graph
    tensors = graph.tensors()
    gathers = [n for n in graph.nodes if n.op == "Gather"]
    q = (RNG.integers(0, 256, (300, 8))).astype(np.uint8)
    # table: a per-tensor DQ read by its Gather only (moved); small: per-channel scales (left alone)
    gathers[0].inputs[0] = qdq.dequantize_constant(model, graph, q, np.float32(0.02), None, "w", zero=np.uint8(128))
    gathers[1].inputs[0] = qdq.dequantize_constant(model, graph, q.astype(np.int8) // 2,
                                                   np.linspace(0.01, 0.02, 8, dtype=np.float32), 1, "c")
    del tensors
    feed = {"ids": np.array([[0, 5, 299, 7, 7], [1, 2, 3, 4, 150]], np.int64)}
    before = run(make_session(model.to_proto()), feed)["y"]
    names = {n.name for n in graph.nodes} | set(graph.tensors())
    assert qdq.gather_then_dequantize(graph) == 1
    assert {n.name for n in graph.nodes} | set(graph.tensors()) == names  # rewired, no new names
    moved = next(n for n in graph.nodes if n.op == "Gather" and n.inputs[0].name.startswith("int8/w_q"))
    assert isinstance(moved.inputs[0], gs.Constant) and moved.outputs[0].outputs[0].op == "DequantizeLinear"
    after = run(make_session(model.to_proto()), feed)["y"]
    assert np.array_equal(before, after)


def test_shared_weights_session_runs_without_arena():
    proto = table_model()
    trial = Model.from_proto(proto)
    shared = SharedWeights(trial.graph, min_size=16)
    shared.strip(trial.graph)
    session = shared.session(trial.to_proto())
    assert session.get_session_options().enable_cpu_mem_arena is False
    feed = {"ids": np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], np.int64)}
    ref = make_session(proto).run(None, feed)[0]
    assert np.array_equal(run(session, feed)["y"], ref)
    give_back()  # callable on any platform


# --- session 3: smoothed weights computed when read, constant-only nodes first ----------------

def smoothed_model():
    """Two MatMuls reading one input (one smoothing group), one a Gemm with transB."""
    return build("a = MatMul (x, w1)\nb = Gemm <transB = 1> (x, w2)\ny = Add (a, b)", "float[1, 16] x",
                 {"w1": w(16, 8), "w2": w(8, 16)})


def test_smoothed_weight_is_lazy_and_computes_the_eager_product():
    from onnxslim_kit.passes.int8 import plan as plan_mod
    from onnxslim_kit.passes._quant import smooth as sm
    from onnxslim_kit.pipeline import PassResult

    source = smoothed_model()
    model = Model.from_proto(source)
    for i, node in enumerate(model.graph.nodes):
        node.name = f"n{i}"
    layers = plan_mod.find_layers(model.graph, PassResult())
    groups = sm.smoothable(layers)
    peaks = {"x": np.abs(RNG.standard_normal(16)).astype(np.float32) * 10}
    originals = sm.smooth(model, groups, peaks, 0.5, PassResult())
    assert len(originals) == 2
    for layer in layers:
        const = layer.node.inputs[layer.weight_index]
        assert sm.is_lazy(const) and layer.inputs[0] is layer.node.inputs[0]  # layers rewired too
        weight, s = originals[layer.name][1], const._values.s
        gemm = layer.node.op == "Gemm"
        eager = ((weight.T if gemm else weight).astype(np.float64) * s[:, None]).astype(np.float32)  # session 2's
        eager = np.ascontiguousarray(eager.T if gemm else eager)
        got = sm.weight_array(const)
        assert got.shape == const.shape == weight.shape and np.array_equal(got, eager)
        assert sm.is_lazy(const)  # weight_array does not keep the array
        assert not np.allclose(got, weight)  # really rescaled
    assert sm.realize(model.graph) == 2
    assert not any(sm.is_lazy(t) for t in model.graph.tensors().values())
    x = {"x": RNG.standard_normal((1, 16)).astype(np.float32)}
    ref = run(make_session(source), x)["y"]
    assert np.allclose(run(make_session(model.to_proto()), x)["y"], ref, rtol=1e-5, atol=1e-6)


def test_int8_with_smoothing_leaves_no_lazy_weight_and_keeps_the_search_lazy(monkeypatch):
    from onnxslim_kit.passes._quant import smooth as sm
    from onnxslim_kit.passes import int8 as int8_mod
    from test_int8 import quantize

    seen = []
    original = int8_mod.choose_fallback

    def spy(names, build_, *args, **kwargs):
        graph = build_.__closure__[[c.cell_contents.__class__.__name__ for c in build_.__closure__].index("Model")]
        seen.append(sum(sm.is_lazy(t) for t in graph.cell_contents.graph.tensors().values()))
        return original(names, build_, *args, **kwargs)

    monkeypatch.setattr(int8_mod, "choose_fallback", spy)
    out, rep = quantize(smoothed_model(), "target=cos:0.99999,smooth=0.5")
    assert rep.rewrites["smoothed activation"] == 1
    assert seen == [2]  # the main graph's smoothed weights are still lazy during the search
    x = {"x": RNG.standard_normal((1, 16)).astype(np.float32)}
    assert run(make_session(out), x)["y"].shape == (1, 8)


def chain_of_dequantized_weights(layers: int = 8, k: int = 1024):
    """``x → MatMul(DQ(W_i))`` × layers, every DQ appended after all MatMuls (as apply_plan does)."""
    rng = np.random.default_rng(3)
    graph = gs.Graph(opset=13)
    x = gs.Variable("x", np.float32, [1, k])
    graph.inputs = [x]
    prev, dqs = x, []
    for i in range(layers):
        wq = gs.Constant(f"wq{i}", rng.integers(-127, 128, (k, k)).astype(np.int8))
        scale = gs.Constant(f"s{i}", np.array(0.001, np.float32))
        zero = gs.Constant(f"z{i}", np.array(0, np.int8))
        wf = gs.Variable(f"wf{i}", np.float32, [k, k])
        dqs.append(gs.Node("DequantizeLinear", f"dq{i}", inputs=[wq, scale, zero], outputs=[wf]))
        out = gs.Variable(f"h{i}", np.float32, [1, k])
        graph.nodes.append(gs.Node("MatMul", f"mm{i}", inputs=[prev, wf], outputs=[out]))
        prev = out
    graph.nodes.extend(dqs)
    graph.outputs = [prev]
    return Model(graph=graph, ir_version=8)


def _run_peak_mb(session, feed) -> float:
    """Resident-memory high-water mark during one run above the RSS before it (Linux)."""
    def status(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

    give_back()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    run(session, feed)
    return (status("VmHWM") - before) / 1024


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_constants_first_makes_ort_dequantize_each_weight_just_before_its_reader():
    from onnxslim_kit.passes.int8.fallback import constants_first

    feed = {"x": RNG.standard_normal((1, 1024)).astype(np.float32)}
    peaks, outputs = {}, {}
    for order in ("appended", "constants first"):
        model = chain_of_dequantized_weights()
        shared = SharedWeights(model.graph)
        shared.strip(model.graph)  # strip() puts constant-only nodes first
        if order == "appended":  # undo it: the DQs back after the MatMuls
            model.graph.nodes = [n for n in model.graph.nodes if n.op == "MatMul"] + \
                                [n for n in model.graph.nodes if n.op != "MatMul"]
        else:
            assert [n.op for n in model.graph.nodes[:8]] == ["DequantizeLinear"] * 8
            constants_first(model.graph)  # idempotent
            assert [n.op for n in model.graph.nodes[:8]] == ["DequantizeLinear"] * 8
        session = shared.session(model.to_proto())
        outputs[order] = run(session, feed)
        peaks[order] = min(_run_peak_mb(session, feed) for _ in range(2))
        del session
    assert np.array_equal(outputs["appended"]["h7"], outputs["constants first"]["h7"])
    # 8 float weights of 4 MB: all alive at once when ORT runs the DQs first, about one otherwise
    assert peaks["appended"] > 20, peaks
    assert peaks["constants first"] < peaks["appended"] / 2, peaks


def test_weight_scales_equal_the_abs_max_formula():
    for shape, axis in [((37, 11), 1), ((37, 11), 0), ((6, 3, 3, 3), 0), ((37, 11), None), ((5,), 0), ((4, 4), -1)]:
        weight = RNG.standard_normal(shape).astype(np.float32)
        weight[0] = 0.0
        if axis is None:
            amax = np.abs(weight).max()
        else:
            amax = np.abs(np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)).max(axis=1)
        amax = np.asarray(amax, np.float64)
        assert np.array_equal(qdq.weight_scales(weight, axis), np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32))
    zero = np.zeros((3, 4), np.float32)
    assert np.array_equal(qdq.weight_scales(zero, 0), np.ones(3, np.float32))


def test_dynamic_rung_shares_the_static_matmul_encoding():
    from onnxslim_kit.passes.int8 import LayerSpec, Plan

    model = Model.from_proto(build("y = MatMul (x, w1)", "float[1, 16] x", {"w1": w(16, 8)}))
    spec = LayerSpec("mm", "MatMul", ["x"], "y", 1, 1, None)
    model.graph.nodes[0].name = "mm"
    plan = Plan([spec], {"x": (np.float32(0.05), np.uint8(128)), "y": (np.float32(0.05), np.uint8(128))}, True)
    trial = Model.from_proto(model.to_proto())
    trial.graph.nodes[0].name = "mm"
    qdq.apply_plan(trial, plan, set(), fallback={"mm": "dynamic"})
    static = plan.encodings[("mm", ("static", False))]
    dynamic = plan.encodings[("mm", "dynamic")]
    assert dynamic[0] is static[0] and dynamic[1] is static[1] and dynamic[2] is None
    weight = model.graph.nodes[0].inputs[1].values
    scales = qdq.weight_scales(weight, 1)
    assert np.array_equal(dynamic[0], qdq.quantize_weight(weight, scales, 1).astype(np.int16) + 128)  # uint8, z 128
