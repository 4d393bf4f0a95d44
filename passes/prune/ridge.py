"""The re-fit's ridge regression toward the pruned weights, in its primal or its dual form.

With ``X`` [m, n] the input rows (a column of ones last for a bias), ``Y`` [m, C] the teacher's
rows, ``W₀`` [n, C] the pruned weights and ``d`` the number of feature columns (``n`` less the
bias column)::

    W(α) = argmin ‖X W − Y‖² + λ‖W − W₀‖²,   λ = α · Σ_{rows, first d columns} X² / d

**Primal** (``m ≥ n``): ``W = (XᵀX + λI)⁻¹ (XᵀY + λW₀)``, n × n matrices. **Dual** (``m < n``, the
usual case of a wide layer fitted on few calibration rows: a 6144-wide MLP projection on
4 × 32 rows): by the push-through identity ``(XᵀX + λI)⁻¹Xᵀ = Xᵀ(XXᵀ + λI)⁻¹``,

    W = W₀ + Xᵀ (XXᵀ + λI)⁻¹ (Y − X W₀)

— the same solution (exactly, up to rounding), from m × m matrices: at n ≈ 4600 and m = 128 the
primal forms seven 170 MB matrices and an ``eigh`` of minutes, the dual 130 KB ones and
milliseconds. Neither builds an identity matrix or an inverse: λ is added to the diagonal in place.

α is chosen on held-out rows (:func:`fit_held_out`): the fit rows ``Xₜ`` give one
eigendecomposition for every α of ``ALPHAS`` — primal ``XₜᵀXₜ = V S Vᵀ``,
``W(α) = V diag(1/(s+λ)) Vᵀ(XₜᵀYₜ + λW₀)``; dual ``XₜXₜᵀ = U S Uᵀ``, the held-out prediction
``Xᵥ W(α) = Xᵥ W₀ + (XᵥXₜᵀ) U diag(1/(s+λ)) Uᵀ (Yₜ − Xₜ W₀)`` (no n × C matrix per α) — the
held-out rows score each, and the best α is solved again on all rows. None when no α beats W₀.
"""

from __future__ import annotations

import numpy as np

ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


def _scale(x: np.ndarray, d: int) -> float:
    """λ / α: the trace of the Gram matrix's first ``d`` diagonal entries over ``d``."""
    return float(np.einsum("ij,ij->", x[:, :d], x[:, :d])) / max(d, 1)


def _plus_diagonal(matrix: np.ndarray, lam: float) -> np.ndarray:
    matrix[np.diag_indices_from(matrix)] += lam
    return matrix


def solve(x: np.ndarray, y: np.ndarray, w0: np.ndarray, lam: float) -> np.ndarray:
    """``W(λ)`` on all rows, in the dual form when there are fewer rows than unknowns."""
    if len(x) < x.shape[1]:
        residual = y - x @ w0
        return w0 + x.T @ np.linalg.solve(_plus_diagonal(x @ x.T, lam), residual)
    return np.linalg.solve(_plus_diagonal(x.T @ x, lam), x.T @ y + lam * w0)


def ridge(x: np.ndarray, y: np.ndarray, w0: np.ndarray, d: int, alpha: float) -> np.ndarray:
    """``W(α)`` on all rows."""
    return solve(x, y, w0, alpha * _scale(x, d) + 1e-12)


def ridge_held_out(x, y, w0, held_out: np.ndarray, d: int) -> tuple:
    """(best α, held-out error of W(α), held-out error of W₀) — fit on ``~held_out`` rows."""
    return fit_held_out(x, y, w0, held_out, d)[:3]


def fit_held_out(x, y, w0, held_out: np.ndarray, d: int) -> tuple:
    """(best α, its held-out error, W₀'s held-out error, the solution for the best α on all rows
    or None when no α beats W₀)."""
    xt, yt, xv, yv = x[~held_out], y[~held_out], x[held_out], y[held_out]
    miss = yv - xv @ w0  # held-out residual of W₀
    base = float(np.sum(miss ** 2))
    errors = _dual_errors(xt, yt, xv, w0, miss) if len(xt) < x.shape[1] else _primal_errors(xt, yt, xv, yv, w0)
    best = (None, np.inf)
    scale = _scale(xt, d)
    for alpha in ALPHAS:
        err = errors(alpha * scale + 1e-12)
        if err < best[1]:
            best = (alpha, err)
    if best[0] is None or not best[1] < base:
        return best[0], best[1], base, None
    return best[0], best[1], base, ridge(x, y, w0, d, best[0])


def _primal_errors(xt, yt, xv, yv, w0):
    """λ → the held-out error ``‖Xᵥ W(λ) − Yᵥ‖²``, from one ``eigh(XₜᵀXₜ)``."""
    s, v = np.linalg.eigh(xt.T @ xt)
    p, q = v.T @ (xt.T @ yt), v.T @ w0
    s = np.maximum(s, 0)
    return lambda lam: float(np.sum((xv @ (v @ ((p + lam * q) / (s + lam)[:, None])) - yv) ** 2))


def _dual_errors(xt, yt, xv, w0, miss):
    """The same from one ``eigh(XₜXₜᵀ)`` (module docstring); ``miss = Yᵥ − Xᵥ W₀``."""
    s, u = np.linalg.eigh(xt @ xt.T)
    p = u.T @ (yt - xt @ w0)
    cross = (xv @ xt.T) @ u
    s = np.maximum(s, 0)
    return lambda lam: float(np.sum((cross @ (p / (s + lam)[:, None]) - miss) ** 2))
