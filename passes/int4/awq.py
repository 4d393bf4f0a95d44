"""Activation-aware scaling for int4 weights (AWQ, Lin et al., 2023), searched on a Hessian.

A layer ``Y = X · W`` (``Wt = Wᵀ`` [N, K]) is rewritten exactly as

    Y = (X · diag(1/s)) · (diag(s) · W)          s > 0 per input channel k

and only ``Wt · diag(s)`` is quantized. Input channels that carry large activations get
``s_k > 1``: their weights are stretched over more of the 4-bit grid, so their rounding error
— which is multiplied by |x_k| in the output — shrinks, at the cost of the quiet channels.

Scales come from the activation magnitude, ``a_k = sqrt(H[k,k])`` (root-mean-square of x_k up
to a constant; ``H = XᵀX`` summed over the calibration rows), one exponent α per input tensor:

    s(α) = a^α / sqrt(max(a^α) · min(a^α))     (α = 0: s = 1, plain quantization)
    α* = argmin_α Σ_layers tr(ΔW(α) · H · ΔW(α)ᵀ),   ΔW(α) = Q(Wt·diag s)·diag(1/s) − Wt

— the exact output error ‖X·ΔWᵀ‖² of round-to-nearest on the calibration data, summed over
the layers that read the same input (they share one ``Mul`` by 1/s in the graph). α is searched
on the grid 0, 0.1, …, 1; α = 0 is a candidate, so the search never does worse than plain RTN
on the calibration objective. GPTQ then runs on ``Wt·diag(s)`` with the Hessian of the scaled
input, ``diag(1/s) · H · diag(1/s)``.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes.int4.quant import dequantize, quantize_rtn

ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))


def scales_for(xtx: np.ndarray, alpha: float) -> np.ndarray:
    """s(α) [K] float32 (dead channels, a_k = 0, get s_k = 1)."""
    a = np.sqrt(np.maximum(np.diag(xtx), 0.0))
    live = a > 0
    s = np.ones(a.shape, np.float64)
    if alpha and live.any():
        p = a[live] ** alpha
        s[live] = p / np.sqrt(p.max() * p.min())
    return s.astype(np.float32)


def output_error(wt: np.ndarray, deq: np.ndarray, h: np.ndarray) -> float:
    """tr(ΔW · H · ΔWᵀ) = ‖X · ΔWᵀ‖² for ΔW = deq − wt [N, K] and H = XᵀX [K, K]."""
    delta = np.asarray(deq, np.float32) - wt
    return float(np.einsum("nk,nk->", delta @ h, delta))


def search_scales(wts: list, xtx: np.ndarray, block_size: int, symmetric: bool, search: bool = False) -> tuple:
    """(s [K], α*, {α: summed output error}) for the layers ``wts`` ([N_i, K] each) on one input."""
    h = np.asarray(xtx, np.float32)
    errors = {}
    best = (None, None, np.inf)
    for alpha in ALPHAS:
        s = scales_for(xtx, alpha)
        err = sum(output_error(wt, dequantize(quantize_rtn(wt * s, block_size, symmetric, search)) / s, h)
                  for wt in wts)
        errors[alpha] = err
        if err < best[2]:
            best = (s, alpha, err)
    return best[0], best[1], errors


def scaled_hessian(xtx: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Hessian of the scaled input X·diag(1/s): diag(1/s) · H · diag(1/s)."""
    inv = 1.0 / s.astype(np.float64)
    return xtx * inv[:, None] * inv[None, :]
