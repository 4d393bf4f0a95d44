"""Numerical comparison of two output arrays (reference ``a`` vs candidate ``b``).

* ``max_abs``   = max |a − b|
* ``max_rel``   = max_abs / max |a|   (error relative to the output's scale, not per element,
  so outputs that pass through zero do not blow up)
* ``cosine``    = ⟨a, b⟩ / (‖a‖ ‖b‖) over all elements, in float64 (1.0 when both are zero)
* ``top1``      = fraction of rows (all axes but the last) whose argmax over the last axis
  agrees; only for float outputs whose last axis has more than one element
* ``equal``     = fraction of equal elements, for integer and boolean outputs

Lossless check: ``max_abs <= atol + rtol' · max|a|`` and NaN/Inf in the same places, where
``rtol' = max(rtol, LOSSLESS_ULPS · eps(dtype))`` for a float output of that dtype
(:func:`dtype_rtol`). Why: a lossless rewrite may reorder the arithmetic (a Mul folded into a
weight, MatMul + Add as one Gemm, a constant folded in numpy): each rounding of the dtype moves
a result by at most half a unit in the last place, eps/2 relative, and the output sees a few
of them along its chain — of the order of eps · max|a|. With float32 (eps = 2⁻²³ ≈ 1.2e-7)
``4·eps`` ≈ 4.8e-7 is far below the default rtol 1e-4, which is unchanged; with float16
(eps = 2⁻¹⁰ ≈ 9.8e-4) one step is already 10× the default (the attention float16 tests of
ONNX's suite move by 6e-4), so the bound becomes ``4·2⁻¹⁰`` ≈ 3.9e-3 relative: four float16
steps at the output's scale; a change of a constant by a few percent is still caught.

NaN in the reference (a model fed NaN as "missing", ``allow_nan``): NaN where the candidate
has NaN is equal, so the bounds above are over the positions finite in both; a NaN that moved,
appeared or vanished is ``nonfinite_mismatch`` (never within tolerance).

Values that are not tensors, as ONNX Runtime returns them: a sequence (``list``) is compared
element by element and the worst taken (:func:`merge`), a different length is a mismatch; a map
(``dict``) on its values in key order, other keys a mismatch; an absent optional (``None``)
equals only ``None``.
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
    """Drift of ``b`` from the reference ``a`` (same shape expected; lists, dicts and None as the
    module docstring says)."""
    if isinstance(a, (list, tuple, dict)) or isinstance(b, (list, tuple, dict)) or a is None or b is None:
        return _compare_values(a, b)
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


def _mismatch() -> Drift:
    return Drift(float("inf"), float("inf"), 0.0, None, 0.0, True)


def _compare_values(a, b) -> Drift:
    """:func:`compare` of sequences, maps and optionals (module docstring)."""
    if a is None or b is None:
        return Drift(0.0, 0.0, 1.0) if a is None and b is None else _mismatch()
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or set(a) != set(b):
            return _mismatch()
        keys = sorted(a, key=repr)
        a, b = [a[k] for k in keys], [b[k] for k in keys]
        if all(np.ndim(v) == 0 for v in a + b):  # scalar values: one vector, on its own scale
            return compare(np.array(a), np.array(b))
    if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))) or len(a) != len(b):
        return _mismatch()
    if not a:
        return Drift(0.0, 0.0, 1.0)
    return merge([compare(x, y) for x, y in zip(a, b)])


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


# units of the output dtype's eps (relative) a lossless rewrite may move an output by
LOSSLESS_ULPS = 4


def _eps(dtype) -> float | None:
    """Machine epsilon of a float dtype (numpy's, or ml_dtypes' for bfloat16/float8), else None."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    if dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    try:  # bfloat16, float8: not numpy kind "f"
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps)
    except Exception:  # noqa: BLE001 - not a float type ml_dtypes knows
        return None


def dtype_rtol(rtol: float, dtype=None) -> float:
    """The relative tolerance of a lossless check on an output of ``dtype``:
    ``max(rtol, LOSSLESS_ULPS · eps(dtype))`` for float dtypes, ``rtol`` otherwise."""
    eps = _eps(dtype) if dtype is not None else None
    return max(rtol, LOSSLESS_ULPS * eps) if eps else rtol


def least_precise(*dtypes):
    """The float dtype with the largest eps among ``dtypes`` (None when there is none)."""
    floats = [(eps, d) for d in dtypes if d is not None and (eps := _eps(d))]
    return max(floats, key=lambda item: item[0])[1] if floats else None


def within_tolerance(drift: Drift, rtol: float, atol: float = 1e-6, dtype=None) -> bool:
    """The lossless criterion: error small against the output's scale, non-finite in place;
    ``dtype``: the output's (the relative bound widens to a few of its rounding steps,
    :func:`dtype_rtol`)."""
    if drift.nonfinite_mismatch:
        return False
    if drift.equal is not None:
        return drift.equal == 1.0
    rtol = dtype_rtol(rtol, dtype)
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
