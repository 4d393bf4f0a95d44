"""``cluster`` at scale: k-means on a sketch of a large weight, the strided exact-limit probe,
batched per-row codebooks, the GPTQ factor without ``H⁻¹`` (and in low-rank form from held rows),
Gram rows instead of ``H``, and the large-model mode (labels in a scratch file, proxied per-layer
damages)."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import onnxslim_kit.passes.cluster as cluster_pass
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline
from onnxslim_kit.passes.cluster import grams, select
from onnxslim_kit.passes.cluster.maths import gptq, kmeans, rows


def _sse(values, codebook):
    return float(np.sum((values - codebook[kmeans.nearest(np.sort(codebook).astype(np.float64), values)]) ** 2))


def test_sketch_codebook_is_as_good_as_the_sorted_one_and_deterministic(rng, monkeypatch):
    values = np.concatenate([rng.standard_normal(150_000), 4 * rng.standard_normal(5_000)]).astype(np.float32)
    exact, _ = kmeans.kmeans_1d(values, 16, False)
    monkeypatch.setattr(kmeans, "SKETCH_ABOVE", 1000)
    sketched, labels = kmeans.kmeans_1d(values, 16, False)
    again, _ = kmeans.kmeans_1d(values, 16, False)
    np.testing.assert_array_equal(sketched, again)
    assert _sse(values, sketched) <= 1.01 * _sse(values, exact)
    np.testing.assert_array_equal(labels, kmeans.nearest(sketched.astype(np.float64), values.astype(np.float64)))
    book_only, none = kmeans.kmeans_1d(values, 16, False, labels=False)
    assert none is None
    np.testing.assert_array_equal(book_only, sketched)


def test_sketch_keeps_zero_and_the_exact_limit(rng, monkeypatch):
    monkeypatch.setattr(kmeans, "SKETCH_ABOVE", 1000)
    values = rng.standard_normal(20_000).astype(np.float32)
    values[::3] = 0.0
    codebook, labels = kmeans.kmeans_1d(values, 8, True)
    assert 0.0 in codebook and np.all(codebook[labels][values == 0] == 0)
    assert np.all(codebook[labels][values != 0] != 0)  # a non-zero value never decodes to the kept zero
    few = rng.choice(rng.standard_normal(5), 50_000).astype(np.float32)
    book, lab = kmeans.kmeans_1d(few, 8, True)
    np.testing.assert_array_equal(book[lab], few)  # at most k distinct: stored exactly


def test_codebooks_for_several_k_are_kmeans_ones(rng, monkeypatch):
    values = rng.standard_normal(30_000).astype(np.float32)
    values[::7] = 0.0
    weights = rng.uniform(0.5, 2.0, values.size)
    few = rng.choice([0.0, 0.5, -1.5], 3000).astype(np.float32)  # 3 distinct, a zero among them
    for above in (kmeans.SKETCH_ABOVE, 1000):  # sorted values, then a sketch
        monkeypatch.setattr(kmeans, "SKETCH_ABOVE", above)
        for data, w, keep in ((values, weights, True), (values, None, False), (few, None, True)):
            got = kmeans.codebooks_1d(data, [16, 3, 256], keep, weights=w)
            for k, book in zip([16, 3, 256], got):
                np.testing.assert_array_equal(book, kmeans.kmeans_1d(data, k, keep, weights=w)[0])


def test_the_exact_limit_probe_agrees_with_a_full_count(rng):
    few = rng.choice(rng.standard_normal(6), 100_000)
    assert kmeans.at_most_distinct(few, 6) and not kmeans.at_most_distinct(few, 5)
    mostly = np.zeros(100_000)
    mostly[12345] = 1.0  # a value the strided probe does not see
    assert kmeans.at_most_distinct(mostly, 2) and not kmeans.at_most_distinct(mostly, 1)
    assert not kmeans.at_most_distinct(rng.standard_normal(100_000), 256)


def test_batched_row_codebooks_match_the_per_row_loop(rng, monkeypatch):
    weight = (rng.standard_normal((48, 300)) * rng.uniform(0.5, 2, (48, 1))).astype(np.float32)
    weight[5] = rng.choice([0.5, -0.25, 1.0], 300)  # one row at the exact limit
    weight[9, 17] = 0.0  # one stray zero: its row alone takes its own k-means, the zero kept
    looped, loop_labels, _ = rows.row_codebooks(weight, 0, 8, True)
    monkeypatch.setattr(rows, "BATCH_ABOVE", 0)
    batched, batch_labels, exact = rows.row_codebooks(weight, 0, 8, True)

    def error(books, labels):
        return float(np.sum((np.take_along_axis(books.astype(np.float64), labels, axis=1) - weight) ** 2))
    assert not exact
    assert error(batched, batch_labels) <= 1.02 * error(looped, loop_labels)
    np.testing.assert_array_equal(np.take_along_axis(batched, batch_labels, axis=1)[5], weight[5].astype(np.float16))
    np.testing.assert_array_equal(batched[9], looped[9])
    assert batched[9, batch_labels[9, 17]] == 0.0
    assert np.all(np.diff(batched.astype(np.float64), axis=1) >= 0)
    _, none, _ = rows.row_codebooks(weight, 0, 8, True, labels=False)
    assert none is None


def test_the_factor_is_the_upper_cholesky_factor_of_the_damped_inverse(rng):
    x = rng.standard_normal((40, 12))
    h = x.T @ x / 40
    h[:, 3] = h[3, :] = 0.0  # a dead input
    dead, upper = gptq.gptq_factor(h)
    damped = h.copy()
    damped[3, 3] = 1.0
    damped += gptq.DAMPING * np.mean(np.diag(damped)) * np.eye(12)
    assert dead.tolist() == [i == 3 for i in range(12)]
    np.testing.assert_allclose(upper.T @ upper, np.linalg.inv(damped), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.tril(upper, -1), 0.0)


def test_the_low_rank_factor_is_the_dense_one_and_assigns_the_same_labels(rng, monkeypatch):
    x = (rng.standard_normal((24, 4)) @ rng.standard_normal((4, 150)) + 0.3 * rng.standard_normal((24, 150)))
    x = x.astype(np.float32)
    x[:, 7] = 0.0  # a dead input
    r64 = x.astype(np.float64)
    dead, upper = gptq.gptq_factor(r64.T @ r64 / 24)
    low_dead, low = gptq.lowrank_factor(x, 24)
    np.testing.assert_array_equal(low_dead, dead)
    np.testing.assert_allclose(np.triu(low.w @ low.g.T, 1) + np.diag(low.d), upper, rtol=1e-9, atol=1e-12)
    m = rng.standard_normal((30, 150))
    book, books = np.sort(rng.standard_normal(16)), np.sort(rng.standard_normal((30, 8)), axis=1)
    monkeypatch.setattr(gptq, "BLOCK", 32)  # several blocks, the last one shorter
    for codebook, scales in ((book, rng.uniform(0.5, 2, 30)), (books, np.ones(30))):
        np.testing.assert_array_equal(gptq.gptq_assign(m, None, codebook, scales, m == 0, factor=(low_dead, low)),
                                      gptq.gptq_assign(m, None, codebook, scales, m == 0, factor=(dead, upper)))
    held = grams.Gram()
    held.add(x, True)
    assert isinstance(held.factor()[1], gptq.LowRank)  # 24 rows, 150 wide
    wide = grams.Gram()
    wide.add(x[:, :80], True)  # 24 rows, 80 wide: more than a quarter, the dense factor
    assert isinstance(wide.factor()[1], np.ndarray)


def test_held_rows_give_the_same_gram_and_switch_to_the_matrix(rng):
    first, second = rng.standard_normal((5, 16)).astype(np.float32), rng.standard_normal((6, 16)).astype(np.float32)
    held, dense = grams.Gram(), grams.Gram()
    for part in (first, second):
        held.add(part, True)
        dense.add(part, False)
    assert held.total is None and len(held.held) == 2 and dense.held is None
    np.testing.assert_allclose(held.normalized_gram, dense.normalized_gram, rtol=1e-12)
    held.add(rng.standard_normal((30, 16)).astype(np.float32), True)  # 41 rows ≥ 2 × 16: the matrix now
    assert held.held is None and held.total is not None and held.gram_rows == 41


MLP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 256] x) => (float[8, 256] y) {
    a = MatMul(x, w1)
    b = Relu(a)
    c = MatMul(b, w2)
    d = Relu(c)
    y = MatMul(d, w3)
}
"""


def _mlp(rng) -> onnx.ModelProto:
    model = onnx.parser.parse_model(MLP)
    for name in ("w1", "w2", "w3"):
        w = (rng.standard_normal((256, 256)) / 16).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(w, name))
    return model


def _run(model, spec, samples):
    out, report = run_pipeline(model, parse_pass_list(spec), CalibrationFeed(input_specs(model), samples))
    return out, report.passes[0]


def test_large_model_mode_proxies_the_damages_and_holds_the_target(rng, monkeypatch):
    model = _mlp(rng)
    samples = [{"x": rng.standard_normal((8, 256)).astype(np.float32)} for _ in range(16)]
    spec = "cluster(k=4,target=cos:0.999)"
    _, measured = _run(model, spec, samples)
    calls = []
    original = select.proxied_damages
    monkeypatch.setattr(select, "proxied_damages",
                        lambda *a: calls.append(sum(it.rows is not None for it in a[0])) or original(*a))
    monkeypatch.setattr(cluster_pass, "LARGE_BYTES", 0)
    monkeypatch.setattr(select, "MEASURE_BYTES", 0)
    out, proxied = _run(model, spec, samples)
    assert calls and calls[0] >= 2, "the proxy was not used"  # the layers' GPTQ rows feed it
    for entry in (measured, proxied):
        assert entry.metrics["target_cosine_measured"] >= 0.999
        assert entry.metrics["weights_assigned_by_gptq"] > 0
    assert proxied.metrics["weights_clustered"] >= 1
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, samples[0])[0].shape == (8, 256)
    again, _ = _run(model, spec, samples)
    assert again.SerializeToString() == out.SerializeToString()  # deterministic


def test_the_packed_stream_is_the_packing_of_the_concatenation(rng):
    from onnxslim_kit.passes.cluster import stream
    from onnxslim_kit.passes.cluster.maths.encode import pack_labels
    for sizes in ([7, 4, 10], [1], [3, 3], [12, 1, 1, 6]):
        flats = [rng.integers(0, 16, n).astype(np.uint8) for n in sizes]
        joined = np.concatenate(flats)
        pad = joined.size % 2
        want = pack_labels(np.concatenate([joined, np.zeros(pad, np.uint8)]), 16)[0]
        np.testing.assert_array_equal(stream._packed_stream(flats, pad), want)


def _outputs(model, sample, opt):
    options = ort.SessionOptions()
    options.graph_optimization_level = opt
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, sample)[0]


def test_the_lean_decoder_of_a_large_stream_decodes_the_same_weights(rng, monkeypatch):
    from onnxslim_kit.passes.cluster import stream
    model = _mlp(rng)
    model.graph.node[0].op_type = "Gemm"  # a Gemm transB=1 weight: its channel axis is 0
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("transB", 1))
    samples = [{"x": rng.standard_normal((8, 256)).astype(np.float32)} for _ in range(16)]
    for spec in ("cluster(k=4,target=none)", "cluster(k=32,target=none)", "cluster(k=4,per_channel=true,target=none)"):
        plain, _ = _run(model, spec, samples)
        with monkeypatch.context() as patch:
            patch.setattr(stream, "LEAN_ABOVE", 0)
            lean, _ = _run(model, spec, samples)
        ops = {n.op_type for n in lean.graph.node}
        assert "GatherElements" in ops and plain.SerializeToString() != lean.SerializeToString()
        if spec == "cluster(k=32,target=none)":  # 8-bit: each weight's labels an initializer, shaped, no Split
            labels = [t for t in lean.graph.initializer if t.name.startswith("cluster/labels8")]
            assert [list(t.dims) for t in labels] == [[256, 256]] * 3 and "Split" not in ops
        for opt in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
            np.testing.assert_array_equal(_outputs(lean, samples[0], opt), _outputs(plain, samples[0], opt))


def test_decoding_in_place_is_the_product_bit_for_bit(rng):
    """``Clustered.decoded`` scales the looked-up values in place where the product keeps their
    dtype and shape; bit for bit what ``(values * scales).astype(dtype)`` gives."""
    from onnxslim_kit.passes.cluster.maths.encode import Clustered

    labels = rng.integers(0, 16, (12, 10)).astype(np.uint8)
    cases = [(np.float32, None, np.float32, (12, 1)), (np.float16, np.float32, np.float16, (1, 10)),
             (np.float32, None, np.float64, (12, 1)), (np.float32, None, np.float32, (2, 12, 1))]
    for book_dtype, dtype, scale_dtype, scale_shape in cases:
        book = rng.standard_normal(16).astype(book_dtype)
        scales = rng.random(scale_shape).astype(scale_dtype) + 0.5
        wide = book if dtype is None else book.astype(dtype)
        expected = (wide[labels] * scales).astype(wide.dtype)
        got = Clustered(book, labels, scales, per_channel=False, dtype=dtype).decoded()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8))
