"""Large-layer work of ``cluster``: blocked GPTQ (:mod:`.maths.gptq`), its factor shared by a
layer's levels, Gram matrices a group at a time (:mod:`onnxslim_kit.passes.cluster.grams`),
one-byte labels (:class:`.maths.encode.Clustered`), the pages of a weight's file map dropped."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import numpy_helper

from onnxslim_kit.passes._common.layer_stats import collect, match_layer
from onnxslim_kit.passes.cluster import grams
from onnxslim_kit.passes.cluster.maths import gptq
from onnxslim_kit.passes.cluster.maths.encode import Clustered


def _problem(rng, n_out=9, k_in=37):
    # correlated inputs (5 shared factors): GPTQ's updates cancel much of the rounding error
    x = rng.standard_normal((200, 5)) @ rng.standard_normal((5, k_in)) + 0.1 * rng.standard_normal((200, k_in))
    return rng.standard_normal((n_out, k_in)), x.T @ x / 200


@pytest.mark.parametrize("block", [1, 5, 16])
def test_blocked_gptq_matches_the_column_by_column_loop(rng, monkeypatch, block):
    m, h = _problem(rng)
    book = np.sort(rng.standard_normal(8))
    books = np.sort(rng.standard_normal((9, 8)), axis=1)
    monkeypatch.setattr(gptq, "BLOCK", 10_000)  # one block: the plain loop
    plain = [gptq.gptq_assign(m, h, book, np.ones(9)), gptq.gptq_assign(m, h, books, np.ones(9))]
    monkeypatch.setattr(gptq, "BLOCK", block)  # 37 columns: a last block shorter than the others
    blocked = [gptq.gptq_assign(m, h, book, np.ones(9)), gptq.gptq_assign(m, h, books, np.ones(9))]
    for want, got in zip(plain, blocked):
        np.testing.assert_array_equal(got, want)
    # and GPTQ still beats nearest rounding on the output error (the update is not a no-op)
    near = np.abs(m[:, :, None] - book).argmin(axis=2)
    err = lambda lab: np.einsum("ri,ij,rj->", m - book[lab], h, m - book[lab])  # noqa: E731
    assert err(blocked[0]) < 0.9 * err(near)


def test_a_precomputed_factor_gives_the_same_labels(rng):
    m, h = _problem(rng)
    book = np.sort(rng.standard_normal(16))
    factor = gptq.gptq_factor(h)
    np.testing.assert_array_equal(gptq.gptq_assign(m, None, book, np.ones(9), factor=factor),
                                  gptq.gptq_assign(m, h, book, np.ones(9)))


def test_gram_groups_stay_within_the_budget_and_match_collect(rng):
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 30, 4] x) => (float[1, 30, 6] y, float[1, 30, 3] z) {
            h = MatMul(x, w1)
            y = MatMul(h, w2)
            z = MatMul(x, w3)
        }""")
    for name, shape in (("w1", (4, 16)), ("w2", (16, 6)), ("w3", (4, 3))):
        model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    graph = gs.import_onnx(model)
    layers = [match_layer(node, graph, graph).value for node in graph.nodes]
    samples = [{"x": rng.standard_normal((1, 30, 4)).astype(np.float32)} for _ in range(3)]
    whole = collect(model, layers, samples, want_gram=True)
    for budget, sizes in ((1, [2, 1]), (8 * (16 * 16 + 4 * 4), [3])):
        parts = list(grams.chunks(model, layers, samples, budget=budget))
        assert [len(group) for group, _ in parts] == sizes  # w1, w3 share x's matrix
        for group, found in parts:
            for layer in group:
                assert found[layer.key].gram_rows == 90
                np.testing.assert_allclose(found[layer.key].normalized_gram, whole[layer.key].normalized_gram,
                                           rtol=1e-6)


def test_labels_are_held_in_one_byte():
    c = Clustered(np.arange(16, dtype=np.float32), np.arange(32, dtype=np.int64).reshape(4, 8) % 16, None, False)
    assert c.labels.dtype == np.uint8
    np.testing.assert_array_equal(c.decoded(), (np.arange(32).reshape(4, 8) % 16).astype(np.float32))


def test_an_item_drops_the_pages_of_the_map_its_values_view(tmp_path, monkeypatch):
    import onnxslim_kit.passes.cluster as cluster_pass
    mapped = np.memmap(tmp_path / "w.bin", np.float32, "w+", shape=(4, 8))
    mapped[:] = 1.0
    mapped = np.memmap(tmp_path / "w.bin", np.float32, "r", shape=(4, 8))
    weight = gs.Constant("w", mapped)
    node = gs.Node("MatMul", inputs=[gs.Variable("x"), weight], outputs=[gs.Variable("y")])
    item = cluster_pass.Item(None, node, 1, np.asarray(weight.values), 1, mapped=weight.values)
    weight.values = np.memmap(tmp_path / "w.bin", np.float32, "r", shape=(4, 8))  # an export maps it anew
    released = []
    monkeypatch.setattr(cluster_pass, "release_pages", released.append)
    item.drop_pages()
    assert released and np.shares_memory(released[0], item.values)
