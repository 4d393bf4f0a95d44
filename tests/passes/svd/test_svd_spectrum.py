"""``svd``'s kept energy from the Gram eigenvalues, and the SVD deferred until factors are asked for."""

import numpy as np
import pytest
from onnxslim_kit.passes.svd.maths.factor import Factorization, singular_squares


@pytest.mark.parametrize("shape", [(12, 30), (30, 12), (16, 16)])
def test_singular_squares_match_the_svd(rng, shape):
    w = rng.standard_normal(shape) * np.logspace(0, -2, shape[1])
    expected = np.linalg.svd(w, compute_uv=False) ** 2
    found = singular_squares(w)
    assert found.shape == (min(shape),)
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-12 * expected[0])


@pytest.mark.parametrize("whitened", [False, True])
def test_rank_rules_need_no_svd_and_factors_are_exact(rng, whitened):
    k, n = 24, 40
    w = rng.standard_normal((k, n))
    x = rng.standard_normal((200, k))
    args = (x.T @ x / 200, 200, float(np.sum(np.sum(x**2, 1) ** 2))) if whitened else ()
    fact = Factorization(w, *args)
    r, _ = fact.choose_rank(cosine=0.999)
    assert fact.full_rank == k and 1 <= r <= k
    assert fact._svd is None  # the energy came from the Gram eigenvalues alone
    energy = np.cumsum(fact.s**2) / np.sum(fact.s**2)  # the SVD, computed on this first use
    np.testing.assert_allclose(fact.energy, energy, atol=1e-12)
    a, b = fact.factors(k)
    np.testing.assert_allclose(a @ b, w, atol=1e-9)
