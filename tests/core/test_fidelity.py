"""The fidelity contract: target syntax and budget, views found from the graph, the judge, the split."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from onnxslim_kit.errors import UserError
from onnxslim_kit.fidelity import Fidelity, Target, find_views, judge, share, split_feed
from onnxslim_kit.fidelity.context import FeedPart, held_out

YOLO = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 16] reg, float[1, 3, 16] logit) => (float[1, 16, 7] out) {
    scale = Constant <value = float {100.0}> ()
    box = Mul(reg, scale)
    cls = Sigmoid(logit)
    cat = Concat <axis = 1> (box, cls)
    out = Transpose <perm = [0, 2, 1]> (cat)
}
"""

SOFTMAX_ROWS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 6] x) => (float[1, 6] probs, int64[1, 1] top) {
    shape = Constant <value = int64[3] {1, 2, 3}> ()
    flat = Constant <value = int64[2] {1, 6}> ()
    rows = Reshape(x, shape)
    soft = Softmax <axis = -1> (rows)
    probs = Reshape(soft, flat)
    top = ArgMax <axis = 1> (x)
}
"""


def _model(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


@pytest.mark.parametrize("text, metric, value", [
    ("cos:0.99", "cos", 0.99), ("top1:0.98", "top1", 0.98), ("rel:1e-3", "rel", 1e-3), ("none", "none", 0.0),
    ("0.995", "cos", 0.995), (" COS:0.9 ", "cos", 0.9), ("off", "none", 0.0), ("0", "none", 0.0),
    ("0.0", "none", 0.0),
])
def test_target_syntax(text, metric, value):
    target = Target.parse(text)
    assert (target.metric, target.value) == (metric, pytest.approx(value))
    assert Target.parse(str(target)) == target


@pytest.mark.parametrize("text", ["cos", "cos:1.01", "cos:0", "top1:1.5", "rel:0", "rel:-1", "psnr:30", "cos:x",
                                  "cos:nan"])
def test_target_refused_with_one_line(text):
    with pytest.raises(UserError) as info:
        Target.parse(text, "--target")
    assert "\n" not in str(info.value) and "--target" in str(info.value)


def test_budget_fraction_and_share():
    target = Target.parse("cos:0.99")
    assert target.used({"cos": 0.005}) == pytest.approx(0.5)
    assert target.used({"cos": 0.001, "decision": 0.02}) == pytest.approx(2.0)  # decisions bind too
    assert Target.parse("top1:0.9").used({"cos": 0.5, "decision": 0.05}) == pytest.approx(0.5)
    assert Target.parse("rel:0.1").used({"rel": 0.05}) == pytest.approx(0.5)
    assert Target.parse("none").used({"cos": 1.0}) == 0.0
    assert Target.parse("cos:1").used({"cos": 0.0}) == 0.0 and Target.parse("cos:1").used({"cos": 1e-9}) == math.inf
    # three lossy passes: a third each, the last takes what is left
    assert share(0.0, 3) == pytest.approx(1 / 3)
    assert share(0.5, 2) == pytest.approx(0.75)
    assert share(0.2, 1) == pytest.approx(1.0)
    assert share(1.5, 1) == pytest.approx(1.5)


def test_yolo_head_split_into_boxes_and_scores():
    views = find_views(_model(YOLO))
    assert [(v.name, v.kind) for v in views] == [("out[values]", "values"), ("out[scores]", "scores")]
    assert set(views.runtime_tensors) == {"box", "cls"}


def _yolo_outputs(rng, scores_noise: float):
    reg = rng.uniform(1, 6, (1, 4, 16)).astype(np.float32)
    logit = rng.normal(0, 2, (1, 3, 16)).astype(np.float32)
    box, cls = reg * 100, 1 / (1 + np.exp(-logit))
    ref = np.concatenate([box, cls], 1).transpose(0, 2, 1)
    noisy = np.clip(cls + rng.normal(0, scores_noise, cls.shape), 0, 1).astype(np.float32)
    got = np.concatenate([box, noisy], 1).transpose(0, 2, 1)
    return {"out": ref}, {"out": got}, {"box": box, "cls": cls}


def test_whole_output_cosine_holds_while_the_scores_view_does_not():
    rng = np.random.default_rng(0)
    ref, got, runtime = _yolo_outputs(rng, 0.3)
    whole = float(np.dot(ref["out"].ravel(), got["out"].ravel())
                  / np.linalg.norm(ref["out"]) / np.linalg.norm(got["out"]))
    assert whole > 0.999  # what a whole-output cosine would say
    verdict = judge(find_views(_model(YOLO)), [ref], [got], Target.parse("cos:0.99"), [runtime])
    scores = {s.view: s for s in verdict.scores}
    assert scores["out[values]"].cosine == pytest.approx(1.0)
    assert scores["out[scores]"].cosine < 0.95
    assert scores["out[scores]"].agreement < 0.99
    assert not verdict.met() and verdict.binding.startswith("out[scores]")


def test_identical_outputs_meet_any_target():
    rng = np.random.default_rng(1)
    ref, _, runtime = _yolo_outputs(rng, 0.0)
    for text in ("cos:0.999", "top1:0.999", "rel:1e-6"):
        verdict = judge(find_views(_model(YOLO)), [ref], [ref], Target.parse(text), [runtime])
        assert verdict.used == 0.0 and verdict.met()


def test_softmax_rows_through_a_reshape_and_an_integer_output():
    views = find_views(_model(SOFTMAX_ROWS))
    assert [(v.name, v.kind) for v in views] == [("probs", "probs"), ("top", "exact")]
    soft = np.array([[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]], np.float32)
    ref = {"probs": soft.reshape(1, 6), "top": np.array([[0]])}
    flipped = soft.copy()
    flipped[0, 1] = [0.1, 0.6, 0.3]  # the second row's decision changes, the first keeps its own
    got = {"probs": flipped.reshape(1, 6), "top": np.array([[1]])}
    verdict = judge(views, [ref], [got], Target.parse("top1:0.9"), [{"soft": soft}])
    by = {s.view: s for s in verdict.scores}
    assert by["probs"].agreement == pytest.approx(0.5)  # one of two rows (not one of one flat argmax)
    assert by["top"].agreement == 0.0
    assert math.isclose(verdict.used, 1.0 / 0.1)


def test_a_map_of_softmax_rows_counts_the_foreground_only():
    from onnxslim_kit.fidelity.judge import FOREGROUND_MIN_ROWS, _foreground

    def _foreground_agreement(a, b):
        keep = _foreground(a, b)
        return int(np.sum(a[keep] == b[keep])), int(keep.sum())

    a = np.zeros(100, np.int64)
    a[:10] = 1  # ten face pixels among ninety background ones
    b = a.copy()
    b[:3] = 0  # three of them lost
    assert _foreground_agreement(a, b) == (7, 10)  # not 97 of 100
    small = np.array([0, 2]), np.array([0, 1])
    assert FOREGROUND_MIN_ROWS > 2 and _foreground_agreement(*small) == (1, 2)


def test_nonfinite_mismatch_is_the_worst():
    views = find_views(_model(SOFTMAX_ROWS))
    ref = {"probs": np.full((1, 6), 1 / 6, np.float32), "top": np.array([[0]])}
    got = {"probs": np.array([[np.nan] * 6], np.float32), "top": np.array([[0]])}
    soft = np.full((1, 2, 3), 1 / 3, np.float32)
    verdict = judge(views, [ref], [got], Target.parse("cos:0.99"), [{"soft": soft}])
    assert {s.view: s for s in verdict.scores}["probs"].cosine == 0.0 and not verdict.met()


class _Feed:
    generated = False

    def __init__(self, n):
        self.samples = [{"x": np.full((1,), i, np.float32)} for i in range(n)]

    def __iter__(self):
        return iter(self.samples)

    def take(self, n):
        return self.samples[:n]

    def count(self):
        return len(self.samples)


def test_split_holds_out_one_in_four_deterministically():
    fit, judged, what, warning = split_feed(_Feed(32))
    judged_at = [int(s["x"][0]) for s in judged]
    assert [i // 4 for i in judged_at] == list(range(8))  # one in each block of four
    assert judged_at == [i for i in range(32) if held_out(i)] == [int(s["x"][0]) for s in split_feed(_Feed(32))[1]]
    assert [int(s["x"][0]) for s in fit] == [i for i in range(32) if not held_out(i)]
    assert fit.count() == 24 and "held-out" in what and warning is None
    _, judged, _, warning = split_feed(_Feed(12))
    assert len(judged) == 3 and "only 3 held-out" in warning
    fit, judged, _, warning = split_feed(_Feed(2))
    assert len(judged) == 2 and fit.count() == 2 and "cannot be split" in warning


def test_split_meets_a_periodic_feed_at_more_than_one_phase():
    # classes in turn (upright / rotated; four orientations): a fixed position in each block
    # would judge one class only
    judged_at = [int(s["x"][0]) for s in split_feed(_Feed(32))[1]]
    assert {i % 2 for i in judged_at} == {0, 1}
    assert len({i % 4 for i in judged_at}) >= 3


def test_feed_part_delegates_the_feed_attributes():
    feed = _Feed(8)
    part = FeedPart(feed, lambda i: i < 2)
    assert part.generated is False and part.count() == 2 and len(part.take(5)) == 2


def test_fidelity_computes_the_reference_with_the_tail_tensors():
    rng = np.random.default_rng(2)
    samples = [{"reg": rng.normal(size=(1, 4, 16)).astype(np.float32),
                "logit": rng.normal(size=(1, 3, 16)).astype(np.float32)} for _ in range(2)]
    fid = Fidelity.build(_model(YOLO), "cos:0.99", samples, "test samples")
    assert set(fid.runtime[0]) == {"box", "cls"} and set(fid.reference[0]) == {"out"}
    same = fid.judge(fid.reference)
    assert same.used == 0.0 and fid.met(same)
    half = fid.for_pass(remaining=2)
    assert half.allowed == pytest.approx(0.5) and "50% of the cos:0.99 budget" in half.describe()
    own = fid.for_pass("top1:0.9", remaining=2)
    assert own.target == Target.parse("top1:0.9") and own.allowed == 1.0


def test_widened_fidelity_sees_a_failure_the_judged_samples_miss():
    rng = np.random.default_rng(3)
    samples = [{"reg": rng.normal(size=(1, 4, 16)).astype(np.float32),
                "logit": rng.normal(size=(1, 3, 16)).astype(np.float32)} for _ in range(4)]
    fid = Fidelity.build(_model(YOLO), "cos:0.99", samples[:2], "held-out samples")
    wide = fid.widened(samples[2:], "spare samples")
    assert len(wide.samples) == 4 and len(wide.reference) == 4 and len(wide.runtime) == 4
    assert wide.judged_on == "samples: 2 held-out samples and 2 spare samples"
    assert fid.widened([], "spare samples") is fid and len(fid.samples) == 2  # the original is left alone
    candidate = [dict(r) for r in wide.reference]
    candidate[3] = {"out": candidate[3]["out"] * np.array([1, 1, 1, 1, -1, 1, 1], np.float32)}  # one score flips
    assert fid.met(fid.judge(candidate[:2]))
    verdict = wide.judge(candidate)
    assert not wide.met(verdict) and verdict.samples == 4 and "out[scores]" in verdict.binding


def test_pass_hook_writes_every_off_spelling_as_none():
    from onnxslim_kit.fidelity import check_target

    assert [check_target(t, "p(target=...)") for t in ("off", "0", " 0.0 ", "NONE", "", "cos:0.99", "0.995")] == [
        "none", "none", "none", "none", "", "cos:0.99", "0.995"]


LOGITS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 8] x) => (float[4, 3] logits, float[4, 3] features) {
    w = Constant <value = float[8, 3] {1,0,0, 0,1,0, 0,0,1, 1,1,0, 0,1,1, 1,0,1, 0,0,0, 1,1,1}> ()
    logits = MatMul(x, w)
    features = MatMul(x, w)
}
"""


@pytest.mark.parametrize("name, expected", [("logits", True), ("start_logits", True), ("END_LOGITS", True),
                                            ("logit_scale", False), ("features", False)])
def test_an_output_named_logits_is_a_decision(name, expected):
    from onnxslim_kit.fidelity.views import names_logits

    assert names_logits(name) is expected


def test_raw_logits_are_judged_by_their_arg_max_and_their_margins():
    views = {v.output: v for v in find_views(_model(LOGITS))}
    assert views["logits"].kind == "probs" and views["logits"].logits and views["logits"].axis == -1
    assert views["features"].kind == "values" and not views["features"].logits
    softmaxed = LOGITS.replace("logits = MatMul(x, w)", "z = MatMul(x, w)\n    logits = Softmax(z)")
    behind_softmax = find_views(_model(softmaxed))
    assert [(v.kind, v.logits) for v in behind_softmax if v.output == "logits"] == [("probs", False)]
    reference = [{"logits": np.array([[5.0, 4.9, 1.0], [3.0, 0.0, 0.0], [0.0, 2.0, 9.0], [1.0, 7.0, 2.0]],
                                     np.float32)}]
    reference[0]["features"] = reference[0]["logits"]
    candidate = [{"logits": reference[0]["logits"] + np.array([[-0.2, 0.0, 0.0]] + [[0.0] * 3] * 3, np.float32),
                  "features": reference[0]["logits"]}]
    fid = Fidelity.build(_model(LOGITS), "cos:0.99", [{}], reference=reference)
    verdict = fid.judge(candidate)
    (score,) = [s for s in verdict.scores if s.view == "logits"]
    assert score.cosine > 0.999 and score.observed == pytest.approx(0.75)  # one row of four flipped
    # margins of the logits as they are: 5.0 − 4.9, not log 5.0 − log 4.9
    assert score.min_margin == pytest.approx(0.1, abs=1e-5) and score.margin_shift == pytest.approx(0.2, abs=1e-5)
    assert not fid.met(verdict) and "logits agreement" in verdict.binding


def test_the_drift_scores_are_the_judges_cosines_and_errors():
    """A trial's bound after each sample reads :func:`drift_scores`: the same figures as the
    full judge, per view (a branch of a concatenated head included)."""
    from onnxslim_kit.fidelity.judge import drift_scores

    rng = np.random.default_rng(1)
    views = find_views(_model(YOLO))
    samples = [_yolo_outputs(rng, 0.2) for _ in range(3)]
    refs, gots, runtimes = ([s[k] for s in samples] for k in range(3))
    gots[1] = {}  # a sample without the output: the worst
    verdict = judge(views, refs, gots, Target.parse("cos:0.99"), runtimes)
    drift = drift_scores(views, refs, gots, runtimes)
    assert [(d.view, d.cosine, d.rel) for d in drift] == [(s.view, s.cosine, s.rel) for s in verdict.scores]
    assert drift[0].cosine == 0.0 and drift[0].rel == math.inf
    one = drift_scores(views, refs[:1], gots[:1], runtimes[:1])
    assert one[1].cosine < 0.99 and one[0].cosine == pytest.approx(1.0)
    short = drift_scores(views, refs[:1], [{"out": gots[0]["out"][:, :8]}], runtimes[:1])
    assert [(d.cosine, d.rel) for d in short] == [(0.0, math.inf)] * 2  # another shape: the worst
