"""The int8 search's trials on ORT's own kernels where runs dominate (large samples,
``passes/int8/kernels.py``: :func:`trials_on_kernels`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8 import fallback
from onnxslim_kit.runtime import make_session, run

from test_int8_fidelity import quantize, yolo_head


def _dequantized_matmul() -> onnx.ModelProto:
    """y = x · DequantizeLinear(w_q): a weight ORT's constant folding computes at load."""
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 64] x) => (float[2, 128] y) {
        w = DequantizeLinear (wq, ws, wz)
        f = Cast <to = 1> (wq)
        v = Mul (f, ws)
        a = MatMul (x, w)
        b = MatMul (x, v)
        y = Add (a, b)
    }"""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    inits = {"wq": rng.integers(-127, 128, (64, 128)).astype(np.int8), "ws": np.float32(0.02),
             "wz": np.int8(0)}
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("level", ["disable", "all"])
def test_a_shared_weights_session_computes_with_the_weights_themselves(level):
    """With optimizations on, ORT folds constant-only nodes at load from the proto's bytes: the
    placeholders must carry the weights then, not stand-ins (zeros gave garbage)."""
    proto = _dequantized_matmul()
    model = Model.from_proto(proto)
    shared = fallback.SharedWeights(model.graph)
    trial = Model.from_proto(proto)
    shared.strip(trial.graph)
    session = shared.session(trial.to_proto(), prepack=False, threads=1, opt_level=level)
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    expected = run(make_session(proto, level, prepack=False), x)["y"]
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(run(session, x)["y"], expected, rtol=1e-5, atol=1e-5)


def test_trials_on_large_samples_run_the_kernels_and_the_pass_reports_their_figure(monkeypatch):
    monkeypatch.setattr(fallback, "BATCH_BYTES", 0)  # every sample counts as large
    made = []
    real = fallback.SharedWeights.session

    def session(self, proto, prepack=True, threads=1, opt_level="disable"):
        made.append(opt_level)
        return real(self, proto, prepack, threads, opt_level)

    monkeypatch.setattr(fallback.SharedWeights, "session", session)
    _, entry = quantize(yolo_head())
    assert "all" in made  # the trials (the gated ranking's one session stays emulated)
    assert any("the search's trials ran them" in note for note in entry.notes)
    assert entry.metrics["budget_used_kernels"] == pytest.approx(entry.fidelity["used"], abs=1e-3)
