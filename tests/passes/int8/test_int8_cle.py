"""Cross-layer equalization (``int8(cle=true)``) on hand-built Conv → Relu → Conv pairs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_ort
from test_int8 import build, quantize

from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8.cle import equalize
from onnxslim_kit.pipeline import PassResult

RNG = np.random.default_rng(7)


def pair_model(depthwise: bool, relu: bool = True, compensate: bool = False):
    """Conv1 (8 output channels whose weight ranges span 0.01 … 10) → [Relu] → Conv2; with
    ``compensate`` (depthwise), Conv2 undoes the spread: every channel matters at the output."""
    spread = np.logspace(-2, 1, 8).astype(np.float32).reshape(8, 1, 1, 1)
    w1 = (RNG.standard_normal((8, 3, 3, 3)) * spread).astype(np.float32)
    b1 = (RNG.standard_normal(8) * spread.ravel()).astype(np.float32)
    w2 = RNG.standard_normal((8, 1, 3, 3) if depthwise else (4, 8, 3, 3)).astype(np.float32)
    w2 = w2 / spread if compensate else w2
    group = " <group = 8>" if depthwise else ""
    mid = "r = Relu (c1)\n" if relu else ""
    return build(f"c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)\n{mid}y = Conv{group} ({'r' if relu else 'c1'}, w2)",
                 "float[1, 3, 12, 12] x", {"w1": w1, "b1": b1, "w2": w2})


@pytest.mark.parametrize("depthwise", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_equalization_is_exact_and_balances_ranges(depthwise, relu):
    proto = pair_model(depthwise, relu)
    model = Model.from_proto(proto)
    result = PassResult()
    assert equalize(model.graph, result) == 1 and result.rewrites["cle: conv pair equalized"] == 1
    out = model.to_proto()
    x = {"x": RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(out, x)[0], run_ort(proto, x)[0], rtol=1e-4, atol=1e-4)
    convs = [n for n in model.graph.nodes if n.op == "Conv"]
    w1, w2 = convs[0].inputs[1].values, convs[1].inputs[1].values
    r1 = np.abs(w1).reshape(8, -1).max(axis=1)
    r2 = np.abs(w2).reshape(8, -1).max(axis=1) if depthwise else np.abs(w2).max(axis=(0, 2, 3))
    np.testing.assert_allclose(r1, r2, rtol=1e-5)  # both sqrt(r1·r2)


def test_relu6_and_shared_outputs_do_not_apply():
    proto = build("c1 = Conv (x, w1)\nr = Clip (c1, lo, hi)\ny = Conv (r, w2)", "float[1, 3, 8, 8] x",
                  {"w1": RNG.standard_normal((4, 3, 1, 1)).astype(np.float32), "lo": np.float32(0),
                   "hi": np.float32(6), "w2": RNG.standard_normal((2, 4, 1, 1)).astype(np.float32)})
    result = PassResult()
    assert equalize(Model.from_proto(proto).graph, result) == 0
    assert result.skipped["cle: not followed by (Relu →) Conv"] == 1
    assert result.skipped["cle: conv output read by several nodes"] == 1  # y is a graph output


def test_cle_improves_int8_fidelity_of_a_depthwise_pair():
    model = pair_model(depthwise=True, compensate=True)
    _, plain = quantize(model, "target=none,bias_correction=false")
    _, equal = quantize(model, "target=none,bias_correction=false,cle=true")
    assert equal.metrics["cle_pairs"] == 1
    before, after = plain.verification["outputs"]["y"]["cosine"], equal.verification["outputs"]["y"]["cosine"]
    assert before < 0.95 and after > 0.999, (before, after)  # measured: 0.79 → 0.9999
