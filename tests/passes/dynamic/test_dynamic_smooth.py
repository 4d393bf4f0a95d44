"""``dynamic``'s SmoothQuant (``smooth``: auto by measured fidelity, a fixed α, or off) and its
weight encodings (``weights=u8`` exact everywhere, ``s8`` for ORT's u8·s8 kernels)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from test_int8 import build, ops, optimized_ops

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import cosine
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline
from onnxslim_kit.runtime import make_session

RNG = np.random.default_rng(11)
OUTLIER = 60.0  # the scale of 2 of 64 input channels: most of the run-time range goes to them


def outlier_mlp():
    rng = np.random.default_rng(5)
    return build("h = MatMul (x, w1)\nr = Relu (h)\ny = MatMul (r, w2)", "float[16, 64] x",
                 {"w1": (rng.standard_normal((64, 64)) * 0.2).astype(np.float32),
                  "w2": (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)})


def samples(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((16, 64)).astype(np.float32)
        x[:, :2] *= OUTLIER
        out.append({"x": x})
    return out


def dynamic(model, options: str = "", data=None):
    feed = CalibrationFeed(input_specs(model), data, num_samples=2)
    out, report = run_pipeline(model, parse_pass_list(f"dynamic({options})" if options else "dynamic"), feed)
    return out, report.passes[-1]


def worst_cosine(model, out, feeds) -> float:
    ref, got = make_session(model, threads=1), make_session(out, "all", threads=1)
    return min(cosine(ref.run(None, f)[0], got.run(None, f)[0]) for f in feeds)


def test_auto_smoothing_picks_an_alpha_that_beats_none_on_held_out_samples():
    model, data, unseen = outlier_mlp(), samples(16), samples(8, seed=9)
    plain, _ = dynamic(model, "smooth=0", data)
    smoothed, rep = dynamic(model, "", data)
    assert rep.metrics["smooth_alpha"] > 0 and set(rep.metrics["smooth_trials"]) == {"0.0", "0.5", "0.7", "0.85"}
    trials = rep.metrics["smooth_trials"]
    assert trials[str(rep.metrics["smooth_alpha"])] == min(trials.values())
    assert rep.rewrites["smoothed activation"] == 2 and ops(smoothed)["Mul"] > ops(plain)["Mul"]
    assert worst_cosine(model, smoothed, unseen) > worst_cosine(model, plain, unseen)
    again, _ = dynamic(model, "", data)
    assert again.SerializeToString() == smoothed.SerializeToString()  # deterministic


def test_a_fixed_alpha_smooths_without_a_search_and_zero_is_off():
    model, data = outlier_mlp(), samples(8)
    out, rep = dynamic(model, "smooth=0.5", data)
    assert "smooth_trials" not in rep.metrics and rep.rewrites["smoothed activation"] == 2
    off, rep = dynamic(model, "smooth=0", data)
    assert "smoothed activation" not in rep.rewrites and not any(n.op_type == "Mul" and "smooth" in n.name
                                                                 for n in off.graph.node)


def test_generated_samples_are_not_smoothed_and_say_why():
    out, rep = dynamic(outlier_mlp())
    assert "smoothed activation" not in rep.rewrites
    assert any("generated random samples" in note for note in rep.notes)


@pytest.mark.parametrize("text", ["1.0", "-0.1", "lots"])
def test_a_bad_alpha_is_a_one_line_error(text):
    with pytest.raises(UserError) as info:
        dynamic(outlier_mlp(), f"smooth={text}")
    assert "\n" not in str(info.value) and "smooth" in str(info.value)


def test_s8_weights_keep_the_int8_codes_and_fuse(tmp_path):
    model, data = outlier_mlp(), samples(8)
    u8, _ = dynamic(model, "smooth=0", data)
    s8, _ = dynamic(model, "smooth=0,weights=s8", data)
    kinds = {name: {numpy_helper.to_array(t).dtype for t in m.graph.initializer if "w_q" in t.name}
             for name, m in (("u8", u8), ("s8", s8))}
    assert kinds == {"u8": {np.dtype(np.uint8)}, "s8": {np.dtype(np.int8)}}
    codes = {name: [numpy_helper.to_array(t).astype(np.int16) for t in m.graph.initializer if "w_q" in t.name]
             for name, m in (("u8", u8), ("s8", s8))}
    assert all(np.array_equal(a - 128, b) for a, b in zip(codes["u8"], codes["s8"]))  # the same grid
    assert optimized_ops(s8, tmp_path)["DynamicQuantizeMatMul"] == 2
