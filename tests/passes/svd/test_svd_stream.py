"""Statistics a group of layers at a time (:mod:`onnxslim_kit.passes.svd.stream`) and the
frozen full-rank factors the allocation keeps (:class:`.maths.factor.Factors`)."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper

from onnxslim_kit.passes._common.layer_stats import collect, match_layer
from onnxslim_kit.passes.svd.maths.factor import Factorization
from onnxslim_kit.passes.svd.stream import groups, release

TEXT = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 40, 4] x) => (float[1, 40, 6] y, float[1, 40, 3] z) {
        h = MatMul(x, w1)
        y = MatMul(h, w2)
        z = MatMul(x, w3)
    }"""


def _model(rng):
    model = onnx.parser.parse_model(TEXT)
    for name, shape in (("w1", (4, 24)), ("w2", (24, 6)), ("w3", (4, 3))):
        model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    graph = gs.import_onnx(model)
    layers = [match_layer(node, graph, graph).value for node in graph.nodes]
    samples = [{"x": rng.standard_normal((1, 40, 4)).astype(np.float32)} for _ in range(3)]
    return model, layers, samples


def test_groups_partition_the_layers_and_match_collect(rng):
    model, layers, samples = _model(rng)
    whole = collect(model, layers, samples, want_gram=True)
    # 120 rows: the 4-input layers whiten (≥ 8 rows), the 24-input one too (≥ 48); a budget
    # below one Gram matrix puts each distinct input in a group of its own
    parts = list(groups(model, layers, samples, aware=True, budget=1))
    seen = [layer for group, _stats in parts for layer in group]
    assert sorted(map(id, seen)) == sorted(map(id, layers))
    assert [len(g) for g, _ in parts] == [2, 1]  # w1 and w3 read x the same way: one matrix, one group
    for group, stats in parts:
        for layer in group:
            np.testing.assert_allclose(stats[layer.key].normalized_gram, whole[layer.key].normalized_gram, rtol=1e-6)
            assert stats[layer.key].half(1)[0] is not None  # the halves for the cross-fitting
        release(stats)
        assert all(stats[layer.key].gram is None and stats[layer.key].half(0)[0] is None for layer in group)
        assert all(stats[layer.key].rows_per_sample == 40 for layer in group)


def test_layers_too_short_to_whiten_get_no_gram_matrix(rng):
    model, layers, samples = _model(rng)
    few = samples[:1]  # 40 rows: enough to whiten the 4-input layers only (< 2·24)
    parts = list(groups(model, layers, few, aware=True))
    plain = {id(layer) for layer in parts[0][0]}
    assert plain == {id(layers[1])} and parts[0][1][layers[1].key].gram is None
    assert parts[0][1][layers[1].key].gram_rows == 40  # the bound the plan's note shows
    # alloc wants every matrix; data-free wants none
    assert all(stats[l.key].gram is not None for g, stats in groups(model, layers, few, True, need_all=True) for l in g)
    assert all(stats[l.key].gram is None for g, stats in groups(model, layers, few, aware=False) for l in g)


def test_frozen_factors_truncate_like_the_factorisation(rng):
    w = rng.standard_normal((12, 7))
    x = rng.standard_normal((50, 12)) * np.linspace(0.1, 3, 12)
    fact = Factorization(w, x.T @ x / 50, 50, float(np.sum(np.sum(x**2, 1) ** 2)))
    frozen = fact.frozen()
    for r in (1, 3, 7):
        for got, want in zip(frozen.factors(r), fact.factors(r)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.matmul(*frozen.factors(7)), w, rtol=1e-8, atol=1e-10)


def test_allocation_runs_on_a_model_whose_weights_stay_in_a_data_file(rng, tmp_path):
    """The spectrum trials turn a weight into a graph input: its type and shape come from the
    proto, not from reading the tensor (a weight left in the external data file has none)."""
    from onnxslim_kit import optimize

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 64, 32] x) => (float[1, 64, 32] y) {
            h = MatMul(x, w1)
            y = MatMul(h, w2)
        }""")
    # low-rank weights: the allocation factorises them
    for name in ("w1", "w2"):
        w = (rng.standard_normal((32, 2)) @ rng.standard_normal((2, 32))).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(w, name))
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
              size_threshold=0)
    calib = [{"x": rng.standard_normal((1, 64, 32)).astype(np.float32)} for _ in range(16)]
    out, report = optimize(str(path), "svd(alloc=spectrum,measure=false)", calib=calib)
    entry = report.passes[0]
    assert entry.metrics["flops_removed"] > 0.5 and entry.metrics["budget_used"] <= 1, entry.notes


def test_the_streamed_error_curve_is_the_cross_fitted_one(rng):
    from onnxslim_kit.passes.svd.alloc import Candidate, crossfit_error
    from onnxslim_kit.passes.svd.budget import _crossfit_error

    model, layers, samples = _model(rng)
    layer = layers[1]
    entry = collect(model, [layer], samples + samples[:1], want_gram=True)[layer.key]  # 4 samples: 2 a half
    halves = [entry.half(i) for i in (0, 1)]
    cand = Candidate(layer, None, tuple(Factorization(layer.matrix, *h) for h in halves), 0,
                     half_grams=tuple(h[0] for h in halves))
    want = crossfit_error(cand)
    assert want.shape == (6,) and want[0] > want[4] > 0
    np.testing.assert_allclose(_crossfit_error(layer, entry), want, rtol=1e-10, atol=1e-14)
