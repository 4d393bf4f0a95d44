"""``cluster``: 1-D k-means, 4-bit packing, exact limit (bitwise), zero kept, ORT folding, skips."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import assert_left_float, run_ort, run_zoo
from onnx import TensorProto, helper, numpy_helper
from onnxslim_kit.passes.cluster.maths.encode import pack_labels, unpack_labels
from onnxslim_kit.passes.cluster.maths.kmeans import kmeans_1d

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.metrics import compare
from onnxslim_kit.pipeline import available_passes, parse_pass_list, run_pipeline

LLOYD_MAX_16_GAUSSIAN_MSE = 0.009497  # optimal 16-level quantiser of N(0, 1) (Max, 1960)


def identity_matmul(weight: np.ndarray, opset: int = 13) -> onnx.ModelProto:
    """y = I · W: the output *is* the (decoded) weight."""
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [k, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, n])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_cluster(model, spec):
    out, report = run_pipeline(model, parse_pass_list(spec), CalibrationFeed(input_specs(model)))
    return out, report.passes[0]


def decoded(model, k):
    return run_ort(model, {"x": np.eye(k, dtype=np.float32)})[0]


@pytest.mark.parametrize("opset", [9, 13, 21])
@pytest.mark.parametrize("k,distinct,per_channel", [(16, 11, False), (16, 16, True), (64, 40, False), (256, 256, False)])
def test_few_distinct_values_are_reproduced_bitwise(opset, k, distinct, per_channel, rng):
    values = np.concatenate([[0.0], rng.standard_normal(distinct - 1)]).astype(np.float32)
    weight = rng.choice(values, size=(48, 64))
    weight.ravel()[:distinct] = values  # every value present
    model = identity_matmul(weight, opset)
    out, entry = run_cluster(model, f"cluster(k={k},per_channel={str(per_channel).lower()})")
    assert sum(entry.rewrites.values()) == 1
    assert entry.verification["status"] == "ok"
    onnx.checker.check_model(out, full_check=True)
    x = np.eye(48, dtype=np.float32) * 0.37 + rng.standard_normal((48, 48)).astype(np.float32)
    assert np.array_equal(run_ort(model, {"x": x})[0], run_ort(out, {"x": x})[0])
    assert np.array_equal(decoded(out, 48), weight)
    assert entry.metrics["bytes_after"] < entry.metrics["bytes_before"]


def test_k16_gaussian_reaches_lloyd_max(rng):
    values = rng.standard_normal(200_000)
    codebook, labels = kmeans_1d(values, 16)
    mse = np.mean((codebook[labels] - values) ** 2)
    assert len(codebook) == 16 and np.all(np.diff(codebook) > 0)
    assert abs(mse / LLOYD_MAX_16_GAUSSIAN_MSE - 1) < 0.03


def test_kmeans_finds_separated_clusters_and_is_deterministic(rng):
    centers = np.array([-5.0, 1.0, 7.0])
    values = np.repeat(centers, 1000) + rng.uniform(-0.1, 0.1, 3000)
    codebook, labels = kmeans_1d(values, 3)
    for j in range(3):
        np.testing.assert_allclose(codebook[j], values[labels == j].mean(), atol=1e-12)
        assert np.all(labels[1000 * j:1000 * (j + 1)] == j)
    again = kmeans_1d(values, 3)
    assert np.array_equal(again[0], codebook) and np.array_equal(again[1], labels)


@pytest.mark.parametrize("channel_scale", [False, True])
def test_zero_stays_an_exact_centroid(channel_scale, rng):
    weight = rng.standard_normal((64, 64)).astype(np.float32)
    weight[np.abs(weight) < 0.6] = 0.0  # a pruned weight, ~45 % zeros
    out, _entry = run_cluster(identity_matmul(weight),
                             f"cluster(k=8,target=0,channel_scale={str(channel_scale).lower()})")
    clustered = decoded(out, 64)
    assert np.array_equal(clustered == 0, weight == 0)
    levels = [len(np.unique(column)) for column in clustered.T]  # output channels of MatMul: columns
    assert max(levels) <= 8 and (channel_scale or len(np.unique(clustered)) == 8)
    sign_kept = np.sign(clustered[weight != 0]) == np.sign(weight[weight != 0])
    assert sign_kept.mean() > 0.99


def test_channel_scales_protect_small_rows(rng):
    """Output channels whose scales differ by 1000× (BN folded into a conv): a shared codebook
    without scales spends all centroids on the large channels and flattens the small ones to ~0.
    A MatMul's output channels are the columns of its weight."""
    weight = (rng.standard_normal((128, 64)) * np.logspace(-3, 0, 64)[None, :]).astype(np.float32)
    errors = {}
    for flag in ("false", "true"):
        out, _ = run_cluster(identity_matmul(weight), f"cluster(k=16,target=0,channel_scale={flag})")
        clustered = decoded(out, 128)
        row_err = np.linalg.norm(clustered - weight, axis=0) / np.linalg.norm(weight, axis=0)
        errors[flag] = np.median(row_err)
    assert errors["true"] < 0.15  # ≈ √(Lloyd–Max MSE) ≈ 0.1 for every row
    assert errors["false"] > 0.5


@pytest.mark.parametrize("size", [10, 11, 512, 1024, 4096])
def test_pack_roundtrip(size, rng):
    labels = rng.integers(0, 16, size)
    stored, packed = pack_labels(labels, 16)
    assert packed == (size % 2 == 0)
    assert stored.nbytes == (size // 2 if packed else size)
    assert np.array_equal(unpack_labels(stored, packed), labels)


def test_ort_folds_the_decoder_at_load(tmp_path, rng):
    weight = rng.standard_normal((128, 96)).astype(np.float32)
    out, entry = run_cluster(identity_matmul(weight), "cluster(k=16,per_channel=true)")
    assert entry.verification["outputs"]["y"]["cosine"] > 0.99
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    session = ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(so.optimized_model_filepath)
    assert [n.op_type for n in optimized.graph.node] == ["MatMul"]
    x = np.eye(128, dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], decoded(out, 128))


@pytest.mark.parametrize("columns,min_size,reason", [(8, 1024, "smaller than min_size"),
                                                     (1, 0, "encoding not smaller than the float weight")])
def test_skip_reasons_are_counted(columns, min_size, reason, rng):
    """A 64×8 weight under min_size; a 64×1 weight (256 bytes) that its own codebook, Reshape,
    Gather and Mul would outgrow."""
    shared = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "s")
    small = numpy_helper.from_array(rng.standard_normal((64, columns)).astype(np.float32), "t")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "s"], ["a"]), helper.make_node("MatMul", ["a", "s"], ["b"]),
         helper.make_node("MatMul", ["b", "t"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, columns])], [shared, small],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out, entry = run_cluster(model, f"cluster(k=16,target=0,min_size={min_size})")
    assert not entry.rewrites
    assert entry.skipped == {"shared weight": 2, reason: 1}
    assert [n.op_type for n in out.graph.node] == ["MatMul"] * 3


@pytest.mark.realmodel
def test_orientation_k16_shrinks_and_folds(tmp_path):
    _, out, entry = run_zoo("orientation", "cluster(k=16)", num_samples=1, verify_samples=1)
    metrics = entry.metrics
    assert metrics["size_ratio"] <= 0.2 and metrics["zlib_size_ratio"] <= 0.2
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert not [n for n in onnx.load(so.optimized_model_filepath).graph.node if n.op_type == "Gather"]


def test_gptq_assignment_lowers_output_error(rng):
    from onnxslim_kit.passes.cluster.maths.gptq import gptq_assign
    from onnxslim_kit.passes.cluster.maths.kmeans import cluster_weight, nearest

    rows, k_in, n_out = 4000, 48, 32
    x = rng.standard_normal((rows, k_in)) @ rng.standard_normal((k_in, k_in))  # correlated inputs
    m = rng.standard_normal((n_out, k_in))
    codebook, _, scales = cluster_weight(m, 8, channel_scale=True)
    s = scales.ravel()
    plain = nearest(codebook.astype(np.float64), m / s[:, None])
    data_aware = gptq_assign(m, x.T @ x / rows, codebook, s)

    def output_error(labels):
        return np.linalg.norm(x @ (m - s[:, None] * codebook[labels]).T) / np.linalg.norm(x @ m.T)

    assert output_error(data_aware) < 0.8 * output_error(plain)


def test_calibration_data_switches_to_gptq(rng):
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 48])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mixing = rng.standard_normal((64, 64)).astype(np.float32)
    calib = [{"x": rng.standard_normal((32, 64)).astype(np.float32) @ mixing} for _ in range(8)]
    cosines = {}
    for data in ("false", "true"):
        _, report = run_pipeline(model, parse_pass_list(f"cluster(k=8,target=0,data={data})"),
                                 CalibrationFeed(input_specs(model), calib), verify_samples=8)
        entry = report.passes[0]
        assert entry.metrics["weights_assigned_by_gptq"] == (1 if data == "true" else 0)
        cosines[data] = entry.verification["outputs"]["y"]["cosine"]
    assert 1 - cosines["true"] < 0.8 * (1 - cosines["false"])


def gemm_or_matmul(op: str, weight: np.ndarray) -> onnx.ModelProto:
    """``y = x · W`` by MatMul, Gemm(transB=0) or Gemm(transB=1) (``weight`` stored transposed)."""
    stored = weight.T if op == "gemm-transB" else weight
    attrs = {"transB": 1} if op == "gemm-transB" else {}
    node = helper.make_node("MatMul" if op == "matmul" else "Gemm", ["x", "w"], ["y"], **attrs)
    k, n = weight.shape
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [k, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, n])],
        [numpy_helper.from_array(stored.astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("op", ["matmul", "gemm", "gemm-transB"])
def test_per_channel_codebooks_follow_the_output_channel(op, rng):
    """Every output channel (column of ``x · W``) has its own 4 values, 32 in all: per channel
    with k = 4 is exact only if the codebooks run along the output channel."""
    weight = np.stack([rng.choice(rng.standard_normal(4) * 10.0 ** rng.uniform(-2, 1), 96) for _ in range(8)], axis=1)
    out, entry = run_cluster(gemm_or_matmul(op, weight), "cluster(k=4,per_channel=true,target=0,min_size=64)")
    assert sum(entry.rewrites.values()) == 1
    assert np.array_equal(decoded(out, 96), weight.astype(np.float32))


def test_target_gives_the_sensitive_layer_more_centroids(rng):
    """Two layers at k = 4: ``w1`` has 4 distinct values (exact at k = 4), ``w2`` is Gaussian
    (cosine ≈ 0.95 at k = 4). With target 0.999 only ``w2`` moves to k_high = 64."""
    w1 = rng.choice(rng.standard_normal(4), (64, 64)).astype(np.float32)
    w2 = rng.standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    _, free = run_cluster(model, "cluster(k=4,target=0,channel_scale=false)")
    assert free.verification["outputs"]["y"]["cosine"] < 0.99
    out, held = run_cluster(model, "cluster(k=4,k_high=64,target=0.999,channel_scale=false)")
    assert held.metrics["weights_k4"] == 1 and held.metrics["weights_k64"] == 1
    assert held.metrics["target_cosine_measured"] >= 0.999
    assert held.verification["outputs"]["y"]["cosine"] >= 0.999  # verified on a subset of the target's samples
    assert any(note.startswith("MatMul (64, 64): k=64") for note in held.notes)
    stored = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert sorted(v.size for v in stored.values() if v.dtype == np.uint8 and v.size > 1) == [2048, 4096]  # 4-bit w1, uint8 w2
    assert held.metrics["bytes_after"] < 0.5 * held.metrics["bytes_before"]
    out, floats = run_cluster(model, "cluster(k=4,k_high=4,target=0.999,channel_scale=false)")
    assert floats.rewrites == {"MatMul weight → codebook + 4-bit indices": 1}
    assert floats.skipped["kept float to hold the output target"] == 1
    assert np.array_equal(next(numpy_helper.to_array(t) for t in out.graph.initializer if t.name == "w2"), w2)


@pytest.mark.parametrize("grid,per_channel", [("tensor", False), ("channel", True)])
def test_dense_codebook_on_the_int8_grid_quantizes_exactly(grid, per_channel, rng):
    """``cluster(encode=dense, grid=…)`` then int8's own weight quantizer: zero added error."""
    from onnxslim_kit.passes._quant.qdq import quantize_weight, weight_scales

    weight = rng.standard_normal((64, 48)).astype(np.float32) * np.logspace(-2, 0, 48, dtype=np.float32)
    out, entry = run_cluster(identity_matmul(weight), f"cluster(k=16,target=0,encode=dense,grid={grid},"
                                                      f"channel_scale=false,per_channel={str(per_channel).lower()})")
    assert entry.rewrites == {"MatMul weight → clustered float (k=16, dense)": 1}
    dense = numpy_helper.to_array(out.graph.initializer[0])
    assert [n.op_type for n in out.graph.node] == ["MatMul"]
    axis = 1 if per_channel else None
    groups = dense.T if per_channel else dense.reshape(1, -1)
    assert max(len(np.unique(g)) for g in groups) <= 16
    scales = weight_scales(dense, axis)
    q = quantize_weight(dense, scales, axis).astype(np.float32)
    dequantized = q * (scales[None, :] if per_channel else scales)
    assert np.array_equal(dequantized, dense)
    assert compare(dense, weight).cosine > 0.99


def test_dense_then_int8_quantizes_the_clustered_weight(rng):
    """The int8 pass sees the dense clustered weight as a constant and stores it on the same
    grid: its dequantized weight is the clustered one, bit for bit (SmoothQuant off: it would
    rescale the weight's rows first)."""
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    model = identity_matmul(weight)
    cluster = "cluster(k=16,target=0,encode=dense,grid=tensor,channel_scale=false)"
    clustered, _ = run_cluster(model, cluster)
    int8 = "int8(per_channel=false,smooth=0,target=none"
    int8 += ",speed_check=false)" if "speed_check" in available_passes()["int8"].options else ")"
    out, report = run_pipeline(model, parse_pass_list(f"{cluster},{int8}"),
                               CalibrationFeed(input_specs(model)))
    assert report.passes[1].modified
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    (dq,) = [n for n in out.graph.node if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None
             and inits[n.input[0]].shape == weight.shape]  # the weight's (uint8, zero point 128: passes/_quant/qdq.py)
    ints, scale, zero = inits[dq.input[0]], inits[dq.input[1]], inits[dq.input[2]]
    assert len(np.unique(ints)) <= 16
    values = (ints.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale
    assert np.array_equal(values, numpy_helper.to_array(clustered.graph.initializer[0]))


def parallel_convs(channels: list, opset: int, rng) -> onnx.ModelProto:
    """Convs with weights ``[c, 9, 3, 3]`` (one stacking layout) on one input, outputs
    concatenated; output channels scaled 0.01…10 apart, as after BatchNorm folding."""
    nodes, inits = [], []
    for i, c in enumerate(channels):
        weight = rng.standard_normal((c, 9, 3, 3)) * np.logspace(-2, 1, c)[:, None, None, None]
        inits.append(numpy_helper.from_array(weight.astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", ["x", f"w{i}"], [f"y{i}"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(len(channels))], ["y"], axis=1))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 9, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, sum(channels), 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def ort_folded(model: onnx.ModelProto, tmp_path) -> tuple:
    """The model as ONNX Runtime holds it after constant folding (basic optimisations), and
    its initializers."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "folded.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    folded = onnx.load(so.optimized_model_filepath)
    return folded, {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}


def folded_weights(model: onnx.ModelProto, tmp_path) -> dict:
    """Conv weights as ONNX Runtime holds them after constant folding."""
    folded, inits = ort_folded(model, tmp_path)
    assert [n.op_type for n in folded.graph.node if n.op_type != "Conv"] == ["Concat"]  # decoder folded
    return {n.output[0]: inits[n.input[1]] for n in folded.graph.node if n.op_type == "Conv"}


@pytest.mark.parametrize("opset", [11, 13])
def test_one_layout_shares_a_codebook_and_a_decoder(opset, tmp_path, rng):
    """Three weights of one layout: one codebook, one Reshape/Gather/Mul/Split; their 49·81 labels
    (odd: one pad label) in one packed stream; float16 row scales. ORT folds it all back."""
    channels = [16, 24, 9]
    model = parallel_convs(channels, opset, rng)
    out, entry = run_cluster(model, "cluster(k=16,target=0)")
    assert entry.rewrites == {"Conv weight → codebook + 4-bit indices": 3}
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("GatherElements") == 1 and ops.count("Split") == 2  # stream (with its pad) and group
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    (labels,) = [v for v in inits.values() if v.dtype == np.uint8 and v.size > 1]  # (16 and 4 unpack them)
    assert labels.size == (sum(channels) * 81 + 1) // 2
    assert sorted(v.size for v in inits.values() if v.dtype == np.float16) == [sum(channels)]  # the scales
    weights = folded_weights(out, tmp_path)
    originals = {f"y{i}": numpy_helper.to_array(model.graph.initializer[i]) for i in range(len(channels))}
    values = set()
    for name, weight in weights.items():
        rms = np.sqrt(np.mean(originals[name].astype(np.float64) ** 2, axis=(1, 2, 3)))
        scales = rms.astype(np.float16).astype(np.float32)[:, None, None, None]
        values |= set(np.unique(weight / scales).round(5))
        assert compare(weight, originals[name]).cosine > 0.99
    assert len(values) <= 16  # one shared codebook of normalised values
    x = rng.standard_normal((1, 9, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], run_ort(model, {"x": x})[0],
                               atol=0.15 * np.abs(run_ort(model, {"x": x})[0]).max())


def test_byte_estimates_follow_the_file(rng):
    """The encoder's byte estimates (used to decide what pays) against the serialized file."""
    from onnxslim_kit.passes.cluster import stream
    from onnxslim_kit.passes.cluster.maths.encode import Clustered

    channels = [16, 24, 9]
    model = parallel_convs(channels, 13, rng)
    _, entry = run_cluster(model, "cluster(k=16,target=0)")
    floats = sum(stream.float_bytes(numpy_helper.to_array(t)) for t in model.graph.initializer)
    added = entry.metrics["bytes_after"] - (entry.metrics["bytes_before"] - floats)
    members = [Clustered(np.zeros(16, np.float32), np.zeros((c, 9, 3, 3), np.int64),
                         np.full((c, 1, 1, 1), 0.5, np.float32), False, 0) for c in channels]
    half = stream.half_scales(members)
    estimate = (stream.stream_bytes([members]) + stream.group_bytes(members, half)
                + sum(stream.member_bytes(m, half) for m in members))
    assert half and abs(added - estimate) < 0.05 * added, (added, estimate)


@pytest.mark.parametrize("columns,codebooks", [(500, 1), (520, 2)])
def test_large_weights_keep_their_own_codebook(columns, codebooks, rng):
    """Two MatMul weights of one layout (64 rows): shared below 32768 elements (64 × 500),
    each its own codebook from there on (64 × 520)."""
    from onnxslim_kit.passes.cluster.maths.share import SHARE_BELOW

    assert (64 * columns >= SHARE_BELOW) == (codebooks == 2)
    w1 = rng.standard_normal((64, columns)).astype(np.float32)
    w2 = rng.standard_normal((64, 96)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["y1"]), helper.make_node("MatMul", ["x", "w2"], ["y2"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [4, columns]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4, 96])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out, entry = run_cluster(model, "cluster(k=16,target=0)")
    assert entry.rewrites == {"MatMul weight → codebook + 4-bit indices": 2}
    assert [n.op_type for n in out.graph.node].count("GatherElements") == codebooks
    assert min(o["cosine"] for o in entry.verification["outputs"].values()) > 0.99


def test_target_reaches_weights_inside_if_branches(rng):
    """The sensitive weight sits in an If branch: the target still measures it (the trial
    session feeds it from the main graph) and gives it k_high."""
    w1 = rng.choice(rng.standard_normal(4), (64, 64)).astype(np.float32)  # exact at k = 4
    w2 = rng.standard_normal((64, 64)).astype(np.float32)

    def branch(name, weight):
        return helper.make_graph([helper.make_node("MatMul", ["h", name], [f"{name}_y"])], f"{name}_body", [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [16, 64])],
                                 [numpy_helper.from_array(weight, name)])

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("If", ["c"], ["y"], then_branch=branch("w2", w2), else_branch=branch("w3", w2 * 0.5))],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])], [numpy_helper.from_array(w1, "w1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feed = CalibrationFeed(input_specs(model), [{"x": rng.standard_normal((16, 64)).astype(np.float32),
                                                  "c": np.array(True)} for _ in range(4)])
    _, report = run_pipeline(model, parse_pass_list("cluster(k=4,k_high=64,target=0.999,channel_scale=false)"), feed)
    entry = report.passes[0]
    assert entry.metrics["target_cosine_measured"] >= 0.999
    assert entry.metrics["weights_k4"] == 2 and entry.metrics["weights_k64"] == 1  # w1 exact; w2 (taken) k_high
    assert entry.verification["outputs"]["y"]["cosine"] >= 0.999


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_weights_few_distinct_values_exact(op, tmp_path, rng):
    """W and R of an LSTM / GRU are clustered like other weights (exact limit: bit for bit)."""
    gates, hidden, width = (4 if op == "LSTM" else 3), 16, 8
    values = rng.standard_normal(12).astype(np.float32)
    w = rng.choice(values, (1, gates * hidden, width))
    r = rng.choice(values, (1, gates * hidden, hidden))
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w", "r"], ["", "y"], hidden_size=hidden)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, hidden])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out, entry = run_cluster(model, "cluster(k=16,target=0)")
    assert entry.rewrites == {f"{op} weight → codebook + 4-bit indices": 2}
    folded, inits = ort_folded(out, tmp_path)
    (node,) = folded.graph.node
    assert np.array_equal(inits[node.input[1]], w) and np.array_equal(inits[node.input[2]], r)


def two_matmuls(rng) -> onnx.ModelProto:
    """y = (x · A) · B with named nodes ``first`` and ``second`` (A, B large enough to pay)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "a"], ["h"], name="first"),
         helper.make_node("MatMul", ["h", "b"], ["y"], name="second")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "a"),
         numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("how", ["option", "global"])
def test_excluded_node_keeps_its_float_weight(how, rng):
    model = two_matmuls(rng)
    feed = CalibrationFeed(input_specs(model))
    if how == "option":
        out, report = run_pipeline(model, parse_pass_list("cluster(target=0,exclude=re:^sec)"), feed)
    else:
        out, report = run_pipeline(model, parse_pass_list("cluster(target=0)"), feed, exclude="second")
    entry = report.passes[0]
    assert entry.skipped["excluded (--exclude)" if how == "global" else "excluded (exclude=)"] == 1
    assert entry.rewrites == {"MatMul weight → codebook + 4-bit indices": 1}
    assert model.graph.initializer[1].name == "b"
    assert_left_float(model, out, "second", ["h", "b"], "b", gone="a")


@pytest.mark.parametrize("spec, reason", [
    ("cluster(target=0,exclude=last:MatMul:1)", "excluded (exclude=)"),
    ("svd(rank=2,measure=false,force=true,exclude=last:MatMul:1)", "excluded (exclude=)"),
    ("int4(block_size=32,skip_last=false,exclude=last:MatMul:1)", "kept float (skip_last/exclude)")])
def test_exclude_selects_unnamed_nodes_without_renaming_them(spec, reason, rng):
    """Selectors pick nodes by identity: an unnamed node is excluded and no node gets a name."""
    model = two_matmuls(rng)
    for node in model.graph.node:
        node.name = ""
    out, entry = run_cluster(model, spec)
    assert entry.skipped[reason] == 1 and entry.modified
    kept = [n for n in out.graph.node if list(n.input) == ["h", "b"]]
    assert len(kept) == 1 and kept[0].op_type == "MatMul" and kept[0].name == ""


def test_exclude_matching_nothing_is_a_user_error(rng):
    from onnxslim_kit.errors import UserError

    model = two_matmuls(rng)
    with pytest.raises(UserError, match=r"cluster\(exclude=\.\.\.\): 'op:Conv' matches no node; closest op types: MatMul"):
        run_cluster(model, "cluster(exclude=op:Conv)")
    with pytest.raises(UserError, match=r"cluster\(exclude=\.\.\.\): cannot read 'last:MatMul'"):
        run_cluster(model, "cluster(exclude=last:MatMul)")
