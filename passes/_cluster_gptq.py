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
shared by the weights of one layout: :mod:`._cluster_share`); only the assignment changes. Positions that were exactly zero stay
zero (``keep_zero``: a pruned weight stays pruned; their error is still compensated).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve, cholesky

from ._cluster_kmeans import nearest

DAMPING = 0.01


def gptq_assign(matrix: np.ndarray, gram: np.ndarray, codebook: np.ndarray, scales: np.ndarray,
                zero_mask: np.ndarray | None = None) -> np.ndarray:
    """Labels (``n_out × k_in``) of ``matrix`` into ``scales[:, None] · codebook[labels]``."""
    w = np.array(matrix, dtype=np.float64)
    h = np.array(gram, dtype=np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += DAMPING * float(np.mean(np.diag(h))) * np.eye(len(h))
    upper = cholesky(cho_solve(cho_factor(h), np.eye(len(h))), lower=False)
    book = np.asarray(codebook, dtype=np.float64)
    zero_label = int(np.flatnonzero(book == 0)[0]) if zero_mask is not None and np.any(book == 0) else None
    s = np.asarray(scales, dtype=np.float64).ravel()
    labels = np.empty(w.shape, np.int64)
    for i in range(w.shape[1]):
        lab = nearest(book, w[:, i] / s)
        if zero_label is not None:
            lab[zero_mask[:, i]] = zero_label
        labels[:, i] = lab
        err = (w[:, i] - s * book[lab]) / upper[i, i]
        w[:, i + 1:] -= np.outer(err, upper[i, i + 1:])
    return labels


def cluster_layer(layer, gram: np.ndarray, codebook: np.ndarray, scales: np.ndarray | None,
                  keep_zero: bool) -> np.ndarray:
    """Labels, in the layout of the stored weight of ``layer`` (a :class:`._svd_stats.Layer`),
    of ``M = layer.matrixᵀ`` into the given (sorted) ``codebook`` and per-output-channel
    ``scales`` (``(n_out,)``, None for none), assigned by :func:`gptq_assign`."""
    stored = np.asarray(layer.node.inputs[1].values)
    m = layer.matrix.T  # n_out × k_in
    row_scales = np.ones(len(m)) if scales is None else np.asarray(scales).ravel()
    labels = gptq_assign(m, gram, codebook, row_scales, (m == 0) if keep_zero else None)
    if layer.kind == "conv" or (layer.kind == "gemm" and layer.node.attrs.get("transB", 0)):
        return labels.reshape(stored.shape)  # stored rows are the output channels
    return labels.T.copy()
