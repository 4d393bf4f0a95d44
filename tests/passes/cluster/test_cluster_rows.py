"""``cluster``: per-row codebooks (selector step, per_channel), their axis, GPTQ with row
codebooks, float16 codebooks at k_high."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnxslim_kit.passes.cluster.maths.gptq import gptq_assign
from onnxslim_kit.passes.cluster.maths.rows import nearest_rows, row_codebooks
from test_cluster import decoded, run_cluster
from test_cluster import identity_matmul as matmul


def columns_of_their_own(rng, rows: int, columns: int, values: int) -> np.ndarray:
    """Every output channel (column) draws from ``values`` numbers of its own, of its own
    scale and skew: one shared codebook cannot fit them all, one per column is exact."""
    pools = [np.sort(rng.standard_normal(values) ** p) * 10.0 ** rng.uniform(-2, 1)
             for p in rng.choice([1, 2, 3], columns)]
    return np.stack([rng.choice(pool, rows) for pool in pools], axis=1).astype(np.float32)


@pytest.mark.parametrize("opset", [9, 13])
def test_target_takes_row_codebooks_when_they_are_cheaper_than_k_high(opset, rng):
    weight = columns_of_their_own(rng, 512, 16, 16)
    model = matmul(weight, opset)
    _, plain = run_cluster(model, "cluster(k=16,target=0)")
    assert plain.verification["outputs"]["y"]["cosine"] < 0.99999  # the shared codebook misses
    out, entry = run_cluster(model, "cluster(k=16,target=0.99999)")
    assert entry.metrics["weights_rows"] == 1 and entry.metrics["weights_k256"] == 0
    assert entry.rewrites == {"MatMul weight → codebooks per row + 4-bit indices": 1}
    onnx.checker.check_model(out, full_check=True)
    assert np.array_equal(decoded(out, 512), weight)  # every column at its exact limit
    assert entry.metrics["bytes_after"] < 0.2 * entry.metrics["bytes_before"]
    _, off = run_cluster(model, "cluster(k=16,target=0.99999,rows=false)")
    assert off.metrics["weights_k256"] == 1  # without the step, k_high: more bytes
    assert off.metrics["bytes_after"] > entry.metrics["bytes_after"]


def test_row_codebooks_run_along_the_input_channel_of_a_wide_weight(rng):
    """An 8 × 96 MatMul weight (96 output channels): 8 codebooks, one per input channel,
    instead of 96; each input row has 4 values, so k = 4 per row is exact only along it."""
    weight = np.stack([rng.choice(rng.standard_normal(4), 96) for _ in range(8)]).astype(np.float32)
    out, entry = run_cluster(matmul(weight), "cluster(k=4,per_channel=true,target=0)")
    assert sum(entry.rewrites.values()) == 1
    assert np.array_equal(decoded(out, 8), weight)
    books = [numpy_helper.to_array(t) for t in out.graph.initializer if t.name.startswith("cluster/books")]
    assert [b.shape for b in books] == [(8, 4)]


def test_row_codebooks_are_float16_unless_exact(rng):
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    books, labels, exact = row_codebooks(weight, 1, 16, True)
    assert not exact and books.dtype == np.float16 and books.shape == (48, 16)
    values = np.take_along_axis(books.astype(np.float32), labels.T, axis=1).T  # labels in the weight's shape
    rel = np.linalg.norm(values - weight) / np.linalg.norm(weight)
    assert 0.05 < rel < 0.15  # ≈ √(Lloyd–Max MSE of 16 levels) ≈ 0.1, fp16 rounding adds nothing visible
    assert np.array_equal(labels, nearest_rows(books, weight.T, True).T)  # assigned to the rounded centroids


@pytest.mark.parametrize("per_input", [False, True])
def test_gptq_with_row_codebooks_lowers_output_error(per_input, rng):
    rows, k_in, n_out, k = 4000, 128, 32, 4
    x = rng.standard_normal((rows, k_in)) @ rng.standard_normal((k_in, k_in))  # correlated inputs
    m = rng.standard_normal((n_out, k_in)) * rng.uniform(0.1, 3, (n_out, 1))
    axis = 1 if per_input else 0  # codebooks per input column of M, or per output row
    books, plain, _ = row_codebooks(m, axis, k, False)
    columns = np.arange(k_in) if per_input else None
    aware = gptq_assign(m, x.T @ x / rows, books, np.ones(n_out), None, columns)
    book = books.astype(np.float64)

    def output_error(labels):
        q = book[columns][None, :, :] if per_input else book[:, None, :]
        values = np.take_along_axis(np.broadcast_to(q, (n_out, k_in, k)), labels[..., None], axis=2)[..., 0]
        return np.linalg.norm(x @ (m - values).T) / np.linalg.norm(x @ m.T)

    # measured over seeds 0–2: 0.80–0.83 per output row, 0.88–0.89 per input column
    assert output_error(aware) < (0.93 if per_input else 0.86) * output_error(plain)


def test_k_high_codebook_is_stored_as_float16(rng):
    weight = rng.standard_normal((128, 128)).astype(np.float32)
    out, entry = run_cluster(matmul(weight), "cluster(k=256,target=0)")
    books = [numpy_helper.to_array(t) for t in out.graph.initializer if t.name.startswith("cluster/codebook")]
    assert [(b.dtype, b.size) for b in books] == [(np.float16, 256)]
    rel = np.linalg.norm(decoded(out, 128) - weight) / np.linalg.norm(weight)
    assert rel < 0.01
    _, small = run_cluster(matmul(weight), "cluster(k=16,target=0)")
    assert small.metrics["bytes_after"] < entry.metrics["bytes_after"]


@pytest.mark.parametrize("shape", [(256, 64), (64, 256)])
def test_row_byte_estimates_follow_the_file(shape, rng):
    """What the selector and the encoder count for a weight with per-row codebooks (labels,
    float16 books, Reshape / GatherElements / Cast / Reshape / Transpose) against the file."""
    from onnxslim_kit.passes.cluster import stream
    from onnxslim_kit.passes.cluster.maths.encode import Clustered

    weight = rng.standard_normal(shape).astype(np.float32)
    model = matmul(weight)
    _, entry = run_cluster(model, "cluster(k=16,per_channel=true,target=0)")
    added = entry.metrics["bytes_after"] - (entry.metrics["bytes_before"] - stream.float_bytes(weight))
    axis = 1 if shape[1] <= shape[0] else 0  # the axis with fewer slices
    member = Clustered(np.zeros((shape[axis], 16), np.float16), np.zeros(shape, np.int64), None, True, axis,
                       dtype=np.float32)
    estimate = stream.stream_bytes([[member]]) + stream.group_bytes([member], False) + stream.member_bytes(member, False)
    assert abs(added - estimate) < 0.05 * added, (added, estimate)
