"""GPTQ rounding for block-wise int4 (Frantar et al., 2022), in numpy/scipy.

Minimises ‖X·Wᵀ − X·Qᵀ‖² column by column (a column = one input feature k of ``Wt`` [N, K]):

    H = 2 XᵀX / n_rows                       (from calibration activations X [n_rows, K])
    dead k (H[k,k] = 0): H[k,k] = 1, Wt[:, k] = 0
    H += λ·I,  λ = damp · mean(diag H)       (damp = 0.01)
    U = chol(H⁻¹) (upper)                    (H⁻¹ via Cholesky, in float64)
    for k = 0 … K−1:
        at a quantization-block start: s, z from the *current* Wt[:, k : k+bs]
        q_k = quant(Wt[:, k]);  e = (Wt[:, k] − deq(q_k)) / U[k, k]
        Wt[:, k+1:] −= e · U[k, k+1:]         (spread the error over the remaining columns)

Lazy batch updates: columns are processed in chunks of ``lazy`` (a multiple of the block
size, ≥ 128); inside a chunk the update touches the chunk only, and the accumulated errors
E [N, lazy] update the rest once per chunk: Wt[:, end:] −= E · U[chunk, end:]. This is
O(N·K²) flops in BLAS matrix products (a 4096×4096 layer takes seconds).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ._int4_quant import (
    QuantizedWeight,
    _pad_codes,
    block_params,
    dequantize_values,
    quantize_values,
)


def hessian_update(h: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """Add the rows of ``x`` (any leading shape, last axis K) to the running sum XᵀX."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    xtx = (x.T @ x).astype(np.float64)  # float32 product (BLAS sgemm), float64 running sum
    return xtx if h is None else h + xtx


def inverse_cholesky_upper(h: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor of (H + damp·mean(diag H)·I)⁻¹ (float64)."""
    h = h.copy()
    k = h.shape[0]
    lam = damp * float(np.mean(np.diag(h)))
    h[np.diag_indices(k)] += lam if lam > 0 else 1.0
    upper, info = scipy.linalg.lapack.dpotrf(h, lower=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"Hessian not positive definite (potrf info {info})")
    inv, info = scipy.linalg.lapack.dpotri(upper, lower=0)  # upper triangle of H⁻¹
    if info != 0:
        raise np.linalg.LinAlgError(f"Hessian not invertible (potri info {info})")
    h_inv = np.triu(inv) + np.triu(inv, 1).T
    return scipy.linalg.cholesky(h_inv, lower=False)


def gptq_factor(xtx: np.ndarray, damp: float) -> tuple:
    """(U float32, dead-column mask) of a summed XᵀX: dead columns get H[k,k] = 1."""
    h = np.array(xtx, dtype=np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    return inverse_cholesky_upper(h, damp).astype(np.float32), dead


def quantize_gptq(
    wt: np.ndarray, xtx: np.ndarray, block_size: int, symmetric: bool, damp: float = 0.01, lazy: int = 128,
    search: bool = False, factor: tuple | None = None,
) -> QuantizedWeight:
    """GPTQ codes for ``wt`` [N, K] given the summed XᵀX [K, K] of its inputs (or its
    :func:`gptq_factor`, shared by the layers that read the same input)."""
    n, k = wt.shape
    u, dead = factor if factor is not None else gptq_factor(xtx, damp)
    w_kn = np.array(np.asarray(wt, dtype=np.float32).T, order="C")  # [K, N]: a column of Wt is a row here
    w_kn[dead, :] = 0.0

    n_blocks = -(-k // block_size)
    q = np.zeros((n_blocks * block_size, n), np.uint8)
    scale = np.zeros((n_blocks, n), np.float32)
    zero = np.zeros((n_blocks, n), np.uint8)
    lazy = max(lazy, block_size) // block_size * block_size
    for start in range(0, k, lazy):
        end = min(start + lazy, k)
        chunk = w_kn[start:end]  # view: updated in place
        errors = np.zeros((end - start, n), np.float32)
        for j in range(end - start):
            col = start + j
            b = col // block_size
            if col % block_size == 0:
                scale[b], zero[b] = block_params(w_kn[col : min(col + block_size, k)].T, symmetric, search)
            w = chunk[j]
            qc = quantize_values(w, scale[b], zero[b], symmetric)
            q[col] = qc
            err = (w - dequantize_values(qc, scale[b], zero[b])) / u[col, col]
            chunk[j + 1 :] -= np.outer(u[col, col + 1 : end], err)
            errors[j] = err
        if end < k:
            w_kn[end:] -= u[start:end, end:].T @ errors
    q, scale, zero = np.ascontiguousarray(q.T), np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T)
    q = _pad_codes(q, zero, k, block_size)
    return QuantizedWeight(q, scale, zero, k, block_size, symmetric)
