"""One-dimensional k-means for weight clustering (the numerics behind the ``cluster`` pass).

Given the values ``v`` of a weight (or of one output channel) and a number of centroids ``k``:

1. **Exact limit.** If ``v`` has at most ``k`` distinct values, the codebook is those values
   (bit-for-bit, in ``v``'s dtype) and every index decodes to exactly the original value.
2. **Zero kept.** With ``keep_zero`` and at least one exact zero in ``v``, centroid 0.0 is
   reserved: zeros map to it (so pruned weights stay exactly zero) and the non-zero values
   are clustered with the remaining ``k − 1`` centroids. The codebook is returned sorted
   (:func:`nearest` relies on it).
3. **Lloyd in 1-D.** Minimise Σ (v_i − c_{a(i)})². Initialisation: k-means++ on a seeded
   sample (deterministic for a given ``seed``). With ``s`` = sorted values and prefix sums
   ``S``, each Lloyd step is exact and cheap: the nearest-centroid cells are the intervals
   between midpoints ``(c_j + c_{j+1}) / 2``, found by ``searchsorted``; a cell's new
   centroid is ``(S[hi] − S[lo]) / (hi − lo)``; an empty cell keeps its centroid. Stop when
   the cell boundaries no longer move (or after ``max_iter`` steps).

4. **Sketch of a large weight.** Above ``SKETCH_ABOVE`` values (issue 16's decoder: 145 weights
   of 2.4–9.4 M values, 8.5 min of sorting for two codebook sizes), Lloyd runs on a sketch
   instead of the sorted values: ``B = 65536`` equal-width bins over ``[min, max]``, each
   non-empty bin replaced by its weighted mean ``Σ w v / Σ w`` with mass ``Σ w`` — one O(N)
   pass (``bincount``), no sort. A Lloyd step on the sketch is the exact step on the values
   whenever no cell boundary falls inside a bin; otherwise a bin's mass goes whole to one
   side (a bin is ``(max − min) / 65536`` wide). Seeding: k-means++ on the sketch's
   ``INIT_SAMPLE`` mid-quantiles (deterministic); up to 1000 Lloyd steps (each
   ``O(k log B)`` on the sketch) instead of 100. The labels are still the nearest centroid
   of every value.

The exact-limit check first probes 4096 strided values (more than ``k`` distinct there: not
exact, no sort of the whole weight). Returns ``(codebook, labels)``: ``codebook[labels]`` is the
clustered weight.
"""

from __future__ import annotations

import numpy as np

INIT_SAMPLE = 20_000
SKETCH_ABOVE = 1 << 20  # values: a larger weight's centroids are fitted on its sketch
SKETCH_BINS = 1 << 16
SKETCH_CHUNK = 1 << 20
SKETCH_ITER = 1000  # Lloyd steps allowed on a sketch
DISTINCT_PROBE = 4096


def at_most_distinct(values, k: int) -> bool:
    """Whether ``values`` has at most ``k`` distinct values: a strided probe of
    :data:`DISTINCT_PROBE` values first (more than ``k`` there: no, without sorting them all)."""
    flat = np.asarray(values).ravel()
    if flat.size > DISTINCT_PROBE and np.unique(flat[::flat.size // DISTINCT_PROBE]).size > k:
        return False
    return np.unique(flat).size <= k


def kmeans_1d(values, k: int, keep_zero: bool = True, seed: int = 0, max_iter: int = 100, weights=None,
              labels: bool = True) -> tuple:
    """Cluster the 1-D array ``values`` into at most ``k`` centroids: ``(codebook, labels)``;
    ``weights`` (same size, positive) weight each value's squared error; ``labels=False``:
    ``(codebook, None)``, the codebook alone (:func:`codebooks_1d`)."""
    if not labels:
        return codebooks_1d(values, [k], keep_zero, seed, max_iter, weights)[0], None
    values = np.asarray(values).ravel()
    weights = None if weights is None else np.asarray(weights, np.float64).ravel()
    if at_most_distinct(values, k):
        distinct = np.unique(values)
        return distinct.copy(), np.searchsorted(distinct, values).astype(np.int64)
    zero = values == 0
    if keep_zero and zero.any():
        nonzero = ~zero
        centroids, inner = kmeans_1d(values[nonzero], k - 1, False, seed, max_iter,
                                     None if weights is None else weights[nonzero])
        codebook = np.concatenate([np.zeros(1, values.dtype), centroids])
        order = np.argsort(codebook, kind="stable")  # sorted, as nearest() needs
        assigned = np.zeros(values.size, np.int64)
        assigned[nonzero] = inner + 1
        return codebook[order], np.argsort(order)[assigned]
    codebook = _fit(_prepare(values, weights), k, seed, max_iter, values.dtype)
    return codebook, nearest(codebook.astype(np.float64), values.astype(np.float64))


def codebooks_1d(values, ks, keep_zero: bool = True, seed: int = 0, max_iter: int = 100, weights=None) -> list:
    """The codebook of :func:`kmeans_1d` for every ``k`` of ``ks`` (no labels), the values
    prepared once for all of them: zeros set apart, sorted or sketched (:func:`_prepare`)."""
    values = np.asarray(values).ravel()
    weights = None if weights is None else np.asarray(weights, np.float64).ravel()
    zero = values == 0 if keep_zero else None
    kept = zero is not None and bool(zero.any())
    fitted, fitted_weights = values, weights
    if kept:
        fitted = values[~zero]
        fitted_weights = None if weights is None else weights[~zero]
    prepared, books = None, []
    for k in ks:
        if at_most_distinct(values, k):
            books.append(np.unique(values))
            continue
        inner = k - 1 if kept else k
        if kept and at_most_distinct(fitted, inner):
            centroids = np.unique(fitted)
        else:
            prepared = prepared or _prepare(fitted, fitted_weights)
            centroids = _fit(prepared, inner, seed, max_iter, values.dtype)
        books.append(np.sort(np.concatenate([np.zeros(1, values.dtype), centroids])) if kept else centroids)
    return books


def _prepare(values: np.ndarray, weights) -> tuple:
    """``(points, masses, k-means++ candidates, least Lloyd steps)`` of more than ``k`` distinct
    values: the sorted values, or their sketch (:func:`sketch`) above :data:`SKETCH_ABOVE`."""
    if values.size > SKETCH_ABOVE:
        points, mass = sketch(values, weights)
        return points, mass, _quantile_sample(points, mass, INIT_SAMPLE), SKETCH_ITER  # a step costs O(k log B)
    data = values.astype(np.float64)
    order = np.argsort(data, kind="stable")
    points = data[order]
    return points, np.ones(values.size) if weights is None else weights[order], points, 0


def _fit(prepared: tuple, k: int, seed: int, max_iter: int, dtype) -> np.ndarray:
    """The ``k`` centroids (in ``dtype``, sorted) of :func:`_prepare`'d values."""
    points, mass, init, least = prepared
    centroids = np.sort(_kmeans_pp(init, k, np.random.default_rng(seed)))
    return _lloyd(points, mass, centroids, max(max_iter, least)).astype(dtype)


def sketch(values: np.ndarray, weights=None) -> tuple:
    """``(points, masses)``: the values in :data:`SKETCH_BINS` equal-width bins over their range,
    each non-empty bin as its weighted mean and total weight (ascending; one pass, in chunks)."""
    lo, hi = float(values.min()), float(values.max())
    scale = SKETCH_BINS / (hi - lo)
    mass, sums = np.zeros(SKETCH_BINS), np.zeros(SKETCH_BINS)
    for start in range(0, values.size, SKETCH_CHUNK):
        part = values[start:start + SKETCH_CHUNK].astype(np.float64)
        w = np.ones(part.size) if weights is None else weights[start:start + SKETCH_CHUNK]
        index = np.minimum(((part - lo) * scale).astype(np.int64), SKETCH_BINS - 1)
        mass += np.bincount(index, w, minlength=SKETCH_BINS)
        sums += np.bincount(index, w * part, minlength=SKETCH_BINS)
    kept = mass > 0
    return sums[kept] / mass[kept], mass[kept]


def _quantile_sample(points: np.ndarray, mass: np.ndarray, size: int) -> np.ndarray:
    """``size`` values at the mid-quantiles ``(i + ½) / size`` of the weighted ``points``."""
    cumulative = np.cumsum(mass)
    targets = (np.arange(size) + 0.5) * (cumulative[-1] / size)
    return points[np.minimum(np.searchsorted(cumulative, targets), len(points) - 1)]


def nearest(sorted_centroids: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (centroids sorted ascending)."""
    bounds = (sorted_centroids[:-1] + sorted_centroids[1:]) / 2
    return np.searchsorted(bounds, data).astype(np.int64)


def _kmeans_pp(ordered: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding on a seeded sample of at most INIT_SAMPLE values."""
    sample = ordered if ordered.size <= INIT_SAMPLE else rng.choice(ordered, INIT_SAMPLE, replace=False)
    chosen = [sample[rng.integers(sample.size)]]
    dist = (sample - chosen[0]) ** 2
    for _ in range(1, k):
        total = dist.sum()
        if total <= 0:  # fewer distinct values in the sample than k: spread the rest evenly
            break
        pick = sample[rng.choice(sample.size, p=dist / total)]
        chosen.append(pick)
        dist = np.minimum(dist, (sample - pick) ** 2)
    if len(chosen) < k:
        chosen.extend(np.quantile(ordered, np.linspace(0, 1, k - len(chosen))))
    return np.array(chosen)


def _lloyd(ordered: np.ndarray, weights: np.ndarray, centroids: np.ndarray, max_iter: int) -> np.ndarray:
    prefix = np.concatenate([[0.0], np.cumsum(weights * ordered)])
    mass = np.concatenate([[0.0], np.cumsum(weights)])
    edges = None
    for _ in range(max_iter):
        cuts = np.searchsorted(ordered, (centroids[:-1] + centroids[1:]) / 2)
        new_edges = np.concatenate([[0], cuts, [ordered.size]])
        if edges is not None and np.array_equal(new_edges, edges):
            break
        edges = new_edges
        counts = mass[edges[1:]] - mass[edges[:-1]]
        sums = prefix[edges[1:]] - prefix[edges[:-1]]
        filled = counts > 0  # empty (or zero-weight) cells keep their centroid
        centroids = centroids.copy()
        centroids[filled] = sums[filled] / counts[filled]
        centroids = np.sort(centroids)
    return centroids


def cluster_weight(weight: np.ndarray, k: int, keep_zero: bool = True, seed: int = 0,
                   channel_scale: bool = False, axis: int = 0):
    """``(codebook, labels, scales)`` for a whole weight, one codebook (``scales``: None unless
    used, else shaped to broadcast against the weight: ``C`` along ``axis``, 1 elsewhere;
    per-row codebooks: :mod:`onnxslim_kit.passes.cluster.maths.rows`).

    ``axis`` is the output-channel axis of the weight (0 for Conv and Gemm ``transB=1``, the
    last one for a MatMul / Gemm ``transB=0`` right-hand weight); a "row" below is one slice
    ``W[…, c, …]`` along it.

    * ``codebook`` ``(k',)``, ``labels`` of the weight's shape, ``W' = codebook[labels]``;
    * channel scales (one scale per row): rows are normalised by their RMS ``s_c``, the
      normalised values clustered with weights ``s_c²`` (so the objective is still the squared
      error of ``W``), ``W'[c] = s_c · codebook[labels[c]]``. Skipped when the weight has at
      most ``k`` distinct values (the exact codebook needs no scales).
    """
    if weight.ndim >= 2 and axis % weight.ndim != 0:
        codebook, labels, scales = cluster_weight(np.moveaxis(weight, axis, 0), k, keep_zero, seed, channel_scale)
        return codebook, np.moveaxis(labels, 0, axis), None if scales is None else np.moveaxis(scales, 0, axis)
    rows = weight.reshape(weight.shape[0], -1) if weight.ndim >= 2 else None
    if channel_scale and rows is not None and not at_most_distinct(weight, k):
        scales = np.sqrt(np.mean(rows.astype(np.float64) ** 2, axis=1))
        scales[scales == 0] = 1.0
        scales = scales.astype(weight.dtype)
        normalised = rows / scales[:, None]
        weights = np.repeat(scales.astype(np.float64) ** 2, rows.shape[1])
        codebook, labels = kmeans_1d(normalised, k, keep_zero, seed, weights=weights)
        return codebook, labels.reshape(weight.shape), scales.reshape((-1,) + (1,) * (weight.ndim - 1))
    codebook, labels = kmeans_1d(weight, k, keep_zero, seed)
    return codebook, labels.reshape(weight.shape), None
