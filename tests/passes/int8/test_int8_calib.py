"""Calibration methods of ``int8`` on known distributions, and the streaming histogram."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from onnxslim_kit.passes._quant.maths import calib
RNG = np.random.default_rng(1)


def collect(*chunks) -> calib.TensorStats:
    st = calib.TensorStats()
    for chunk in chunks:
        st.update(chunk)
    return st


def test_minmax_of_uniform_is_exact():
    x = RNG.uniform(-2.0, 5.0, 100_000).astype(np.float32)
    lo, hi = calib.clip_range(collect(x[:50_000], x[50_000:]), "minmax")
    assert (lo, hi) == (float(x.min()), float(x.max()))


def test_range_always_contains_zero():
    x = RNG.uniform(1.0, 3.0, 10_000).astype(np.float32)
    lo, hi = calib.clip_range(collect(x), "minmax")
    assert lo == 0.0 and hi == pytest.approx(float(x.max()))


def test_histogram_growth_keeps_counts_and_edges():
    small = RNG.standard_normal(10_000).astype(np.float32)
    big = (RNG.standard_normal(10_000) * 50).astype(np.float32)
    st = collect(small, big, np.array([np.inf, np.nan], np.float32))
    assert st.count == 20_000 and st.hist.sum() == 20_000
    assert st.radius >= np.abs(big).max()
    # the doubled histogram agrees with a direct histogram of all values on the same bins
    edges = np.linspace(-st.radius, st.radius, calib.NBINS + 1)
    direct, _ = np.histogram(np.concatenate([small, big]), edges)
    # re-binning merges exact bin pairs, so only values within one old bin of an edge may move
    assert np.abs(direct - st.hist).sum() <= 0.01 * st.count


def test_percentile_of_gaussian():
    x = RNG.standard_normal(400_000).astype(np.float32)
    lo, hi = calib.clip_range(collect(x), "percentile", percentile=99.9)
    z = sps.norm.ppf(0.999)
    assert hi == pytest.approx(z, abs=0.05) and lo == pytest.approx(-z, abs=0.05)
    assert hi < x.max()


def test_entropy_clips_heavy_tail_of_relu_output():
    x = np.maximum(RNG.laplace(0, 1, 200_000), 0).astype(np.float32)
    x[:5] = 200.0  # rare outliers
    lo, hi = calib.clip_range(collect(x), "entropy")
    assert lo == 0.0 and 3.0 < hi < 60.0  # well below the outliers, above the bulk


def test_mse_is_near_the_true_optimum():
    x = RNG.laplace(0, 1, 100_000).astype(np.float32)
    st = collect(x)
    lo, hi = calib.clip_range(st, "mse")

    def true_mse(a, b):
        s = (b - a) / 255
        q = np.clip(np.round((x - a) / s), 0, 255) * s + a
        return float(np.mean((x - q) ** 2))

    grid = [true_mse(a * float(x.min()), a * float(x.max())) for a in np.linspace(0.05, 1, 200)]
    assert true_mse(lo, hi) <= 1.05 * min(grid)
    assert hi < x.max() and true_mse(lo, hi) < true_mse(float(x.min()), float(x.max()))  # clipping pays


def test_methods_agree_on_bounded_uniform():
    x = RNG.uniform(-1, 1, 200_000).astype(np.float32)
    st = collect(x)
    for method in calib.METHODS:
        lo, hi = calib.clip_range(st, method)
        assert -1.0 <= lo <= -0.9 and 0.9 <= hi <= 1.0, method


def test_large_tensors_are_binned_on_a_prime_stride_with_exact_min_max():
    """Above HIST_VALUES values the histogram takes every s-th value (s prime): min/max stay
    exact, the percentile range stays within a bin or two of the full histogram's."""
    from onnxslim_kit.passes._quant.maths.calib import HIST_VALUES, TensorStats, clip_range, sample_stride

    assert sample_stride(HIST_VALUES) == 2 and sample_stride(HIST_VALUES * 3 + 1) == 5
    assert sample_stride(HIST_VALUES * 8 + 1) == 11
    x = np.random.default_rng(3).standard_normal((1, 64, 96, 96)).astype(np.float32)  # 589,824 values
    x[0, 5, 7, 11] = 40.0  # one outlier, probably not on the stride: still the exact max
    stats = TensorStats()
    stats.update(x)
    assert stats.hi == 40.0 and stats.lo == float(x.min())
    assert stats.count == len(range(0, x.size, sample_stride(x.size))) < x.size
    lo, hi = clip_range(stats, "percentile", 99.9)
    assert abs(hi - np.quantile(x, 0.999)) < 0.05 and abs(lo - np.quantile(x, 0.001)) < 0.05


def test_minmax_statistics_skip_the_histogram_and_give_the_same_range():
    from onnxslim_kit.passes._quant.maths.calib import TensorStats, clip_range

    rng = np.random.default_rng(4)
    full, bare = TensorStats(), TensorStats(binned=False)
    for _ in range(3):
        x = rng.standard_normal((2, 8, 40, 40)).astype(np.float32) * 3
        full.update(x)
        bare.update(x)
    assert not bare.hist.any() and full.hist.any()
    assert clip_range(bare, "minmax") == clip_range(full, "minmax") == (full.lo, full.hi)
    with pytest.raises(ValueError, match="histogram"):
        clip_range(bare, "percentile")
