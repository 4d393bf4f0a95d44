"""GPTQ rounding for block-wise int4 (Frantar et al., 2022), in numpy/scipy.

Minimises ‖X·Wᵀ − X·Qᵀ‖² column by column (a column = one input feature k of ``Wt`` [N, K]):

    H = 2 XᵀX / n_rows                       (from calibration activations X [n_rows, K])
    dead k (H[k,k] = 0): H[k,k] = 1, Wt[:, k] = 0
    H += λ·I,  λ = damp · mean(diag H)       (damp = 0.01)
    U = chol(H⁻¹) (upper)
    for k = 0 … K−1:
        at a quantization-block start: s, z from the *current* Wt[:, k : k+bs]
        q_k = quant(Wt[:, k]);  e = (Wt[:, k] − deq(q_k)) / U[k, k]
        Wt[:, k+1:] −= e · U[k, k+1:]         (spread the error over the remaining columns)

The factor without forming H⁻¹ (one Cholesky, one triangular inverse, float32 LAPACK; float64
only if float32 Cholesky fails): with J the reversal permutation, chol(J·H·J) = L̃ (lower) gives
H = R·Rᵀ with R = J·L̃·J upper triangular, so H⁻¹ = R⁻ᵀ·R⁻¹ and U = R⁻¹ (upper, positive
diagonal: the upper Cholesky factor of H⁻¹ is unique).

Lazy batch updates, two levels: inside a quantization block (bs columns) each column updates
the block only; the block's errors E [bs, N] then update the rest of its chunk (``lazy`` = 128
columns) in one matrix product, and the chunk's errors update the remaining columns once per
chunk: Wt[:, end:] −= E · U[chunk, end:]. O(N·K²) flops, almost all in float32 BLAS products;
the BLAS thread pool is capped (``threads``; 1 by default: on the shared 2-core machine a
2-thread OpenBLAS was 20× slower than 1 thread under load) when threadpoolctl is installed.
"""

from __future__ import annotations


import numpy as np
import scipy.linalg

from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes.int4.quant import (
    QuantizedWeight,
    _pad_codes,
    block_params,
    dequantize_values,
    quantize_rtn,
    quantize_values,
)


def hessian_update(h: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """Add the rows of ``x`` (any leading shape, last axis K) to the running sum XᵀX."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    xtx = (x.T @ x).astype(np.float64)  # float32 product (BLAS sgemm), float64 running sum
    return xtx if h is None else h + xtx


def inverse_cholesky_upper(h: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor U of (H + damp·mean(diag H)·I)⁻¹, i.e. UᵀU = H⁻¹ (float32)."""
    k = h.shape[0]
    lam = damp * float(np.mean(np.diag(h), dtype=np.float64))
    for dtype in (np.float32, np.float64):
        flipped = np.array(h[::-1, ::-1], dtype=dtype)  # J·H·J (one copy)
        flipped[np.diag_indices(k)] += lam if lam > 0 else 1.0
        potrf, trtri = scipy.linalg.lapack.get_lapack_funcs(("potrf", "trtri"), (flipped,))
        low, info = potrf(flipped, lower=1, overwrite_a=1, clean=1)
        if info == 0:
            break
    if info != 0:
        raise np.linalg.LinAlgError(f"Hessian not positive definite (potrf info {info})")
    u, info = trtri(np.ascontiguousarray(low[::-1, ::-1]), lower=0, overwrite_c=1)  # R⁻¹, H = R·Rᵀ
    if info != 0:
        raise np.linalg.LinAlgError(f"Hessian factor singular (trtri info {info})")
    return u.astype(np.float32, copy=False)


def gptq_factor(xtx: np.ndarray, damp: float, threads: int = 1, act_order: bool = False) -> tuple:
    """(U float32, dead-column mask, column order) of a summed XᵀX: dead columns get H[k,k] = 1;
    ``act_order``: columns by descending H[k,k] (U is then the factor of the permuted H)."""
    dead = np.diag(xtx) == 0
    h = xtx
    if dead.any():
        h = np.array(xtx)
        h[dead, dead] = 1.0
    order = np.argsort(-np.where(dead, -1.0, np.diag(xtx)), kind="stable") if act_order else None
    if order is not None:
        h = h[np.ix_(order, order)]
    with blas_threads(threads):
        return inverse_cholesky_upper(h, damp), dead, order


def quantize_gptq(
    wt: np.ndarray, xtx: np.ndarray, block_size: int, symmetric: bool, damp: float = 0.01, lazy: int = 128,
    search: bool = False, factor: tuple | None = None, threads: int = 1, act_order: bool = False,
) -> QuantizedWeight:
    """GPTQ codes for ``wt`` [N, K] given the summed XᵀX [K, K] of its inputs (or its
    :func:`gptq_factor`, shared by the layers that read the same input).

    ``act_order``: columns in order of descending H[k,k] (the most active inputs first, while
    the most columns remain to absorb their error); block scales are then *static* — the
    round-to-nearest ranges of the original weight — since a block's columns are no longer
    visited together (the encodings keep contiguous blocks: no g_idx)."""
    n, k = wt.shape
    u, dead, order = factor if factor is not None else gptq_factor(xtx, damp, threads, act_order)
    w_kn = np.array(np.asarray(wt, dtype=np.float32).T, order="C")  # [K, N]: a column of Wt is a row here
    w_kn[dead, :] = 0.0
    n_blocks = -(-k // block_size)
    importance = np.diag(xtx).astype(np.float32) if search else None
    if order is None:
        q, scale, zero = _sweep_dynamic(w_kn, u, block_size, symmetric, search, lazy, threads, importance)
    else:
        static = quantize_rtn(w_kn.T, block_size, symmetric, search, importance)
        scale, zero = static.scale.T.copy(), static.zero.T.copy()  # [n_blocks, N]
        q_perm = _sweep(w_kn[order], u, block_size, lazy, threads,
                        lambda j: (scale[order[j] // block_size], zero[order[j] // block_size]), symmetric)
        q = np.zeros((n_blocks * block_size, n), np.uint8)
        q[order] = q_perm
    q, scale, zero = np.ascontiguousarray(q.T), np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T)
    q = _pad_codes(q, zero, k, block_size)
    return QuantizedWeight(q, scale, zero, k, block_size, symmetric)


def _sweep_dynamic(w_kn, u, block_size, symmetric, search, lazy, threads, importance=None) -> tuple:
    """The sweep in natural order, each block's scale taken from its *updated* columns when the
    sweep reaches it. Returns (codes [K_pad, N], scale [n_blocks, N], zero [n_blocks, N])."""
    k, n = w_kn.shape
    n_blocks = -(-k // block_size)
    scale = np.zeros((n_blocks, n), np.float32)
    zero = np.zeros((n_blocks, n), np.uint8)

    def params(col):
        b = col // block_size
        if col % block_size == 0:
            end = min(col + block_size, k)
            weight = None if importance is None else importance[col:end]
            scale[b], zero[b] = block_params(w_kn[col:end].T, symmetric, search, weight)
        return scale[b], zero[b]

    codes = _sweep(w_kn, u, block_size, lazy, threads, params, symmetric)
    q = np.zeros((n_blocks * block_size, n), np.uint8)
    q[:k] = codes
    return q, scale, zero


def _sweep(w_kn, u, block_size, lazy, threads, params, symmetric) -> np.ndarray:
    """Quantize the rows of ``w_kn`` [K, N] in order, spreading each row's error over the rows
    after it (two-level lazy batches, see the module docstring); ``params(j)`` gives row j's
    (scale, zero) [N] when the sweep reaches it. ``w_kn`` is updated in place; returns codes."""
    k, n = w_kn.shape
    q = np.zeros((k, n), np.uint8)
    lazy = max(lazy, block_size) // block_size * block_size
    with blas_threads(threads):
        for start in range(0, k, lazy):
            end = min(start + lazy, k)
            errors = np.zeros((end - start, n), np.float32)
            for b0 in range(start, end, block_size):
                b1 = min(b0 + block_size, end)
                for col in range(b0, b1):
                    s, z = params(col)
                    w = w_kn[col]
                    q[col] = quantize_values(w, s, z, symmetric)
                    err = (w - dequantize_values(q[col], s, z)) / u[col, col]
                    w_kn[col + 1 : b1] -= np.outer(u[col, col + 1 : b1], err)
                    errors[col - start] = err
                if b1 < end:
                    w_kn[b1:end] -= u[b0:b1, b1:end].T @ errors[b0 - start : b1 - start]
            if end < k:
                w_kn[end:] -= u[start:end, end:].T @ errors
    return q
