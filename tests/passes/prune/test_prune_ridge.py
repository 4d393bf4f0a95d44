"""The re-fit's ridge: the dual form (fewer rows than unknowns) is the primal's solution."""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes.prune import ridge as ridge_mod
from onnxslim_kit.passes.prune.ridge import ALPHAS, fit_held_out, ridge


def _problem(rows: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal((rows, d)), np.ones((rows, 1))], axis=1)
    w_true = rng.standard_normal((d + 1, 5))
    w0 = w_true + 0.3 * rng.standard_normal(w_true.shape)
    return x, x @ w_true + 0.01 * rng.standard_normal((rows, 5)), w0


def _primal(x, y, w0, d, alpha):
    lam = alpha * float(np.trace(x[:, :d].T @ x[:, :d])) / d + 1e-12
    return np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y + lam * w0)


def test_dual_solution_is_the_primal_one():
    x, y, w0 = _problem(rows=24, d=90)  # 24 rows, 91 unknowns per output: the dual form
    for alpha in (1e-4, 1e-1, 10.0):
        np.testing.assert_allclose(ridge(x, y, w0, 90, alpha), _primal(x, y, w0, 90, alpha), rtol=1e-7, atol=1e-9)


def test_dual_held_out_errors_are_the_primal_ones():
    x, y, w0 = _problem(rows=40, d=70)
    held = np.arange(40) % 2 == 1
    xt, yt, xv, yv = x[~held], y[~held], x[held], y[held]
    dual = ridge_mod._dual_errors(xt, yt, xv, w0, yv - xv @ w0)
    primal = ridge_mod._primal_errors(xt, yt, xv, yv, w0)
    for lam in (1e-3, 1.0, 50.0):
        assert np.isclose(dual(lam), primal(lam), rtol=1e-7)
    alpha, after, before, solved = fit_held_out(x, y, w0, held, 70)
    assert alpha in ALPHAS and after < before
    best = min(ALPHAS, key=lambda a: float(np.sum((xv @ _primal(xt, yt, w0, 70, a) - yv) ** 2)))
    assert alpha == best
    np.testing.assert_allclose(solved, _primal(x, y, w0, 70, alpha), rtol=1e-7, atol=1e-9)


def test_primal_used_with_more_rows_than_unknowns():
    x, y, w0 = _problem(rows=120, d=10)
    np.testing.assert_allclose(ridge(x, y, w0, 10, 1e-2), _primal(x, y, w0, 10, 1e-2), rtol=1e-9, atol=1e-11)
