"""Numerical comparison of two output arrays (reference ``a`` vs candidate ``b``).

* ``max_abs``   = max |a − b|
* ``max_rel``   = max_abs / max |a|   (error relative to the output's scale, not per element,
  so outputs that pass through zero do not blow up)
* ``cosine``    = ⟨a, b⟩ / (‖a‖ ‖b‖) over all elements, in float64 (1.0 when both are zero)
* ``top1``      = fraction of rows (all axes but the last) whose argmax over the last axis
  agrees; only for float outputs whose last axis has more than one element
* ``equal``     = fraction of equal elements, for integer and boolean outputs

Lossless check: ``max_abs <= atol + rtol · max|a|`` and NaN/Inf in the same places.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class Drift:
    max_abs: float
    max_rel: float
    cosine: float
    top1: float | None = None
    equal: float | None = None
    nonfinite_mismatch: bool = False

    def to_dict(self) -> dict:
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def compare(a: np.ndarray, b: np.ndarray) -> Drift:
    """Drift of ``b`` from the reference ``a`` (same shape expected)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        return Drift(float("inf"), float("inf"), 0.0, None, 0.0, True)
    if a.dtype.kind in "biuUSO" or b.dtype.kind in "biuUSO":
        equal = float(np.mean(a == b)) if a.size else 1.0
        mismatch = 0.0 if equal == 1.0 else float("inf")
        return Drift(mismatch, mismatch, equal, None, equal)
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    nonfinite_mismatch = bool(np.any(fa != fb)) or bool(
        np.any(~fa & (a64 != b64) & ~(np.isnan(a64) & np.isnan(b64)))
    )
    both = fa & fb
    diff = np.abs(a64[both] - b64[both])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(a64[both]).max()) if diff.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return Drift(max_abs, max_rel, cosine(a64[both], b64[both]), top1_agreement(a, b), None, nonfinite_mismatch)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.ndim == 0 or a.shape[-1] < 2 or a.dtype.kind != "f":
        return None
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


def within_tolerance(drift: Drift, rtol: float, atol: float = 1e-6) -> bool:
    """The lossless criterion: error small against the output's scale, non-finite in place."""
    if drift.nonfinite_mismatch:
        return False
    if drift.equal is not None:
        return drift.equal == 1.0
    scale = drift.max_abs / drift.max_rel if drift.max_rel not in (0.0, float("inf")) else 0.0
    return drift.max_abs <= atol + rtol * scale


def merge(drifts: list) -> Drift:
    """Worst case over samples: max of errors, min of agreements."""
    def worst(values, fn):
        values = [v for v in values if v is not None]
        return fn(values) if values else None

    return Drift(
        max_abs=worst([d.max_abs for d in drifts], max),
        max_rel=worst([d.max_rel for d in drifts], max),
        cosine=worst([d.cosine for d in drifts], min),
        top1=worst([d.top1 for d in drifts], min),
        equal=worst([d.equal for d in drifts], min),
        nonfinite_mismatch=any(d.nonfinite_mismatch for d in drifts),
    )


def within_atol(drift: Drift, atol: float) -> bool:
    """The per-output criterion (``--atol OUT:1e-3``, as Polygraphy): max |a − b| ≤ atol,
    non-finite values in the same places, integer outputs equal."""
    if drift.nonfinite_mismatch:
        return False
    if drift.equal is not None:
        return drift.equal == 1.0
    return drift.max_abs <= atol
