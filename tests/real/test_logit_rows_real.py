"""A real classifier exported without its Softmax is judged by its decisions (issue 18).

The orientation classifier (PP-LCNet, 4 classes) ends in ``MatMul → Add → Identity → Softmax``;
cut before the Softmax it is what a user gets from an export without one: ``[N, 4]`` raw
logits under a name that says nothing (``p2o.pd_op.add.4.0``). MTCNN O-Net's box and landmark
regressions (``dense_5``, ``dense_6``: ``MatMul + Add`` as well) must stay judged by value.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

import onnxslim_kit
from onnxslim_kit.zoo import fetch

pytestmark = pytest.mark.realmodel
ROOT = Path(__file__).resolve().parents[2]


def _samples(name: str, n: int) -> list:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import inputs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return inputs.BUILDERS[name](name, Path(fetch(name)), "calib", n, 0)[0]


def _without_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    model.graph.node.remove(softmax)
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info(softmax.input[0], onnx.TensorProto.FLOAT,
                                                                 ["batch", 4]))
    return model


def _views(report) -> dict:
    fidelity = report.passes[-1].fidelity
    return {view["view"]: view for view in fidelity["views"]}


def test_raw_logits_of_a_real_classifier_are_judged_by_their_decisions():
    model = _without_softmax(onnx.load(str(fetch("orientation"))))
    _, report = onnxslim_kit.optimize(model, "fuse,int8(speed=off,target=none)", calib=_samples("orientation", 16))
    view = _views(report)["p2o.pd_op.add.4.0"]
    assert view["kind"] == "probs" and "agreement" in view and "min_margin" in view


def test_real_regression_heads_stay_values():
    _, report = onnxslim_kit.optimize(str(fetch("mtcnn_onet")), "fuse,int8(speed=off,target=none)",
                                      calib=_samples("mtcnn_onet", 16))
    views = _views(report)
    assert views["dense_5"]["kind"] == "values" and views["dense_6"]["kind"] == "values"
    assert views["softmax_2"]["kind"] == "probs"
