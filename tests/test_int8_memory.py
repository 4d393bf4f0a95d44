"""Memory-saving steps of the int8 search: the same numbers as the plain forms."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnxslim_kit.passes import _quant_qdq as qdq
from onnxslim_kit.passes._quant_fallback import SharedWeights, give_back, run
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
