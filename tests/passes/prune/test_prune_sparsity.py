"""prune(sparsity=…) and prune(nm=N:M): magnitude sparsity, honest notes, compressed size."""

from __future__ import annotations

import numpy as np
import pytest
from test_prune_ratio import NET, min_cosine
from test_prune_strip import conv_weight, run_prune

from onnxslim_kit.errors import UserError
from onnxslim_kit.passes.prune.sparsity import magnitude_mask, nm_mask

DENSE = ["c1", "c2", "c3", "c4", "c5"]


def test_unstructured_sparsity_zeroes_the_smallest_half():
    out, result = run_prune(NET, sparsity=0.5)
    for name in DENSE + ["dw"]:
        w = conv_weight(out, name)
        assert np.sum(w == 0) == int(0.5 * w.size)
        original = conv_weight(NET, name)
        kept = np.abs(original[w != 0])
        dropped = np.abs(original[w == 0])
        assert kept.min() >= dropped.max()  # magnitude order respected
    assert result.rewrites["sparsify weight"] == 7  # six Conv + the Gemm
    assert result.metrics["zlib_bytes_after"] < result.metrics["zlib_bytes_before"]
    assert any("no speed-up" in note for note in result.notes)
    assert min_cosine(out) > 0.5


def test_two_four_pattern_along_input_channels():
    out, result = run_prune(NET, nm="2:4")
    for name in DENSE[1:]:  # c1 reads 3 input channels: not a multiple of 4
        w = conv_weight(out, name)
        groups = np.moveaxis(w, 1, -1).reshape(-1, 4)
        assert (np.count_nonzero(groups, axis=1) <= 2).all()
        assert np.count_nonzero(w) == w.size // 2
    assert conv_weight(out, "dw").shape[1] == 1 and np.count_nonzero(conv_weight(out, "dw")) == 32 * 9
    assert np.count_nonzero(conv_weight(out, "c1")) == 32 * 3 * 9
    assert result.skipped["sparsity: reduction length not a multiple of 4"] == 2  # c1 and the depthwise conv
    assert result.metrics["weight_sparsity"] > 0.45


def test_masks_on_small_arrays():
    w = np.array([[0.1, -3.0, 0.2, 4.0], [1.0, 1.0, -1.5, 0.0]])
    assert nm_mask(w, 1, 2, 4).tolist() == [[False, True, False, True], [True, False, True, False]]
    assert nm_mask(w, 0, 1, 4) is None
    assert magnitude_mask(w, 0.25).sum() == 6


def test_bad_nm_is_a_user_error():
    with pytest.raises(UserError):
        run_prune(NET, nm="4:2")
