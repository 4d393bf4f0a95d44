"""Data-aware codebook assignment: GPTQ (Frantar et al., 2022) with a k-means codebook.

A layer computes ``Y = X Mᵀ`` with ``M`` = ``n_out × k_in`` (a Conv's weight as
``[n, C·kh·kw]`` over im2col rows, a MatMul weight transposed). Rounding each weight to its
nearest centroid minimises ``‖M − M'‖``; what matters is the output error
``‖X (M − M')ᵀ‖² = Σ_rows (m − m') H (m − m')ᵀ`` with ``H = XᵀX / rows``. GPTQ assigns the
columns in order and, after column ``i``, spreads its rounding error over the columns not yet
assigned so that the output error they can still cancel is cancelled:

```
H ← H + λ I   (λ = 0.01 · mean diag H);   U = chol(H⁻¹)ᵀ  (upper)
for i = 0 … k_in − 1:
    q_i   = s ⊙ codebook[nearest(M[:, i] / s)]          (s: per-row scales, 1 without them)
    e     = (M[:, i] − q_i) / U[i, i]
    M[:, i+1:] −= e ⊗ U[i, i+1:]
```

The codebook and scales are fixed beforehand (weighted k-means of the normalised rows,
shared by the weights of one layout: :mod:`onnxslim_kit.passes.cluster.maths.share`; or one codebook per row,
:mod:`onnxslim_kit.passes.cluster.maths.rows`, then ``q_i[r] = books[r, nearest(books[r], M[r, i])]``); only the
assignment changes. Positions that were exactly zero stay
zero (``keep_zero``: a pruned weight stays pruned; their error is still compensated).

Lazy batch updates (GPTQ §3, "Step 2"): the update of column ``j`` is the sum over ``i < j``
of ``e_i U[i, j]``, and column ``j`` is read only when its turn comes; so a column takes the
updates of the earlier columns of its block of ``BLOCK`` when its turn comes (one
matrix-vector product, ``M[:, j] − E[:, :j'] U[block start:j, j]``), and the block's updates of
every later column are applied at once at its end, ``M[:, end:] −= E U[block, end:]`` (one GEMM,
``E``: the block's scaled errors). The same sums in another order (equal up to float64
rounding); the plain loop rewrote ``n_out × (k_in − i)`` values per column, ``n_out k_in² / 2``
memory writes per layer (a 1024 × 4096 layer: 8.6e9, minutes at memory speed). The sweep works
on ``Mᵀ`` (``k_in × n_out``, C order), so that a column is one contiguous row.

Low rank (:func:`lowrank_factor`; a layer whose statistics are ``R`` held rows ``X`` with
``LOWRANK_RATIO · R ≤ k_in``: issue 16's decoder, 128 rows against widths 1536 and 6144). The
damped ``H = VᵀV + D`` (``V = X / √rows``, ``D`` diagonal: ``λ``, ``1 + λ`` on dead inputs) is
diagonal plus rank ``R``, and so is ``H⁻¹ = D⁻¹ − G Gᵀ`` (Woodbury: ``C = I + V D⁻¹ Vᵀ = K Kᵀ``,
``G = D⁻¹ Vᵀ K⁻ᵀ``, ``k_in × R``). The upper Cholesky factor of such a matrix is semiseparable
(``H⁻¹ = UᵀU``; ``g_j``, ``w_i`` rows of ``G``, ``W``):

```
U[i, i] = d_i,   U[i, j] = w_iᵀ g_j  (i < j)        Q₀ = I (R × R)
for i = 0 … k_in − 1:   d_i² = 1 / D_i − g_iᵀ Q_i g_i,   w_i = −Q_i g_i / d_i,   Q_{i+1} = Q_i + w_i w_iᵀ
```

(``U[i, j] d_i = (H⁻¹)_{ij} − Σ_{m<i} U[m, i] U[m, j] = −g_iᵀ (I + Σ_{m<i} w_m w_mᵀ) g_j``.) The
sweep then needs no ``k_in × k_in`` array: the updates of a block's columns by every earlier
block are ``G[block] Aᵀ`` with ``Aᵀ = Σ_{earlier m} w_m e_mᵀ`` (``R × n_out``, grown by one GEMM
per block), and a block's own ``U`` entries are ``W[block] G[block]ᵀ``. For a 6144-wide layer
seen on 128 rows: ``O(k R²)`` for the factor instead of ``k³`` (and 12 MB instead of 302 MB),
``4 R n_out`` flops a column for the updates instead of ``k n_out``. The same assignment up to
float64 rounding (``H⁻¹``'s small eigenvalues, those of the data directions, come from a
difference; the damping bounds ``H``'s condition number by about ``k / 0.01``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import get_lapack_funcs, solve_triangular

from onnxslim_kit.passes.cluster.maths.kmeans import nearest
from onnxslim_kit.passes.cluster.maths.rows import zero_labels

DAMPING = 0.01
BLOCK = 128  # columns whose updates of the later columns are applied together (lazy batch updates)
LOWRANK_RATIO = 4  # held rows R with LOWRANK_RATIO · R ≤ k_in: the factor in generator form


def _damping(diagonal: np.ndarray) -> tuple:
    """``(dead inputs, the damped diagonal of H)``: a dead input (``H[i, i] ≤ 0``) gets 1, then
    every one ``λ = DAMPING · mean``."""
    diagonal = np.array(diagonal, np.float64)
    dead = diagonal <= 0
    diagonal[dead] = 1.0
    return dead, diagonal + DAMPING * float(np.mean(diagonal))


def gptq_factor(gram: np.ndarray, overwrite: bool = False) -> tuple:
    """``(dead input channels, U)``: the damped ``H``'s ``U = chol(H⁻¹)ᵀ`` (upper), which depends
    on the statistics alone — computed once per layer and shared by its codebook levels;
    ``overwrite``: ``gram`` (C-contiguous float64) is used as the work space.

    Without forming ``H⁻¹`` (one Cholesky and one triangular inverse, float64 LAPACK, in place:
    ``2k³/3`` flops and no ``k × k`` array beside ``H``, instead of the ``3k³`` and three more
    arrays of a Cholesky, a solve against ``I`` and a second Cholesky): with ``J`` the reversal
    permutation, ``chol(J H J) = L̃`` (lower) gives ``H = R Rᵀ`` with ``R = J L̃ J`` upper
    triangular, so ``H⁻¹ = R⁻ᵀ R⁻¹`` and ``U = R⁻¹ = J L̃⁻¹ J`` (the upper Cholesky factor of
    ``H⁻¹`` is unique). ``J H J`` is ``H``'s buffer reversed; being symmetric, its C-order
    buffer is also its Fortran-order one, which LAPACK overwrites; ``U`` is ``L̃⁻¹``'s buffer
    reversed again."""
    h = gram if overwrite and gram.dtype == np.float64 and gram.flags.c_contiguous else np.array(gram, np.float64)
    dead, diagonal = _damping(np.diag(h))
    h[np.diag_indices(len(h))] = diagonal
    _reverse(h.reshape(-1))  # J H J, in place
    potrf, trtri = get_lapack_funcs(("potrf", "trtri"), (h,))
    low, info = potrf(h.T, lower=1, overwrite_a=1, clean=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"Gram matrix not positive definite (potrf info {info})")
    inverse, info = trtri(low, lower=1, overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"Gram factor singular (trtri info {info})")
    buffer = inverse.T.reshape(-1)  # inverse is Fortran-ordered: its buffer in memory order
    _reverse(buffer)  # J L̃⁻¹ J, in place: U in Fortran order (positive strides, for BLAS)
    return dead, buffer.reshape(inverse.shape).T


@dataclass(eq=False)
class LowRank:
    """``U`` in generator form (module docstring): ``U[i, i] = d[i]``, ``U[i, j] = w[i] · g[j]``."""

    d: np.ndarray  # (k,)
    w: np.ndarray  # (k, R)
    g: np.ndarray  # (k, R)


def lowrank_factor(rows: np.ndarray, count: int) -> tuple:
    """``(dead input channels, LowRank)`` of ``H = XᵀX / count`` from the rows ``X`` (``R × k``)
    themselves, damped as :func:`gptq_factor` damps ``H`` (module docstring, "Low rank")."""
    v = np.asarray(rows, np.float64) / np.sqrt(max(count, 1))
    h_diagonal = np.einsum("rk,rk->k", v, v)
    dead, damped = _damping(h_diagonal)
    d_inv = 1.0 / (damped - np.where(dead, 0.0, h_diagonal))  # D⁻¹
    scaled = v * d_inv  # V D⁻¹
    c = scaled @ v.T
    c[np.diag_indices(len(c))] += 1.0
    k_low = np.linalg.cholesky(c)
    g = np.ascontiguousarray(solve_triangular(k_low, scaled, lower=True).T)  # D⁻¹ Vᵀ K⁻ᵀ
    w, d = np.empty_like(g), np.empty(len(g))
    q = np.eye(g.shape[1])
    for i, gi in enumerate(g):
        qg = q @ gi
        d2 = d_inv[i] - gi @ qg
        d[i] = np.sqrt(d2)
        w[i] = qg / -d[i]
        q += np.outer(qg, qg / d2)
    return dead, LowRank(d, w, g)


class _Sweep:
    """The blocks of ``U`` the sweep reads, and the updates of later columns by a block's
    errors: from the dense ``U`` or from :class:`LowRank` generators (module docstring)."""

    def __init__(self, upper, n_out: int):
        self.upper = upper
        self.low = upper if isinstance(upper, LowRank) else None
        self.applied = None if self.low is None else np.zeros((self.low.g.shape[1], n_out))  # Aᵀ

    def block(self, wt: np.ndarray, start: int, end: int) -> np.ndarray:
        """``U[start:end, start:end]`` (strict lower part unspecified); the columns of the block
        take the updates of every earlier block first."""
        if self.low is None:
            return self.upper[start:end, start:end]
        g = self.low.g[start:end]
        wt[start:end] -= g @ self.applied
        inner = self.low.w[start:end] @ g.T
        inner[np.diag_indices(end - start)] = self.low.d[start:end]
        return inner

    def finish(self, wt: np.ndarray, start: int, end: int, errors: np.ndarray) -> None:
        """The block's scaled errors ``errors`` update the later columns (one GEMM)."""
        if self.low is not None:
            self.applied += self.low.w[start:end].T @ errors
        elif end < len(wt):
            wt[end:] -= self.upper[start:end, end:].T @ errors


def _reverse(flat: np.ndarray, chunk: int = 1 << 20) -> None:
    """Reverse ``flat`` in place, ``chunk`` values swapped at a time (no whole copy)."""
    n = flat.size
    for start in range(0, n // 2, chunk):
        stop = min(start + chunk, n // 2)
        head = flat[start:stop].copy()
        flat[start:stop] = flat[n - stop:n - start][::-1]
        flat[n - stop:n - start] = head[::-1]


def gptq_assign(matrix: np.ndarray, gram: np.ndarray, codebook: np.ndarray, scales: np.ndarray,
                zero_mask: np.ndarray | None = None, columns: np.ndarray | None = None,
                factor: tuple | None = None) -> np.ndarray:
    """Labels (``n_out × k_in``) of ``matrix`` into ``scales[:, None] · codebook[labels]``, or,
    for a 2-D ``codebook`` (``scales`` ones), into ``codebook[r, labels[r, ·]]`` (one row of
    centroids per output channel) or, with ``columns``, ``codebook[columns[i], labels[·, i]]``
    (column ``i`` of ``matrix`` reads codebook row ``columns[i]``: one per input channel);
    ``factor``: :func:`gptq_factor` of ``gram`` when already computed (``gram`` is then unused)."""
    dead, upper = gptq_factor(gram) if factor is None else factor
    wt = np.array(np.asarray(matrix, dtype=np.float64).T, order="C")  # k_in × n_out: a column is a row here
    wt[dead] = 0.0
    book = np.asarray(codebook, dtype=np.float64)
    s = np.asarray(scales, dtype=np.float64).ravel()
    rows = np.arange(wt.shape[1])
    zeros = None if zero_mask is None else np.ascontiguousarray(np.asarray(zero_mask).T)
    if book.ndim == 2:  # per row: -1 where the row has no 0.0 centroid
        zero_label = zero_labels(book) if zeros is not None else None
        if columns is not None:  # books per input channel: each column is a tensor-like step
            book, zero_label = book[columns], None if zero_label is None else zero_label[columns]
    else:
        zero_label = int(np.flatnonzero(book == 0)[0]) if zeros is not None and np.any(book == 0) else None
    labels = np.empty(wt.shape, np.uint8 if book.shape[-1] <= 256 else np.int64)
    width = len(wt)
    errors = np.empty((min(BLOCK, width), wt.shape[1]))
    sweep = _Sweep(upper, wt.shape[1])
    for i in range(width):
        start, end = i - i % BLOCK, min(i - i % BLOCK + BLOCK, width)
        if i == start:
            inner = sweep.block(wt, start, end)
        # the block's updates so far
        column = wt[i] - inner[:i - start, i - start] @ errors[:i - start] if i > start else wt[i]
        if book.ndim == 2 and columns is not None:
            lab = np.abs(column[:, None] - book[i][None, :]).argmin(axis=1)
            if zero_label is not None and zero_label[i] >= 0:
                lab[zeros[i]] = zero_label[i]
            q = book[i][lab]
        elif book.ndim == 2:
            lab = np.abs(column[:, None] - book).argmin(axis=1)
            if zero_label is not None:
                fix = zeros[i] & (zero_label >= 0)
                lab[fix] = zero_label[fix]
            q = book[rows, lab]
        else:
            lab = nearest(book, column / s)
            if zero_label is not None:
                lab[zeros[i]] = zero_label
            q = s * book[lab]
        labels[i] = lab
        errors[i - start] = (column - q) / inner[i - start, i - start]
        if i == end - 1:  # the block's updates of every later column: one GEMM
            sweep.finish(wt, start, end, errors[:end - start])
    return labels.T


def cluster_layer(layer, gram: np.ndarray, codebook: np.ndarray, scales: np.ndarray | None,
                  keep_zero: bool, per_input: bool = False, factor: tuple | None = None) -> np.ndarray:
    """Labels, in the layout of the stored weight of ``layer`` (a :class:`._svd_stats.Layer`),
    of ``M = layer.matrixᵀ`` into the given (sorted) ``codebook`` and per-output-channel
    ``scales`` (``(n_out,)``, None for none), or into per-row codebooks (``n_out × k``; with
    ``per_input`` one per input channel, ``C_in × k``), assigned by :func:`gptq_assign`."""
    stored = np.asarray(layer.node.inputs[1].values)
    m = layer.matrix.T  # n_out × k_in
    row_scales = np.ones(len(m)) if scales is None else np.asarray(scales).ravel()
    columns = np.arange(m.shape[1]) // (m.shape[1] // len(codebook)) if per_input else None  # conv: C·kh·kw
    labels = gptq_assign(m, gram, codebook, row_scales, (m == 0) if keep_zero else None, columns, factor)
    if layer.kind == "conv" or (layer.kind == "gemm" and layer.node.attrs.get("transB", 0)):
        return labels.reshape(stored.shape)  # stored rows are the output channels
    return labels.T.copy()
