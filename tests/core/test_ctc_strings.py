"""CTC sequence outputs judged by their decoded strings (``fidelity/strings.py``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxslim_kit.fidelity import Fidelity, find_views
from onnxslim_kit.fidelity.strings import (ctc_layout, decode, estimated_string_agreement, string_margins)

# a recognizer's tail as ddddocr exports it: a projection to 10 classes per step, time-major, unnamed
RECOGNIZER = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 12, 4] x) => (float[12, 1, 10] out387, float[1, 12, 10] hidden) {
    w = Constant <value = float[4, 10] {1,0,0,0,0,0,0,0,0,1, 0,1,0,0,0,0,0,0,1,0, 0,0,1,0,0,0,0,1,0,0,
                                          0,0,0,1,0,0,1,0,0,0}> ()
    b = Constant <value = float[10] {0,0,0,0,0,0,0,0,0,0}> ()
    mm = MatMul(x, w)
    proj = Add(mm, b)
    out387 = Transpose <perm = [1, 0, 2]> (proj)
    hidden = Relu(mm)
}
"""

TOKENS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, sequence, 4] x, int64[batch, sequence] attention_mask) => (float[batch, sequence, 4] logits) {
    w = Constant <value = float[4, 4] {1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1}> ()
    logits = MatMul(x, w)
}
"""

BLANK = 0
PATH = [0, 0, 3, 3, 0, 0, 5, 0, 0, 0, 7, 0]  # reads (3, 5, 7)


def _logits(path: list, classes: int = 10, seed: int = 0) -> np.ndarray:
    """``[T, C]`` logits whose arg-max is ``path``: the winner at 8, the others below 1."""
    rng = np.random.default_rng(seed)
    out = rng.uniform(-1.0, 1.0, (len(path), classes))
    out[np.arange(len(path)), path] = 8.0
    return out


def _time_major(rows: np.ndarray) -> np.ndarray:
    return rows[:, None, :].astype(np.float32)


def test_decode_collapses_repeats_and_drops_blanks():
    assert decode(np.array(PATH), BLANK) == (3, 5, 7)
    assert decode(np.array([3, 0, 3, 3, 0]), BLANK) == (3, 3)
    assert decode(np.array([], np.int64), BLANK) == ()


def test_a_projection_to_classes_and_named_logits_without_a_mask_may_be_ctc():
    views = {v.output: v for v in find_views(onnx.parser.parse_model(RECOGNIZER))}
    assert views["out387"].ctc and views["out387"].kind == "values" and views["out387"].decides
    assert not views["hidden"].ctc  # a Relu is no projection to classes
    tokens = {v.output: v for v in find_views(onnx.parser.parse_model(TOKENS))}
    assert tokens["logits"].kind == "probs" and tokens["logits"].mask == "attention_mask"
    assert not tokens["logits"].ctc  # token-aligned (NER): each token's label is a decision of its own


@pytest.mark.parametrize("layout, axis", [("time-major", 1), ("batch-first", 0)])
def test_the_data_decide_the_batch_axis_and_the_blank(layout, axis):
    rows = _logits(PATH)
    array = _time_major(rows) if layout == "time-major" else rows[None].astype(np.float32)
    assert ctc_layout([array, array]) == (axis, BLANK)


def test_outputs_that_do_not_read_as_ctc_are_left_to_the_other_views():
    rng = np.random.default_rng(1)
    spread = rng.normal(size=(1, 12, 10)).astype(np.float32)  # a language model's or an embedding's arg-max
    assert ctc_layout([spread]) is None
    assert ctc_layout([_logits(PATH)[None, :, :4].astype(np.float32)]) is None  # too few classes
    assert ctc_layout([_logits(PATH)[None].astype(np.float32).reshape(12, 10)]) is None  # 2-D: a batch of rows
    assert ctc_layout([_logits([0, 0, 3])[None].astype(np.float32)]) is None  # too few steps


def test_a_boundary_step_moving_to_its_neighbour_is_no_flip():
    ref = _logits(PATH)
    got = ref.copy()
    got[1, 3] = 9.0  # step 1 now reads 3: (0, 3, 3, 3, …) collapses to the same string
    assert decode(np.argmax(got, 1), BLANK) == decode(np.argmax(ref, 1), BLANK)
    margin, shift = string_margins(ref, ref, BLANK)
    assert margin.size == len(PATH) and np.all(shift == 0)
    # step 1's rival is a class that would change the string, not its neighbour 3
    m1 = margin[1]
    assert m1 == pytest.approx(8.0 - max(ref[1, c] for c in range(10) if c not in (0, 3)))


def test_strings_agree_where_rows_flip_and_disagree_where_the_cosine_holds():
    model = onnx.parser.parse_model(RECOGNIZER)
    ref = _logits(PATH)
    ref[6, 4] = 7.9  # a close rival to the 5 step 6 reads
    harmless = ref.copy()
    harmless[1, 3] = 9.0  # one of 12 rows flips, the string holds
    changed = ref.copy()
    changed[6, 4] = 8.1  # 5 → 4: the string changes, the cosine barely moves
    reference = [{"out387": _time_major(ref), "hidden": np.zeros((1, 12, 10), np.float32)}]
    fid = Fidelity.build(model, "cos:0.99", [{}], reference=reference)
    for got, agree in ((harmless, 1.0), (changed, 0.0)):
        verdict = fid.judge([{"out387": _time_major(got), "hidden": reference[0]["hidden"]}])
        (score,) = [s for s in verdict.scores if s.view == "out387"]
        assert score.kind == "ctc" and score.observed == agree
        if agree == 0.0:
            assert score.cosine > 0.99 and not fid.met(verdict) and "out387 agreement 0.0000" in verdict.binding
            assert score.margin_shift == pytest.approx(0.2, abs=1e-5) and score.min_margin == pytest.approx(0.1, abs=1e-5)


def test_the_estimate_sees_a_close_string_the_judged_ones_keep():
    near = _logits(PATH, seed=2)
    near[6, 4] = 7.9  # a close rival: 0.1 below the 5 it reads
    strings = [string_margins(_logits(PATH, seed=s), _logits(PATH, seed=s), BLANK)[0] for s in range(3)]
    judged = np.concatenate(strings)
    assert estimated_string_agreement(strings, judged, np.zeros(36)) == 1.0  # nothing moved: the lossless limit
    moved = np.full(36, 0.3)  # every step's margin moved by 0.3
    assert estimated_string_agreement(strings, judged, moved) == 1.0  # far margins stay
    close = strings + [string_margins(near, near, BLANK)[0]]
    assert estimated_string_agreement(close, judged, moved) == pytest.approx(0.75)  # the close string flips


def test_a_shift_is_paired_with_margins_of_its_own_size():
    """Raw logits move in proportion to their size: large shifts on far steps say nothing about
    a close step, small shifts on close steps do."""
    rng = np.random.default_rng(3)
    far = rng.uniform(10.0, 20.0, 200)  # blank steps, 10–20 nats clear
    close = rng.uniform(0.5, 1.0, 200)
    margins = np.concatenate([far, close])
    shifts = np.concatenate([0.4 * far, np.full(200, 0.05)])  # far steps move by 4–8 nats, close ones by 0.05
    strings = [np.array([15.0, 0.6, 12.0])] * 4
    assert estimated_string_agreement(strings, margins, shifts) == 1.0
    shaky = np.concatenate([0.4 * far, np.full(200, 0.7)])  # the close steps' own moves reach their margins
    assert estimated_string_agreement(strings, margins, shaky) < 0.9


def test_only_a_margin_the_candidate_closes_can_flip():
    ref = _logits(PATH)
    ref[6, 4] = 7.9  # a close rival
    wider = ref.copy()
    wider[6, 4] = 7.0  # the close rival falls back: that margin widens by 0.9
    margin, shift = string_margins(ref, wider, BLANK)
    assert shift.min() == pytest.approx(-0.9, abs=1e-6) and shift.max() == 0.0
    closer = ref.copy()
    closer[6, 4] = 7.95
    assert string_margins(ref, closer, BLANK)[1].max() == pytest.approx(0.05, abs=1e-6)
    strings = [margin, margin]
    assert estimated_string_agreement(strings, margin, -np.abs(shift) - 1.0) == 1.0  # every margin widened


def test_the_fit_samples_pool_bounds_the_string_agreement():
    model = onnx.parser.parse_model(RECOGNIZER)
    ref = _logits(PATH)
    got = ref + 0.3 * (ref < 8.0)  # every runner-up gains 0.3: no string here changes
    near = _logits(PATH, seed=2)
    near[6, 4] = 7.9
    reference = [{"out387": _time_major(ref)}]
    fid = Fidelity.build(model, "cos:0.99", [{}], reference=reference)
    from onnxslim_kit.fidelity.judge import reference_margins

    pool = reference_margins(fid.views, [{"out387": _time_major(near)}], None)
    assert isinstance(pool["out387"], list) and len(pool["out387"]) == 1
    alone = fid.judge([{"out387": _time_major(got)}])
    fid._pool = pool
    pooled = fid.judge([{"out387": _time_major(got)}])
    score = lambda v: next(s for s in v.scores if s.view == "out387")  # noqa: E731
    assert score(alone).observed == score(pooled).observed == 1.0
    assert score(alone).agreement == 1.0 and score(pooled).agreement == pytest.approx(0.5)


SOFTMAX_REC = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 12, 10] x) => (float[1, 12, 10] probs) {
    probs = Softmax <axis = 2> (x)
}
"""


def test_a_softmax_over_the_classes_of_a_3d_output_is_judged_by_its_strings():
    model = onnx.parser.parse_model(SOFTMAX_REC)
    (view,) = find_views(model)
    assert view.kind == "probs" and view.ctc and not view.logits
    ref = _logits(PATH)
    ref[6, 4] = 7.9
    got = ref.copy()
    got[1, 3] = 9.0  # a boundary row flips: the string holds
    softmax = lambda z: (np.exp(z - z.max(1, keepdims=True)) / np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))[None].astype(np.float32)  # noqa: E731
    fid = Fidelity.build(model, "cos:0.99", [{}], reference=[{"probs": softmax(ref)}])
    (score,) = fid.judge([{"probs": softmax(got)}]).scores
    assert score.kind == "ctc" and score.observed == 1.0
    # margins read from the log-probabilities: the logits' differences
    assert score.min_margin == pytest.approx(0.1, abs=1e-4)
