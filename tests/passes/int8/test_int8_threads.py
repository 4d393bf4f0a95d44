"""Threads of the ``int8`` pass's runs (:func:`onnxslim_kit.passes.int8.fallback.run_threads`):
every core for large samples, one thread for small ones, the same output either way."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8 import correct, fallback
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline


def conv_head(side: int) -> onnx.ModelProto:
    """x → Conv → Relu → Conv → Sigmoid on a 1×2×side×side input."""
    rng = np.random.default_rng(7)
    text = f"""<ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 2, {side}, {side}] x) => (float[1, 3, {side}, {side}] y) {{
        a = Conv (x, w1, b1)
        r = Relu (a)
        c = Conv (r, w2, b2)
        y = Sigmoid (c)
    }}"""
    model = onnx.parser.parse_model(text)
    inits = {"w1": rng.standard_normal((4, 2, 1, 1)), "b1": rng.standard_normal(4),
             "w2": rng.standard_normal((3, 4, 1, 1)), "b2": rng.standard_normal(3)}
    model.graph.initializer.extend(numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def feed_of(model, side: int, n: int = 8) -> CalibrationFeed:
    rng = np.random.default_rng(0)
    return CalibrationFeed(input_specs(model), [{"x": rng.standard_normal((1, 2, side, side)).astype(np.float32)}
                                                for _ in range(n)])


def test_large_samples_run_on_every_core_small_ones_on_one():
    small = [{"x": np.zeros((1, 2, 8, 8), np.float32)}]
    large = [{"x": np.zeros((1, 2, 384, 384), np.float32)}]  # 1.1 MB > BATCH_BYTES
    assert fallback.run_threads(small) == 1 and fallback.run_threads([]) == 1
    assert fallback.run_threads(large) == 0


@pytest.mark.parametrize("threads", [0, 1])
def test_a_session_on_more_than_one_thread_does_not_spin(threads):
    model = conv_head(8)
    graph = Model.from_proto(model).graph
    session = fallback.SharedWeights(graph).session(model, prepack=False, threads=threads)
    entry = session.get_session_options().get_session_config_entry
    if threads == 1:
        with pytest.raises(Exception):  # noqa: B017 - ORT raises when the key was never set
            entry(fallback.SPIN)
    else:
        assert entry(fallback.SPIN) == "0"


def test_large_samples_give_the_same_model_on_every_core_as_on_one(monkeypatch):
    side = 384
    model = conv_head(side)

    def quantized() -> tuple:
        out, report = run_pipeline(model, parse_pass_list("int8(speed=off,target=cos:0.9999)"), feed_of(model, side))
        entry = report.passes[-1]
        return hashlib.sha256(out.SerializeToString()).hexdigest(), entry.metrics

    every, metrics = quantized()
    assert metrics["fallback_builds"] >= 1  # the search ran (its trials on every core)
    seen = []
    monkeypatch.setattr(fallback, "run_threads", lambda samples: seen.append(len(samples)) or 1)
    monkeypatch.setattr(correct, "run_threads", lambda samples: seen.append(len(samples)) or 1)
    one, metrics_one = quantized()
    assert seen  # the patched choice was read: the runs went on one thread
    assert one == every
    assert {k: v for k, v in metrics_one.items() if not k.startswith("seconds")} == {
        k: v for k, v in metrics.items() if not k.startswith("seconds")}
