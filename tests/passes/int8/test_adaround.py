"""``int8(rounding=adaround)``: learned weight rounding on the exact grids (passes/int8/adaround.py).

Lossless and limit cases: a weight already on its grid stays exactly; every code is the
floor or the ceiling of ``W / s``; the layer's output reconstruction error on its fit rows is
never above nearest rounding's (and below it where there is something to learn); the same
seed gives the same bytes; the grids (uint8 MatMul with zero point 128, 7-bit full Conv,
8-bit depthwise) are kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.passes.int8 import adaround

from test_int8 import build, quantize, w

RNG = np.random.default_rng(5)
SAMPLES = 4  # all rows of these tiny inputs are fit rows (fewer than adaround.ROWS)


def dq_weights(out) -> dict:
    """Per Conv / MatMul / Gemm name: (signed codes, scale, zero point or None) of its DequantizeLinear weight."""
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    found = {}
    for node in out.graph.node:
        if node.op_type in ("Conv", "MatMul", "Gemm") and node.input[1] in producers:
            dq = producers[node.input[1]]
            codes, scale = inits[dq.input[0]], inits[dq.input[1]]
            zero = inits[dq.input[2]] if len(dq.input) > 2 else None
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
            shape = [1] * codes.ndim
            shape[axis] = -1
            signed = codes.astype(np.int32) - (zero.astype(np.int32).reshape(shape) if zero is not None else 0)
            found[node.name] = (signed, scale, zero)
    return found


def single_conv(weight, group: int = 1):
    c = weight.shape[1] * group
    return build(f"y = Conv <pads = [1, 1, 1, 1], group = {group}> (x, w1)", f"float[1, {c}, 8, 8] x", {"w1": weight})


def single_matmul(weight):
    return build("y = MatMul (x, w1)", f"float[16, {weight.shape[0]}] x", {"w1": weight})


def fit_samples(model) -> list:
    """The samples the pass fits on (the same generated feed as ``quantize``'s)."""
    return CalibrationFeed(input_specs(model), None, num_samples=SAMPLES).take(SAMPLES)


def reconstruction_error(model, weight: np.ndarray) -> float:
    """Σ over the fit samples of ‖layer(x, weight) − layer(x, W)‖² (the one-layer model's own W)."""
    original = numpy_helper.to_array(model.graph.initializer[0])
    swapped = onnx.ModelProto()
    swapped.CopyFrom(model)
    swapped.graph.initializer[0].CopyFrom(numpy_helper.from_array(weight.astype(np.float32), "w1"))
    total = 0.0
    for sample in fit_samples(model):
        ref = run_ort(model, sample)[0].astype(np.float64)
        got = run_ort(swapped, sample)[0].astype(np.float64)
        total += float(np.square(got - ref).sum())
    assert original.shape == weight.shape
    return total


def dequantized(codes, scale, axis: int) -> np.ndarray:
    shape = [1] * codes.ndim
    shape[axis] = -1
    return codes.astype(np.float64) * np.asarray(scale, np.float64).reshape(shape)


def both(model, options: str = "target=none,bias_correction=false,smooth=0"):
    nearest, _ = quantize(model, options, samples=SAMPLES)
    learned, entry = quantize(model, options + ",rounding=adaround", samples=SAMPLES)
    return dq_weights(nearest), dq_weights(learned), entry


CASES = {
    "full conv (7-bit)": (lambda: single_conv(w(8, 8, 3, 3, rng=RNG)), 0),
    "depthwise conv (8-bit)": (lambda: single_conv(w(8, 1, 3, 3, rng=RNG), group=8), 0),
    "matmul (uint8, zero point 128)": (lambda: single_matmul(w(32, 8, rng=RNG)), 1),
    "gemm transB": (lambda: build("y = Gemm <transB = 1> (x, w1)", "float[16, 32] x", {"w1": w(8, 32, rng=RNG)}), 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_never_worse_than_nearest_on_the_fit_rows(case):
    make, axis = CASES[case]
    model = make()
    near, learned, entry = both(model)
    (name,) = near
    n_codes, n_scale, n_zero = near[name]
    a_codes, a_scale, a_zero = learned[name]
    assert np.array_equal(n_scale, a_scale)  # the grid's scales kept
    assert (n_zero is None) == (a_zero is None) and (n_zero is None or np.array_equal(n_zero, a_zero))
    assert np.abs(a_codes).max() <= np.abs(n_codes).max()  # within the grid's [−q, q]
    e_near = reconstruction_error(model, dequantized(n_codes, n_scale, axis))
    e_ada = reconstruction_error(model, dequantized(a_codes, a_scale, axis))
    assert e_ada <= e_near * (1 + 1e-6)
    assert e_ada < e_near  # random weights leave something to learn (white inputs: little for 9-tap depthwise)
    assert entry.metrics["adaround_layers"] == 1 and entry.metrics["adaround_error_ratio"] < 1


@pytest.mark.parametrize("case", list(CASES))
def test_codes_are_floor_or_ceil(case):
    make, axis = CASES[case]
    model = make()
    weight = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    _, learned, _ = both(model)
    codes, scale, _ = next(iter(learned.values()))
    ratio = weight / dequantized(np.ones_like(codes), scale, axis)
    assert np.all((codes >= np.floor(ratio - 1e-9)) & (codes <= np.ceil(ratio + 1e-9)))


def test_weight_on_the_grid_stays_exactly():
    codes = RNG.integers(-63, 64, size=(8, 8, 3, 3))
    codes[:, 0, 0, 0] = 63  # each channel's peak is q: scale 0.25 exactly
    weight = (codes * 0.25).astype(np.float32)
    near, learned, entry = both(single_conv(weight))
    (name,) = near
    assert np.array_equal(learned[name][0], codes)
    assert np.array_equal(learned[name][0], near[name][0])
    assert entry.metrics["adaround_channels"] == 0


def test_same_seed_same_bytes():
    model = build("a = Conv <pads = [1, 1, 1, 1]> (x, w1)\nb = Relu (a)\ny = MatMul (b, w2)", "float[1, 8, 8, 8] x",
                  {"w1": w(8, 8, 3, 3, rng=RNG), "w2": w(8, 8, rng=RNG)})
    first, _ = quantize(model, "target=none,rounding=adaround", samples=SAMPLES)
    second, _ = quantize(model, "target=none,rounding=adaround", samples=SAMPLES)
    assert first.SerializeToString() == second.SerializeToString()


def test_bias_correction_reads_the_learned_codes():
    """With the bias correction on, the written weights are still the learned codes (stored
    again under the bias-corrected encoding's key)."""
    model = single_conv(w(8, 8, 3, 3, rng=RNG))
    near, learned, _ = both(model, "target=none,smooth=0")
    (name,) = near
    assert not np.array_equal(near[name][0], learned[name][0])
    _, plain, _ = both(model)
    assert np.array_equal(plain[name][0], learned[name][0])


def test_learn_guard_per_channel():
    """The optimiser's codes are kept per channel only where their error is lower, whatever
    the Gram matrix (here a rank-one one, where most channels cannot gain)."""
    t = RNG.uniform(-5, 5, size=(1, 6, 10))
    x = RNG.standard_normal((1, 10))
    g = (x.T @ x)[None]
    nearest = np.round(t).astype(np.int16)
    codes, changed, ratio = adaround.learn(t, nearest, g, qmax=63, iters=50)
    err = lambda c: np.einsum("gnk,gnk->gn", (c - t) @ g, c - t)  # noqa: E731
    assert np.all(err(codes) <= err(nearest) + 1e-12)
    assert np.all((codes == np.floor(t)) | (codes == np.ceil(t)))
    assert ratio <= 1.0 and 0 <= changed <= 6


def test_a_weight_read_by_several_steps_is_learned_once_and_stays_shared():
    """An unrolled recurrent cell reads one weight in every step, each on its own input: the
    steps get one set of learned codes (one int8 constant, as the float model has one
    weight), fitted to all steps' inputs together — never worse than nearest on their sum."""
    wr, step = w(32, 16, rng=RNG), RNG.uniform(0.1, 3.0, 32).astype(np.float32)  # the second step's inputs differ
    model = build("h2 = Mul (x, step)\na = MatMul (x, wr)\nb = MatMul (h2, wr)\ny = Add (a, b)", "float[16, 32] x",
                  {"step": step, "wr": wr})
    near, learned, entry = both(model)
    assert len(learned) == 2
    (a_codes, a_scale, _), (b_codes, b_scale, _) = learned.values()
    assert np.array_equal(a_codes, b_codes) and np.array_equal(a_scale, b_scale)
    out, _ = quantize(model, "target=none,bias_correction=false,smooth=0,rounding=adaround", samples=SAMPLES)
    assert len([i for i in out.graph.initializer if np.prod(i.dims) == 32 * 16]) == 1
    assert entry.metrics["adaround_layers"] == 2 and entry.metrics["adaround_error_ratio"] < 1
    (n_codes, n_scale, _), _ = near.values()
    x = np.concatenate([s["x"].reshape(-1, 32) for s in fit_samples(model)]).astype(np.float64)
    rows = np.concatenate([x, x * step])  # both steps' inputs
    error = lambda codes: np.sum((rows @ (dequantized(codes, n_scale, 1) - wr)) ** 2)  # noqa: E731
    assert error(a_codes) < error(n_codes)
