"""``prune``'s channel covariance: the low-rank form (few positions) gives the dense diagonals."""

import numpy as np
import pytest
from onnxslim_kit.passes.prune.covariance import Covariance


def _both(rng, channels, parts):
    """The same positions summed by a low-rank and by a forced-dense Covariance."""
    subs = [rng.standard_normal((channels, m)).astype(np.float32) for m in parts]
    low, dense = Covariance(channels), Covariance(1)  # channels=1: never low-rank
    for sub in subs:
        low.add(sub)
        dense.add(sub)
    return low.done(), dense.done(), np.concatenate(subs, axis=1).astype(np.float64)


def test_few_positions_keep_rows_many_go_dense(rng):
    low, dense, x = _both(rng, 40, [5, 6])
    assert low.dense is None and low.rows.shape == (40, 11)
    assert dense.rows is None
    many, _, _ = _both(rng, 40, [15, 15])  # 30 ≥ 40 / 2: switched to the dense sum
    assert many.rows is None and many.dense.shape == (40, 40)
    np.testing.assert_allclose(dense.dense, x @ x.T / 11, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("damp", [1e-2, 1.0])
def test_low_rank_diagonals_equal_the_dense_ones(rng, damp):
    low, dense, _ = _both(rng, 48, [4, 7])
    np.testing.assert_allclose(low.diagonal(), dense.diagonal(), rtol=1e-5)
    np.testing.assert_allclose(low.inverse_diagonal(damp), dense.inverse_diagonal(damp), rtol=1e-4)
    w_bar = rng.standard_normal((9, 48))
    np.testing.assert_allclose(low.product_diagonal(w_bar), dense.product_diagonal(w_bar), rtol=1e-4, atol=1e-6)
