"""Shared fixtures: tiny models from ONNX text, ORT comparison helpers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest


def parse(text: str) -> onnx.ModelProto:
    """A model from ONNX text (``onnx.parser``), checked."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def run_ort(model: onnx.ModelProto, feeds: dict) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict, rtol=1e-5, atol=1e-5):
    for x, y in zip(run_ort(a, feeds), run_ort(b, feeds)):
        np.testing.assert_allclose(y, x, rtol=rtol, atol=atol)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict:
    from onnxslim_kit.calibration import CalibrationFeed, input_specs

    return CalibrationFeed(input_specs(model), None, seed=seed).take(1)[0]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def nodes_counting_prelu_once(proto) -> int:
    """Node count of a fused model with each PRelu that ``fuse`` rewrote (1 → 1, 2 or 4 nodes
    named ``prelu/…``, the last a LeakyRelu, Max or Add) counted as the one node it was."""
    names = [n.name.split("__")[0] for n in proto.graph.node]
    return sum(not n.startswith("prelu/") for n in names) + sum(
        n in ("prelu/LeakyRelu", "prelu/Max", "prelu/Add") for n in names)
