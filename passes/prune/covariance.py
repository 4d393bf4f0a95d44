"""The channel covariance ``Σ = X Xᵀ / m`` of a consumer's input, dense or kept as its rows.

``X`` (``C × m``): the input's channels at the ``m`` positions :func:`.importance.activation_stats`
samples. Dense, ``Σ`` takes ``8 C²`` bytes — 302 MB for one 6144-wide MLP input, and a decoder
has one per layer (24 at 2.75 GB: 7 GB). With fewer positions than ``C / 2`` (a decoder fed a
few short sequences: 4 × 32 tokens) ``Σ`` has rank ``≤ m`` and :class:`Covariance` keeps the
``m`` columns instead (``4 C m`` bytes, float32), switching to the dense sum as soon as more
arrive. The importance criteria need only diagonals, and both have a low-rank form:

* ``obs``: ``diag((Σ + λI)⁻¹)``; Woodbury with ``Y = X / √m``:
  ``(λI + Y Yᵀ)⁻¹ = (I − Y (λ I_m + Yᵀ Y)⁻¹ Yᵀ) / λ``, so
  ``[·]_cc = (1 − Σ_j (Y M⁻¹)_cj Y_cj) / λ`` with ``M = λ I_m + YᵀY`` (``m × m``);
* ``taylor``: ``diag(Σ A)`` with ``A = W̄ᵀ W̄`` (``W̄``: consumer weights ``C_out × C``):
  ``(Σ A)_cc = Σ_j X_cj (Xᵀ W̄ᵀ W̄)_jc / m`` — ``B = W̄ X`` (``C_out × m``), then ``Bᵀ W̄``; no ``C × C``
  matrix is formed.

The dense path is the earlier code's arithmetic exactly (float32 products per sample, float64
sums); the low-rank one equals it up to float64 rounding.
"""

from __future__ import annotations

import numpy as np


class Covariance:
    """``Σ`` summed sample by sample (:meth:`add`); ``dense`` or ``rows`` once :meth:`done`."""

    def __init__(self, channels: int):
        self.channels = channels
        self.count = 0
        self.dense: np.ndarray | None = None  # Σ X Xᵀ (float64), not yet divided by m
        self._parts: list = []  # float32 [C, m_i] while Σ m_i < C / 2
        self.rows: np.ndarray | None = None  # X (float64, C × m) after done() on the low-rank path

    def add(self, sub: np.ndarray) -> None:
        self.count += sub.shape[1]
        if self.dense is None and 2 * self.count < self.channels:
            self._parts.append(np.array(sub, np.float32))
            return
        if self.dense is None:  # too many positions: the dense sum, in the order they came
            self.dense = 0.0
            for part in self._parts:
                self.dense = self.dense + (part @ part.T).astype(np.float64)
            self._parts = []
        self.dense = self.dense + (sub @ sub.T).astype(np.float64)

    def done(self) -> "Covariance":
        """Divide by ``m``; the low-rank rows as one float64 array."""
        m = max(self.count, 1)
        if self.dense is not None:
            self.dense = self.dense / m
        else:
            parts = self._parts or [np.zeros((self.channels, 0), np.float32)]
            self.rows = np.concatenate(parts, axis=1).astype(np.float64) / np.sqrt(m)
            self._parts = []
        return self

    def diagonal(self) -> np.ndarray:
        return np.diag(self.dense) if self.dense is not None else np.einsum("cj,cj->c", self.rows, self.rows)

    def inverse_diagonal(self, damp: float) -> np.ndarray:
        """``diag((Σ + damp·I)⁻¹)``."""
        if self.dense is not None:
            return np.diag(np.linalg.inv(self.dense + damp * np.eye(len(self.dense))))
        y = self.rows
        m = np.eye(y.shape[1]) * damp + y.T @ y
        return (1.0 - np.einsum("cj,cj->c", np.linalg.solve(m, y.T).T, y)) / damp

    def product_diagonal(self, w_bar: np.ndarray) -> np.ndarray:
        """``diag(Σ · W̄ᵀ W̄)`` for consumer weights ``W̄`` (``C_out × C``)."""
        if self.dense is not None:
            return np.einsum("cl,lc->c", self.dense, w_bar.T @ w_bar)
        y = self.rows
        return np.einsum("cj,jc->c", y, (w_bar @ y).T @ w_bar)
