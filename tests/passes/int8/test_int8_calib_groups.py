"""The int8 pass's calibration and bias-correction runs cut into groups of at most
``CALIB_RUN_BYTES`` of activations (:mod:`onnxslim_kit.passes.int8.calib_groups`): the same
numbers as one run, less held at once."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_ort
from onnx import numpy_helper

from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8 import calib_groups, correct
from onnxslim_kit.passes.int8.calib_groups import calibration_groups, tensor_bytes

from test_int8 import conv_chain, quantize


def values(model) -> list:
    return sorted(numpy_helper.to_array(t).tobytes() for t in model.graph.initializer)


def test_groups_keep_graph_order_and_the_budget(monkeypatch):
    model = Model.from_proto(conv_chain())
    sample = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    names = ["y", "x", "r1", "c1", "r2"]
    sizes = tensor_bytes(model, names, sample)
    assert sizes["c1"] == 4 * 8 * 16 * 16 and sizes["x"] == 4 * 3 * 16 * 16
    assert calibration_groups(model, names, sample) == [names]  # all fit: one run, as before
    monkeypatch.setattr(calib_groups, "CALIB_RUN_BYTES", 2 * sizes["c1"])
    groups = calibration_groups(model, names, sample)
    assert [n for g in groups for n in g] == ["x", "c1", "r1", "r2", "y"]  # graph order
    assert all(sum(sizes[n] for n in g) <= 2 * sizes["c1"] for g in groups) and len(groups) == 3


@pytest.mark.parametrize("options", ["target=none", "target=cos:0.99"])
def test_one_tensor_a_run_gives_the_same_numbers(monkeypatch, options):
    model = conv_chain()
    whole, rep = quantize(model, options)
    monkeypatch.setattr(calib_groups, "CALIB_RUN_BYTES", 1)  # every tensor, every twin pair, a run of its own
    monkeypatch.setattr(correct, "CALIB_RUN_BYTES", 1)
    cut, cut_rep = quantize(model, options)
    assert values(cut) == values(whole) and rep.metrics["layers_int8"] == cut_rep.metrics["layers_int8"]
    x = {"x": np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert np.array_equal(run_ort(cut, x)[0], run_ort(whole, x)[0])
