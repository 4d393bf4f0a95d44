"""Padding-masked views: outputs over [batch, sequence] judged on the positions the mask marks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxslim_kit.fidelity import Fidelity, find_views, judge, Target

ENCODER = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, sequence, 4] x, int64[batch, sequence] attention_mask) => (float[batch, sequence, 4] tokens,
   float[batch, 4] pooled, float[batch, sequence, 3] probs, int64[batch, sequence] best) {
    tokens = Identity(x)
    pooled = ReduceMean <axes = [1], keepdims = 0> (x)
    logits = Slice(x, start, end, last)
    start = Constant <value = int64[1] {0}> ()
    end = Constant <value = int64[1] {3}> ()
    last = Constant <value = int64[1] {2}> ()
    probs = Softmax <axis = -1> (logits)
    best = ArgMax <axis = 2, keepdims = 0> (x)
}
"""

FIXED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 6, 4] x, int32[1, 6] input_mask, int64[1, 6] other) => (float[1, 6, 4] y, float[1, 1, 4] z) {
    y = Identity(x)
    z = ReduceMean <axes = [1], keepdims = 1> (x)
}
"""


def _views(text: str) -> dict:
    return {v.name: v for v in find_views(onnx.parser.parse_model(text))}


def test_outputs_over_the_mask_axes_get_the_mask():
    views = _views(ENCODER)
    assert views["tokens"].mask == "attention_mask"
    assert views["probs"].mask == "attention_mask" and views["probs"].kind == "probs"  # softmax on the last axis
    assert views["best"].mask == "attention_mask" and views["best"].kind == "exact"
    assert views["pooled"].mask is None  # [batch, 4]: no sequence axis
    assert "attention_mask" in find_views(onnx.parser.parse_model(ENCODER)).runtime_tensors


def test_fixed_shapes_match_by_size_and_only_inputs_named_mask_count():
    views = _views(FIXED)
    assert views["y"].mask == "input_mask"
    assert views["z"].mask is None  # [1, 1, 4]: the sequence axis is not the mask's


def _sample(rng, length: int, real: int) -> dict:
    mask = np.zeros((1, length), np.int64)
    mask[0, :real] = 1
    return {"x": rng.normal(size=(1, length, 4)).astype(np.float32), "attention_mask": mask}


def test_padded_positions_do_not_count_and_real_ones_do():
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(ENCODER)
    samples = [_sample(rng, 8, 3), _sample(rng, 8, 5)]
    fid = Fidelity.build(model, "cos:0.99", samples, "test samples")
    assert [set(r) for r in fid.runtime] == [{"attention_mask"}] * 2
    padded = [{k: v.copy() for k, v in out.items()} for out in fid.reference]
    for out, sample in zip(padded, samples):
        pad = sample["attention_mask"][0] == 0
        out["tokens"][0, pad] = -out["tokens"][0, pad] * 5  # padding moved far: nobody reads it
        out["best"][0, pad] = 99
    verdict = fid.judge(padded)
    scores = {s.view: s for s in verdict.scores}
    assert verdict.used == 0.0 and scores["tokens"].cosine == pytest.approx(1.0)
    assert scores["best"].agreement == 1.0 and scores["tokens"].to_dict()["masked_by"] == "attention_mask"
    real = [{k: v.copy() for k, v in out.items()} for out in fid.reference]
    real[1]["tokens"][0, :5] *= -1  # the real tokens flipped, the padding kept: -1 on the real ones alone
    assert {s.view: s for s in fid.judge(real).scores}["tokens"].cosine == pytest.approx(-1.0)


def test_a_mask_of_another_shape_judges_the_whole_output():
    rng = np.random.default_rng(1)
    model = onnx.parser.parse_model(ENCODER)
    views = find_views(model)
    sample = _sample(rng, 8, 3)
    ref = {"tokens": sample["x"], "pooled": sample["x"].mean(1), "probs": np.full((1, 8, 3), 1 / 3, np.float32),
           "best": np.zeros((1, 8), np.int64)}
    got = {**ref, "tokens": -ref["tokens"]}
    wrong = {"attention_mask": np.ones((1, 5), np.int64)}
    verdict = judge(views, [ref], [got], Target.parse("cos:0.99"), [wrong])
    assert {s.view: s for s in verdict.scores}["tokens"].cosine == pytest.approx(-1.0)
