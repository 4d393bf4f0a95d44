"""Drift metrics and the lossless criterion."""

import numpy as np
import pytest

from onnxslim_kit.metrics import compare, cosine, merge, within_tolerance


def test_identical_arrays():
    a = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    d = compare(a, a.copy())
    assert d.max_abs == 0 and d.cosine == pytest.approx(1.0) and d.top1 == 1.0
    assert within_tolerance(d, rtol=1e-5)


def test_known_error_and_scale():
    a = np.array([[0.0, 10.0], [5.0, -10.0]])
    b = a + np.array([[0.0, 0.001], [0.0, 0.0]])
    d = compare(a, b)
    assert d.max_abs == pytest.approx(0.001) and d.max_rel == pytest.approx(1e-4)
    assert within_tolerance(d, rtol=2e-4) and not within_tolerance(d, rtol=5e-5)


def test_top1_counts_flipped_rows():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    b = a.copy()
    b[0] = [0.0, 1.0]
    assert compare(a, b).top1 == pytest.approx(0.75)


def test_nonfinite_positions_must_match():
    a = np.array([1.0, np.nan, np.inf])
    assert within_tolerance(compare(a, a.copy()), rtol=1e-6)
    assert not within_tolerance(compare(a, np.array([1.0, 2.0, np.inf])), rtol=1e-6)


def test_integer_outputs_compare_exactly():
    d = compare(np.array([1, 2, 3]), np.array([1, 2, 4]))
    assert d.equal == pytest.approx(2 / 3) and not within_tolerance(d, rtol=1.0)


def test_cosine_and_merge():
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 0.0
    worst = merge([compare(np.ones(3), np.ones(3)), compare(np.ones(3), np.array([1.0, 1.0, 2.0]))])
    assert worst.max_abs == 1.0 and worst.cosine < 1.0
