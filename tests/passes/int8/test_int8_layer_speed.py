"""``int8(speed=layers)``: layers whose int8 kernel is slower than their float op stay float,
measured once per layer kind and machine, through a timing cache (:mod:`onnxslim_kit.passes.int8.layer_speed`).

The model: a regular Conv → Relu, a depthwise Conv → Relu, a pointwise Conv. The decision
tests use a fake timer (depthwise "4.8× float", the others "0.5×"), so they do not depend on
this machine's kernels; one test times a real pair."""

from __future__ import annotations

import re

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError
from onnxslim_kit.executed import optimized_graph
from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8 import layer_speed
from onnxslim_kit.passes.int8 import speed as speed_mod
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

def mobile_block() -> onnx.ModelProto:
    text = """<ir_version: 8, opset_import: ["" : 13]>
    q (float[1, 3, 12, 12] x) => (float y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r1 = Relu (c1)
        c2 = Conv <group = 8, pads = [1, 1, 1, 1], strides = [2, 2]> (r1, w2, b2)
        r2 = Relu (c2)
        y = Conv (r2, w3, b3)
    }"""
    model = onnx.parser.parse_model(text)
    model.graph.output[0].type.tensor_type.ClearField("shape")  # left to inference
    rng = np.random.default_rng(7)  # the same weights on every call
    inits = {"w1": (8, 3, 3, 3), "b1": (8,), "w2": (8, 1, 3, 3), "b2": (8,), "w3": (4, 8, 1, 1), "b3": (4,)}
    model.graph.initializer.extend(numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), k)
                                   for k, s in inits.items())
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def fake_timer(calls: list):
    def timer(fields):
        calls.append(fields)
        ratio = 4.8 if fields.get("group", 1) > 1 else 0.5
        return {"ratio": ratio, "spread": [ratio, ratio], "float_ms": 1.0, "int8_ms": ratio, "rounds": 5, "reps": 1}
    return timer


def no_timer(fields, *args):
    raise AssertionError("timed although the cache holds it")


@pytest.fixture(autouse=True)
def whole_model_pays(monkeypatch):
    """The whole-model guard (``speed=layers`` ends with it) sees int8 at half the float latency."""
    calls = []

    def ratio(candidate, reference, sample):
        calls.append(1)
        return 0.5, [0.5, 0.5], 3
    monkeypatch.setattr(speed_mod, "latency_ratio", ratio)
    return calls


def quantize(model, options: str, samples: int = 4):
    """``int8(options)``, with ``speed=layers`` unless the options name a speed (the default is off)."""
    if not re.search(r"(^|,)speed(_check)?=", options):
        options = f"speed=layers,{options}"
    feed = CalibrationFeed(input_specs(model), None, num_samples=samples)
    out, report = run_pipeline(model, parse_pass_list(f"int8({options})"), feed, verify_samples=samples)
    return out, report.passes[-1]


def static_layers(model) -> set:
    """Conv nodes whose weight is a DequantizeLinear output (the static int8 ones; a float layer
    may read a Q point's DQ, its float weight keeps it float)."""
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name for n in model.graph.node if n.op_type == "Conv" and n.input[1] in dq}


def conv_names(model) -> list:
    return [n.name for n in model.graph.node if n.op_type == "Conv"]


def test_a_layer_timed_slower_stays_float_with_the_reason(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer(calls))
    model = mobile_block()
    out, rep = quantize(model, f"target=none,timing_cache={tmp_path / 't.json'}")
    first, depthwise, last = conv_names(out)
    assert static_layers(out) == {first, last}  # the depthwise reads its float input
    assert rep.skipped["int8 slower here: 4.80× float (measured)"] == 1
    assert rep.metrics["speed"] == "layers" and rep.metrics["layers_float_speed"] == 1
    assert rep.metrics["layers_int8"] == 2 and rep.metrics["layers_float"] == 1
    assert rep.metrics["speed_timed"] == 3 and rep.metrics["speed_cached"] == 0 and len(calls) == 3
    note = next(n for n in rep.notes if n.startswith("kept float for speed"))
    assert f"{depthwise} 4.80×" in note and "machine-dependent" in note and str(tmp_path / "t.json") in note


def test_the_margin_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    out, rep = quantize(mobile_block(), f"target=none,speed_margin=5,timing_cache={tmp_path / 't.json'}")
    assert len(static_layers(out)) == 3 and rep.metrics["layers_float_speed"] == 0
    out, rep = quantize(mobile_block(), f"target=none,speed_margin=0.4,timing_cache={tmp_path / 't.json'}")
    assert not static_layers(out) and rep.metrics["layers_float_speed"] == 3


def test_a_second_run_reads_the_cache_and_gives_the_same_bytes(tmp_path, monkeypatch):
    cache = tmp_path / "timings.json"
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    out1, rep1 = quantize(mobile_block(), f"target=none,timing_cache={cache}")
    written = cache.read_bytes()
    monkeypatch.setattr(layer_speed, "time_pair", no_timer)
    monkeypatch.setattr(speed_mod, "latency_ratio", no_timer)  # the guard's timing is cached too
    out2, rep2 = quantize(mobile_block(), f"target=none,timing_cache={cache}")
    assert rep2.metrics["speed_timed"] == 0 and rep2.metrics["speed_cached"] == 3
    assert out1.SerializeToString() == out2.SerializeToString()
    assert cache.read_bytes() == written  # nothing new: the file is not rewritten
    assert rep1.skipped == rep2.skipped
    data = json.loads(written)  # the plan's timing cache format: one file can hold both
    assert data["format"] == 1 and len(data["entries"]) == 4  # 3 layer kinds, 1 whole-model guard
    assert sum(k.startswith("int8-model|") for k in data["entries"]) == 1


def test_the_default_cache_lives_under_onnxslim_kit_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXSLIM_KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    quantize(mobile_block(), "target=none")
    assert len(layer_speed._read(tmp_path / "timings.json")) == 4


def test_the_key_names_the_layer_kind_and_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    model = mobile_block()
    quantize(model, f"target=none,timing_cache={tmp_path / 't.json'}")
    entries = {k: v for k, v in layer_speed._read(tmp_path / "t.json").items() if k.startswith("int8-layer|")}
    [key] = [k for k in entries if "group=8" in k]
    for part in ("int8-layer|Conv|", "x=1x8x12x12", "w=8x1x3x3", "strides=2x2", "pads=1x1x1x1", "dilations=1x1",
                 "act=Relu", "a=uint8", "per_channel=1", "bias=1", "CPUExecutionProvider", "threads=1",
                 f"ort={onnxruntime.__version__}", f"cpu={layer_speed.cpu_model()}"):
        assert part in key, part
    entry = entries[key]
    assert entry["ratio"] == 4.8 and entry["group"] == 8 and entry["cpu"] == layer_speed.cpu_model()
    assert len({k for k in entries}) == 3  # three kinds: 3→8 3×3, depthwise, pointwise


def test_speed_off_and_the_older_spelling_time_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(layer_speed, "time_pair", no_timer)
    for options in ("speed=off", "speed_check=false"):
        out, rep = quantize(mobile_block(), f"target=none,{options},timing_cache={tmp_path / 't.json'}")
        assert rep.metrics["speed"] == "off" and len(static_layers(out)) == 3
    assert not (tmp_path / "t.json").exists()


def test_the_fidelity_search_runs_with_the_slow_layers_float(tmp_path, monkeypatch):
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    out, rep = quantize(mobile_block(), f"target=cos:0.999,timing_cache={tmp_path / 't.json'}", samples=8)
    depthwise = conv_names(out)[1]
    assert depthwise not in static_layers(out) and rep.metrics["layers_float_speed"] == 1
    assert rep.metrics["budget_used"] <= rep.metrics["budget_allowed"]
    assert not any(depthwise in n for n in rep.notes if n.startswith("float for the target"))


def test_a_broken_cache_is_a_one_line_error(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not JSON"):
        quantize(mobile_block(), f"target=none,timing_cache={bad}")
    bad.write_text('{"format": 99, "entries": {}}')
    with pytest.raises(UserError, match="not an onnxslim_kit timing cache"):
        quantize(mobile_block(), f"target=none,timing_cache={bad}")


CONV = {"op": "Conv", "x": "1x8x12x12", "w": "8x1x3x3", "act": "Relu", "a": "uint8", "per_channel": 1, "bias": 1,
        "group": 8, "strides": "2x2", "dilations": "1x1", "pads": "1x1x1x1", "auto_pad": "NOTSET"}
KINDS = [
    (CONV, "QLinearConv"),
    ({**CONV, "act": "Clip(0,6)", "group": 1, "w": "4x8x3x3"}, "QLinearConv"),
    ({**CONV, "act": "Clip()"}, "QLinearConv"),
    ({**CONV, "act": "none", "a": "int8", "per_channel": 0, "bias": 0, "group": 1, "w": "4x8x1x1",
      "pads": "0x0x0x0", "strides": "1x1"}, "QLinearConv"),
    ({"op": "Gemm", "x": "2x16", "w": "16x8", "act": "none", "a": "uint8", "per_channel": 1, "bias": 1,
      "transB": 0}, "QGemm"),
    ({"op": "MatMul", "x": "1x4x16", "w": "16x8", "act": "none", "a": "uint8", "per_channel": 1, "bias": 0},
     "QLinearMatMul"),
    ({"op": "MatMul", "x": "1x2x4x8", "b": "1x2x8x4", "act": "none", "a": "uint8", "per_channel": 0},
     "QLinearMatMul"),
]


@pytest.mark.parametrize("fields, kernel", KINDS, ids=lambda v: v if isinstance(v, str) else v["op"])
def test_the_int8_form_is_what_ort_fuses_and_computes_the_same_op(fields, kernel):
    f_model, q_model, f_feed, q_feed = layer_speed.build_pair(fields)
    onnx.checker.check_model(f_model, full_check=True)
    onnx.checker.check_model(q_model, full_check=True)
    executed = Counter(n.op_type for n in optimized_graph(q_model).graph.node)
    boundary = 0 if fields["a"] == "uint8" else 1  # int8 activations: a Q in front, a DQ behind (docstring)
    assert executed[kernel] == 1 and executed["DequantizeLinear"] == boundary == executed["QuantizeLinear"]
    sessions = [onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                for m in (f_model, q_model)]
    y_float, y_int8 = (s.run(None, f)[0] for s, f in zip(sessions, (f_feed, q_feed)))
    assert y_float.shape == y_int8.shape


def test_a_real_pair_is_timed(monkeypatch):
    monkeypatch.setattr(layer_speed, "BUDGET_S", 0.0)  # the fewest rounds
    timing = layer_speed.time_pair(CONV)
    assert timing["rounds"] == layer_speed.MIN_ROUNDS and timing["reps"] >= 1
    assert timing["float_ms"] > 0 and timing["int8_ms"] > 0 and timing["ratio"] > 0
    assert timing["spread"][0] <= timing["ratio"] <= timing["spread"][1]


def test_describe_reads_the_layer_kind_from_the_graph():
    from onnxslim_kit.api import PassResult
    from onnxslim_kit.passes.int8 import plan as plan_mod

    model = Model.from_proto(mobile_block())
    layers = plan_mod.find_layers(model.graph, PassResult())
    shapes = {"x": [1, 3, 12, 12], layers[1].inputs[0].name: [1, 8, 12, 12], layers[2].inputs[0].name: [1, 8, 6, 6]}

    class Spec:  # the LayerSpec fields describe() reads
        def __init__(self, layer):
            self.op, self.inputs, self.output = layer.node.op, [t.name for t in layer.inputs], layer.output.name
            self.weight_index, self.bias_index = layer.weight_index, 2

    fields = [layer_speed.describe(Spec(l), l.node, shapes, "uint8", True) for l in layers]
    assert [f["act"] for f in fields] == ["Relu", "Relu", "none"]
    assert fields[1]["group"] == 8 and fields[1]["x"] == "1x8x12x12" and fields[2]["w"] == "4x8x1x1"
    assert layer_speed.describe(Spec(layers[0]), layers[0].node, {}, "uint8", True) is None  # shape unknown


def test_the_whole_model_guard_keeps_float_when_the_joins_cost_more(tmp_path, monkeypatch):
    """Each layer pays, the candidate does not (the Q/DQ between layers): the model stays float."""
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    monkeypatch.setattr(speed_mod, "latency_ratio", lambda c, r, s: (1.3, [1.2, 1.4], 5))
    model = mobile_block()
    out, rep = quantize(model, f"target=none,timing_cache={tmp_path / 't.json'}")
    assert not static_layers(out) and rep.metrics["speed_ratio"] == 1.3 and rep.metrics["layers_int8"] == 0
    assert any("int8 would be 1.30× the float latency" in n and "pass speed=off to force" in n for n in rep.notes)


def test_auto_is_layers_unless_the_environment_names_a_speed(monkeypatch):
    monkeypatch.delenv(layer_speed.SPEED_ENV, raising=False)
    assert layer_speed.resolve_speed("auto") == "layers"
    monkeypatch.setenv(layer_speed.SPEED_ENV, " OFF ")
    assert layer_speed.resolve_speed("auto") == "off"
    assert layer_speed.resolve_speed("model") == "model"  # an explicit option wins over the variable
    monkeypatch.setenv(layer_speed.SPEED_ENV, "fast")
    with pytest.raises(UserError, match="ONNXSLIM_KIT_SPEED"):
        layer_speed.resolve_speed("auto")


def test_the_default_times_the_layers_when_the_environment_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv(layer_speed.SPEED_ENV, raising=False)
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    out, rep = quantize(mobile_block(), f"speed=auto,target=none,timing_cache={tmp_path / 't.json'}")
    assert rep.metrics["speed"] == "layers" and rep.metrics["layers_float_speed"] == 1
    monkeypatch.setenv(layer_speed.SPEED_ENV, "off")
    out, rep = quantize(mobile_block(), f"speed=auto,target=none,timing_cache={tmp_path / 't.json'}")
    assert rep.metrics["speed"] == "off" and len(static_layers(out)) == 3


def test_the_whole_model_check_is_skipped_above_the_weight_bound(tmp_path, monkeypatch, whole_model_pays):
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    model = mobile_block()
    weights = 4 * (8 * 3 * 3 * 3 + 4 * 8)  # float32 weights of the two int8 Convs (the depthwise stays float)
    from onnxslim_kit.passes.int8 import speed_decision
    monkeypatch.setattr(speed_decision, "MODEL_CHECK_MAX_BYTES", weights - 1)
    out, rep = quantize(model, f"target=none,timing_cache={tmp_path / 't.json'}")
    assert not whole_model_pays and "speed_ratio" not in rep.metrics
    assert any(n.startswith("whole-model speed check skipped") for n in rep.notes)
    assert static_layers(out) == {conv_names(out)[0], conv_names(out)[2]}  # the per-layer decision stands
    monkeypatch.setattr(speed_decision, "MODEL_CHECK_MAX_BYTES", weights)
    quantize(model, f"target=none,timing_cache={tmp_path / 't2.json'}")
    assert whole_model_pays  # at the bound it is timed


@pytest.mark.parametrize("model_ratio", [0.5, 1.3], ids=["int8-pays", "model-kept-float"])
def test_a_recipe_replays_the_timed_decision_without_timing(tmp_path, monkeypatch, model_ratio):
    """The report's pass list records what the timings decided (``speed=off`` and
    ``speed_decided``), so ``--recipe`` gives the same bytes on a machine that times nothing."""
    from onnxslim_kit.cli import main

    monkeypatch.delenv(layer_speed.SPEED_ENV, raising=False)
    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    monkeypatch.setattr(speed_mod, "latency_ratio", lambda c, r, s: (model_ratio, [model_ratio] * 2, 3))
    path, first, again = tmp_path / "m.onnx", tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(mobile_block(), path)
    args = ["--passes", f"int8(target=none,timing_cache={tmp_path / 't.json'})", "-q"]
    assert main([str(path), *args, "-o", str(first), "--report", str(tmp_path / "r.json")]) == 0
    options = json.loads((tmp_path / "r.json").read_text())["pass_list"][0]["options"]
    depthwise = conv_names(onnx.load(first))[1]  # named by the pass
    assert options["speed"] == "off" and options["speed_decided"] == ("*" if model_ratio > 1 else depthwise)
    monkeypatch.setattr(layer_speed, "time_pair", no_timer)
    monkeypatch.setattr(speed_mod, "latency_ratio", no_timer)
    monkeypatch.setenv("ONNXSLIM_KIT_CACHE", str(tmp_path / "elsewhere"))  # another machine: no cache
    assert main(["--recipe", str(tmp_path / "r.json"), "-o", str(again), "-q"]) == 0
    assert first.read_bytes() == again.read_bytes()
    assert len(static_layers(onnx.load(again))) == (0 if model_ratio > 1 else 2)


def test_a_replayed_decision_must_name_layers_of_the_model(tmp_path):
    with pytest.raises(UserError, match="speed_decided.*'nope' is not a layer"):
        quantize(mobile_block(), "speed=off,target=none,speed_decided=nope")


def test_above_the_weight_bound_the_shapes_come_from_the_graph_alone(tmp_path, monkeypatch):
    """Large models: no export and no run for the layer kinds; the graph's known shapes decide
    (mobile_block's are all fixed, so the decision is the small path's)."""
    import onnxslim_kit.bench_macs as bench_macs
    from onnxslim_kit.passes.int8 import calib_groups

    monkeypatch.setattr(layer_speed, "time_pair", fake_timer([]))
    small, rep_small = quantize(mobile_block(), f"target=none,timing_cache={tmp_path / 'a.json'}")
    monkeypatch.setattr(layer_speed, "MODEL_CHECK_MAX_BYTES", 0)
    monkeypatch.setattr(calib_groups, "EXPORT_MAX_BYTES", 0)  # nor for the calibration's run sizes
    monkeypatch.setattr(bench_macs, "main_shapes", lambda *a, **k: (_ for _ in ()).throw(AssertionError("exported")))
    big, rep_big = quantize(mobile_block(), f"target=none,timing_cache={tmp_path / 'b.json'}")
    assert rep_big.metrics["layers_float_speed"] == rep_small.metrics["layers_float_speed"] == 1
    assert rep_big.metrics["layers_speed_untimed"] == 0 and static_layers(big) == static_layers(small)


def test_graph_shapes_read_symbolic_dims_at_the_samples_sizes():
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
    g (float[batch, seq, 4] x) => (float[batch, seq, 2] y) {
        h = MatMul (x, w)
        y = Relu (h)
    }""")
    model.graph.initializer.append(numpy_helper.from_array(np.ones((4, 2), np.float32), "w"))
    graph = Model.from_proto(onnx.shape_inference.infer_shapes(model)).graph
    shapes = layer_speed._graph_shapes(graph, {"x": np.zeros((1, 32, 4), np.float32)})
    assert shapes["x"] == [1, 32, 4] and shapes["w"] == [4, 2] and shapes["h"] == [1, 32, 2]
