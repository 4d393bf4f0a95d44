"""Spatial decomposition of a k×k Conv: a (kh×1) Conv with ``r`` filters, then a (1×kw) Conv.

A 2-D Conv ``Y[o] = Σ_{c,y,x} W[o,c,y,x] · X[c, i·sh + y·dh − pt, l·sw + x·dw − pl]`` factorises
through the matrix ``M[(c,y), (o,x)] = W[o,c,y,x]`` (``C·kh × n·kw``; Jaderberg et al., 2014,
scheme 2). With ``M ≈ A B`` (``A``: ``C·kh × r``, ``B``: ``r × n·kw``, plain truncated SVD of
:mod:`onnxslim_kit.passes.svd.maths.factor`):

```
Conv(X, W[n,C,kh,kw], bias; s, d, pads)
  → Z = Conv(X, V[r,C,kh,1]; strides (sh,1), dilations (dh,1), pads (pt,0,pb,0))   V[j,c,y,0] = A[(c,y), j]
    Y = Conv(Z, H[n,r,1,kw], bias; strides (1,sw), dilations (1,dw), pads (0,pl,0,pr))  H[o,j,0,x] = B[j, (o,x)]
```

``Σ_j H[o,j,x] V[j,c,y] = (A B)[(c,y),(o,x)]``, so the pair equals the Conv exactly at full rank
``r = min(C·kh, n·kw)``. The first Conv pads only vertically; padding ``Z`` horizontally is the
same as padding ``X`` (the first Conv has no bias, so zero columns stay zero).

Cost, output ``b × H_out × W_out``, input width ``W_in``:
``before = 2 b H_out W_out · n C kh kw``; ``after = 2 (b H_out W_in · r C kh + b H_out W_out · n r kw)``.
Parameters ``r (C kh + n kw)`` vs ``n C kh kw``. Compared with ``k×k with r filters, then 1×1``
(:mod:`onnxslim_kit.passes.svd.rewrite`), it has the larger break-even rank when ``kh, kw > 1``; ``spatial=auto``
takes the one with fewer FLOPs at the rank each needs. The rank rule uses the weight-space
energy (exact for white inputs); the pass's end-to-end output target guards the rest.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes.svd.maths.factor import Factorization


def separable_matrix(weight: np.ndarray) -> np.ndarray:
    """``M[(c,y), (o,x)] = W[o,c,y,x]``, shape ``C·kh × n·kw``."""
    n, c, kh, kw = weight.shape
    return weight.transpose(1, 2, 0, 3).reshape(c * kh, n * kw)


def separable_weights(a: np.ndarray, b: np.ndarray, shape: tuple) -> tuple:
    """``(V [r,C,kh,1], H [n,r,1,kw])`` from ``A`` (``C·kh × r``) and ``B`` (``r × n·kw``)."""
    n, c, kh, kw = shape
    r = a.shape[1]
    return a.T.reshape(r, c, kh, 1), b.reshape(r, n, kw).transpose(1, 0, 2).reshape(n, r, 1, kw)


def separable_attrs(geometry) -> tuple:
    """Attributes of the vertical and the horizontal Conv (explicit pads; ``group`` 1)."""
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = geometry.strides, geometry.dilations, geometry.pads
    kh, kw = geometry.kernel
    first = {"kernel_shape": [kh, 1], "strides": [sh, 1], "dilations": [dh, 1], "pads": [pt, 0, pb, 0]}
    second = {"kernel_shape": [1, kw], "strides": [1, sw], "dilations": [1, dw], "pads": [0, pl, 0, pr]}
    return first, second


def separable_flops(x_shape: tuple, rows: int, geometry, n: int, c: int, r: int) -> int:
    """FLOPs of the pair for an input ``x_shape`` (NCHW) and ``rows`` output positions."""
    kh, kw = geometry.kernel
    width_out = -(-(x_shape[3] + geometry.pads[1] + geometry.pads[3] - (kw - 1) * geometry.dilations[1])
                  // geometry.strides[1])
    mid_rows = rows // max(width_out, 1) * x_shape[3]  # b · H_out · W_in
    return 2 * (mid_rows * r * c * kh + rows * n * r * kw)


def separable_breakeven(n: int, c: int, kh: int, kw: int) -> int:
    """The largest ``r`` with ``r (C kh + n kw) < n C kh kw``."""
    return max((n * c * kh * kw - 1) // (c * kh + n * kw), 0)


def separable_factorization(weight: np.ndarray) -> Factorization:
    return Factorization(separable_matrix(np.asarray(weight, np.float64)))
