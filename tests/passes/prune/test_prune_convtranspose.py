"""prune through ConvTranspose (group=1): source on weight axis 1, consumer on axis 0."""

from __future__ import annotations

import numpy as np
from conftest import random_feeds, run_ort
from onnx import helper
from test_prune_strip import assert_equivalent, build, conv, conv_weight, run_prune, weight, zero_channels

from onnxslim_kit.metrics import cosine
from onnxslim_kit.passes.prune.strip import CONV_TRANSPOSE


def _deconv(name, x, w, b):
    return helper.make_node("ConvTranspose", [x, f"{name}.w", f"{name}.b"], [name], name=name,
                            kernel_shape=[2, 2], strides=[2, 2])


def head(a_w=None, t_w=None, t_b=None):
    """conv a (8) → Relu → ConvTranspose t (8 → 6, ×2) → Relu → ConvTranspose u (6 → 4, ×2)."""
    inits = {"a.w": weight(8, 3, 3, 3) if a_w is None else a_w, "a.b": weight(8),
             "t.w": weight(8, 6, 2, 2) if t_w is None else t_w, "t.b": weight(6) if t_b is None else t_b,
             "u.w": weight(6, 4, 2, 2), "u.b": weight(4)}
    nodes = [conv("a", "x", inits["a.w"], inits["a.b"], pads=1), helper.make_node("Relu", ["a"], ["r"]),
             _deconv("t", "r", inits["t.w"], inits["t.b"]), helper.make_node("Relu", ["t"], ["s"]),
             _deconv("u", "s", inits["u.w"], inits["u.b"])]
    return build(nodes, inits, [1, 3, 8, 8], {"u": 4}), inits


def test_zeroed_channels_around_conv_transpose_are_stripped_exactly():
    _, inits = head()
    a_w = zero_channels(inits["a.w"], [1, 5])
    a_b = inits["a.b"].copy()
    a_b[[1, 5]] = -1.0  # relu(−1) = 0: a zero channel may leave a ConvTranspose's input
    t_w = zero_channels(inits["t.w"], [0, 2, 3], axis=1)  # output channels of t live on axis 1
    t_b = inits["t.b"].copy()
    t_b[[0, 2]] = -0.5  # relu → 0: strippable
    t_b[3] = 0.7  # relu(0.7) = 0.7 ≠ 0 feeding ConvTranspose u: kept, with the reason
    inits.update({"a.w": a_w, "a.b": a_b, "t.w": t_w, "t.b": t_b})
    nodes = [conv("a", "x", a_w, a_b, pads=1), helper.make_node("Relu", ["a"], ["r"]),
             _deconv("t", "r", t_w, t_b), helper.make_node("Relu", ["t"], ["s"]),
             _deconv("u", "s", inits["u.w"], inits["u.b"])]
    proto = build(nodes, inits, [1, 3, 8, 8], {"u": 4})
    out, result = run_prune(proto, target="none")
    assert result.rewrites["strip constant channel"] == 2 + 2
    assert result.skipped[CONV_TRANSPOSE] == 1
    assert conv_weight(out, "a").shape == (6, 3, 3, 3)
    assert conv_weight(out, "t").shape == (6, 4, 2, 2)  # 2 inputs gone (axis 0), 2 outputs (axis 1)
    assert conv_weight(out, "u").shape == (4, 4, 2, 2)
    assert_equivalent(proto, out)


def test_ratio_prunes_through_conv_transpose():
    proto, _ = head()
    out, result = run_prune(proto, ratio=0.5, scope="layer", criterion="l2", multiple=2, min_channels=2)
    assert conv_weight(out, "a").shape[0] == 4
    assert conv_weight(out, "t").shape == (4, 4, 2, 2)
    assert conv_weight(out, "u").shape[0] == 4
    assert result.skipped["refit: ConvTranspose (mean compensation only)"] == 2
    feeds = random_feeds(proto, 3)
    assert run_ort(out, feeds)[0].shape == run_ort(proto, feeds)[0].shape == (1, 4, 32, 32)


def test_mean_compensation_is_exact_for_a_constant_channel_into_conv_transpose():
    """A removed input channel that is constant v adds v·W[k, o] to every output pixel when
    kernel = stride (each pixel sees one tap): the bias takes the tap average, exact up to
    the spread of the taps — zero here because every tap of the channel is equal."""
    _, inits = head()
    t_w = inits["t.w"].copy()
    t_w[1] = 0.3  # channel 1 of r: all taps equal
    a_w = zero_channels(inits["a.w"], [1])
    a_b = inits["a.b"].copy()
    a_b[1] = 2.0  # r[1] = relu(2) = 2 everywhere
    inits.update({"a.w": a_w, "a.b": a_b, "t.w": t_w})
    nodes = [conv("a", "x", a_w, a_b, pads=1), helper.make_node("Relu", ["a"], ["r"]),
             _deconv("t", "r", t_w, inits["t.b"]), helper.make_node("Relu", ["t"], ["s"]),
             _deconv("u", "s", inits["u.w"], inits["u.b"])]
    proto = build(nodes, inits, [1, 3, 8, 8], {"u": 4})
    out, _ = run_prune(proto, ratio=0.125, scope="layer", criterion="l1", multiple=1, min_channels=1,
                            refit=False, max_ratio=0.125)
    assert conv_weight(out, "a").shape[0] == 7  # the constant channel (L1 norm 0) is the one cut
    feeds = random_feeds(proto, 4)
    np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(proto, feeds)[0], rtol=1e-5, atol=1e-5)
    assert cosine(run_ort(out, feeds)[0], run_ort(proto, feeds)[0]) > 0.99999
