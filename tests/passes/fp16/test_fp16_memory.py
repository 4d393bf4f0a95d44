"""The ``fp16`` drift search's memory: every trial and the result read one float16 array per
weight (computed once, never copied), a trial's emulation is exactly the rounded float32 model,
its session is fed the arrays themselves, and the cache keeps scores only."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from conftest import run_ort
from test_fp16 import build, feeds

from onnxslim_kit.api import Fidelity
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.model import Model
from onnxslim_kit.passes.fp16 import apply as fp16_apply
from onnxslim_kit.passes.fp16 import search as fp16_search
from onnxslim_kit.passes.fp16.plan import build_plan

RNG = np.random.default_rng(11)
CHAIN = "a = MatMul(x, W1)\nb = Relu(a)\nc = MatMul(b, W2)\ny = Add(c, B)"


def chain():
    return build(CHAIN, "float[4, 64] x", {"W1": RNG.standard_normal((64, 64)).astype(np.float32),
                                           "W2": RNG.standard_normal((64, 64)).astype(np.float32),
                                           "B": RNG.standard_normal(64).astype(np.float32)})


def search_for(model, target="none"):
    samples = CalibrationFeed(input_specs(model), None, num_samples=2).take(2)
    dtypes = {v.name: np.dtype(np.float32) for v in list(model.graph.value_info) + list(model.graph.output)}
    fid = Fidelity.build(model, target, samples, "test samples")
    search = fp16_search.Search(model, (dtypes, {}, True), {"keep_io": True, "merge_limit": -1}, fid)
    work = Model.from_proto(model)
    infos = build_plan(work.graph, dtypes, {}, True)
    return search, {k for k, info in enumerate(infos) if info.reason is None}, infos


def rounded(model) -> onnx.ModelProto:
    """The old emulation's weights: every float weight replaced by fp32(fp16(W))."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        values = onnx.numpy_helper.to_array(t).astype(np.float16).astype(np.float32)
        t.CopyFrom(onnx.numpy_helper.from_array(values, t.name))
    return out


def test_emulation_reads_the_shared_float16_arrays_and_equals_the_rounded_model():
    model = chain()
    search, half, _ = search_for(model)
    merged, emulation = search.emulation(half)
    assert merged == half
    casts = [n for n in emulation.graph.nodes if n.op == "Cast" and isinstance(n.inputs[0], gs.Constant)]
    assert len(casts) == 3  # W1, W2, B: read as Cast(float16 → float) at run time
    for node in casts:
        values = node.inputs[0].values
        assert values.dtype == np.float16
        assert any(values is shared for shared in search.halves.values())  # the array itself, no copy
    assert not [t for t in emulation.graph.tensors().values()
                if isinstance(t, gs.Constant) and np.dtype(t.dtype) == np.float32 and t.values.size > 1]
    # fed as graph inputs (ORT reads fed arrays in place)
    session, weights = fp16_search.session(emulation)
    assert set(weights) == {n.inputs[0].name for n in casts if n.inputs[0].values.nbytes >= 1024}  # B: in the proto
    assert all(any(w is shared for shared in search.halves.values()) for w in weights.values())
    # Cast(fp16(W)) at run time is the rounded float32 weight exactly; the tensors are rounded too
    x = feeds(model)
    got = fp16_search.run(session, {**x, **weights})["y"]
    reference = rounded(model)
    old = Model.from_proto(reference)
    infos = build_plan(old.graph, {v.name: np.dtype(np.float32) for v in list(reference.graph.value_info)
                                   + list(reference.graph.output)}, {}, True)
    fp16_apply.emulate(old, infos, half, True)
    old.commit()
    np.testing.assert_array_equal(got, run_ort(old.to_proto(), x)[0])


def test_trials_keep_scores_only_and_drop_the_float16_values_they_do_not_read():
    model = chain()
    search, half, infos = search_for(model)
    first = search.evaluate(half)
    assert set(search.halves) == {"W1", "W2", "B"}
    assert not any(isinstance(v, (onnx.ModelProto, Model)) for v in vars(first).values())
    add = next(k for k in half if infos[k].node.op == "Add")
    second = search.evaluate(half - {add})
    assert set(search.halves) == {"W1", "W2"}  # B's node runs float32: its float16 copy is gone
    assert search.evaluate(half) is first and search.count == 2  # the cache answers, no new run
    assert 0.99 < second.cosine <= 1.0 and 0.99 < first.cosine <= 1.0


def test_the_result_shares_the_float16_arrays_of_the_search():
    model = chain()
    search, half, _ = search_for(model)
    trial = search.evaluate(half)
    final, casts = search.build(trial)
    weights = {t.name: t.values for t in final.graph.tensors().values() if isinstance(t, gs.Constant)}
    assert casts == 2 and all(weights[name] is search.halves[name] for name in ("W1", "W2", "B"))
    x = feeds(model)
    np.testing.assert_allclose(run_ort(final.to_proto(), x)[0], run_ort(model, x)[0], rtol=2e-2, atol=0.5)
