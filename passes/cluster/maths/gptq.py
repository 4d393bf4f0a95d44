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
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import get_lapack_funcs

from onnxslim_kit.passes.cluster.maths.kmeans import nearest
from onnxslim_kit.passes.cluster.maths.rows import zero_labels

DAMPING = 0.01
BLOCK = 128  # columns whose updates of the later columns are applied together (lazy batch updates)


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
    diagonal = np.diag(h).copy()
    dead = diagonal <= 0
    diagonal[dead] = 1.0
    diagonal += DAMPING * float(np.mean(diagonal))
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
    for i in range(width):
        start, end = i - i % BLOCK, min(i - i % BLOCK + BLOCK, width)
        column = wt[i] - upper[start:i, i] @ errors[:i - start] if i > start else wt[i]  # the block's updates so far
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
        err = errors[i - start] = (column - q) / upper[i, i]
        if i == end - 1 and end < width:  # the block's updates of every later column: one GEMM
            wt[end:] -= upper[start:end, end:].T @ errors[:end - start]
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
