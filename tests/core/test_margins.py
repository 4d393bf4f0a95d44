"""The margin estimate of decision agreement (onnxslim_kit.fidelity.margins) and its use by judge."""

import numpy as np
import pytest

from onnxslim_kit.fidelity.judge import judge
from onnxslim_kit.fidelity.margins import NEAREST, estimated_agreement, log_probs, margins_and_shifts, overturn_rates
from onnxslim_kit.fidelity.target import Target
from onnxslim_kit.fidelity.views import View, Views


def _softmax(logits):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def _two_class(margins):
    """Softmax rows [p0, p1] whose top-vs-rival log-odds are ``margins`` (class 0 on top)."""
    return _softmax(np.stack([np.asarray(margins, np.float64), np.zeros(len(margins))], axis=-1))


def test_margins_and_shifts_read_log_odds():
    ref = _two_class([3.0, 0.5])
    got = _two_class([2.0, 0.75])
    margin, shift = margins_and_shifts(ref, got)
    assert margin == pytest.approx([3.0, 0.5], abs=1e-5)
    assert shift == pytest.approx([1.0, -0.25], abs=1e-5)  # signed: the first closed, the second widened
    logs = np.log(ref.astype(np.float64))
    assert margins_and_shifts(logs, np.log(got.astype(np.float64)))[0] == pytest.approx(margin, abs=1e-6)
    assert np.array_equal(log_probs(logs), logs)  # LogSoftmax outputs are taken as they are


def test_exact_outputs_estimate_full_agreement():
    ref = _two_class(np.linspace(0.01, 5.0, 40))
    margin, shift = margins_and_shifts(ref, ref.copy())
    assert estimated_agreement(margin, margin, shift) == 1.0
    assert estimated_agreement(np.zeros(0), np.zeros(0), np.zeros(0)) == 1.0


def test_estimate_counts_closing_margin_pairs():
    margins = np.array([0.05, 2.0, 4.0, 6.0])
    closings = np.array([1.0, 1.0, 3.0, 0.0])  # exceed 1, 1, 2, 0 of the margins
    assert estimated_agreement(margins, margins, closings) == pytest.approx(1.0 - 4 / 16)


def test_a_widened_margin_is_no_threat():
    margins = np.array([0.05, 2.0, 4.0, 6.0])
    assert estimated_agreement(margins, margins, -np.array([1.0, 1.0, 3.0, 0.5])) == 1.0
    ref = _two_class([3.0, 0.5, 0.05])
    margin, closing = margins_and_shifts(ref, _two_class([5.0, 2.5, 2.05]))  # every margin widened by 2
    assert closing == pytest.approx([-2.0] * 3, abs=1e-4) and estimated_agreement(margin, margin, closing) == 1.0


def test_a_margin_meets_the_closings_of_rows_its_own_size():
    # 200 rows, margins 0.01…20 nats, each closed by 5 % of its own size: none flips. Paired
    # with every closing, the 1-nat closings of the sure rows would overturn every close row;
    # paired with the 64 rows nearest its size (a span of 11× here), it meets closings below it.
    margins = np.geomspace(0.01, 20.0, 200)
    closings = 0.05 * margins
    assert np.all(overturn_rates(margins, margins, closings) == 0.0)
    assert estimated_agreement(margins, margins, closings) == 1.0
    assert np.mean(closings[:, None] > margins[None, :]) > 0.15  # what every-with-every pairing counts
    shaken = closings.copy()
    shaken[:20] = 1.0  # the closest rows closed past their margins: their neighbours are at risk
    assert overturn_rates([0.02], margins, shaken)[0] > 0.2
    assert overturn_rates([15.0], margins, shaken)[0] == 0.0
    few = margins[:NEAREST]
    assert overturn_rates([0.0], few, np.full(few.size, 1.0))[0] == 1.0  # ≤ NEAREST judged: all of them


def _probs_views():
    return Views([View("p", "probs", axis=-1)], {}, {})


def test_a_move_behind_a_saturated_softmax_fails_the_target_though_no_decision_flipped():
    # 32 samples: one is a near coin flip (margin 0.05), the rest are sure (8..13 nats). The
    # candidate leaves the coin flip alone and closes every sure margin by 2 nats: all 32
    # decisions agree and the probability cosine stays near 1, but a 2-nat closing meets the
    # coin-flip margin on a sample not seen about one time in 32.
    margins = np.concatenate([[0.05], np.linspace(8.0, 13.0, 31)])
    moved = np.where(margins < 1, margins, margins - 2.0)
    reference = [{"p": _two_class([m])} for m in margins]
    candidate = [{"p": _two_class([m])} for m in moved]
    verdict = judge(_probs_views(), reference, candidate, Target.parse("cos:0.99"))
    score = verdict.scores[0]
    assert score.observed == 1.0
    assert score.cosine > 0.999
    assert score.agreement == pytest.approx(1.0 - 31 / 32**2, abs=1e-6)
    assert not verdict.met()
    assert "agreement" in verdict.binding


def test_completing_with_the_reference_bounds_the_estimate():
    rng = np.random.default_rng(0)
    margins = rng.uniform(0.0, 3.0, 16)
    reference = [{"p": _two_class([m])} for m in margins]
    candidate = [{"p": _two_class([m + rng.normal(0, 0.5)])} for m in margins]
    views, target = _probs_views(), Target.parse("cos:0.99")
    final = judge(views, reference, candidate, target).scores[0].agreement
    for seen in range(1, len(reference)):
        bound = judge(views, reference, candidate[:seen] + reference[seen:], target).scores[0].agreement
        assert bound >= final - 1e-12


def test_single_class_rows_have_no_margin():
    ref = np.ones((5, 1), np.float32)
    margin, shift = margins_and_shifts(ref, ref)
    assert margin.size == 0 and shift.size == 0


def test_margins_of_samples_not_judged_join_the_pool():
    # held-out samples are all sure (margins ≥ 4); the candidate closes them by 2 nats and flips
    # none. A near tie among the fit samples (margin 0.5) is met by that closing.
    margins = np.linspace(4.0, 9.0, 8)
    reference = [{"p": _two_class([m])} for m in margins]
    candidate = [{"p": _two_class([m - 2.0])} for m in margins]
    views, target = _probs_views(), Target.parse("cos:0.99")
    alone = judge(views, reference, candidate, target).scores[0]
    assert alone.agreement == 1.0
    from onnxslim_kit.fidelity.judge import reference_margins

    pool = reference_margins(views, [{"p": _two_class([0.5])}, {"p": _two_class([7.0])}], None)
    assert pool["p"] == pytest.approx([0.5, 7.0], abs=1e-5)
    pooled = judge(views, reference, candidate, target, margin_pool=pool).scores[0]
    assert pooled.agreement == pytest.approx(1.0 - 8 / (8 * 10))
    assert pooled.min_margin == pytest.approx(4.0, abs=1e-5)  # the judged rows' own, as reported


def test_the_pipeline_pools_the_fit_samples_margins():
    import onnx

    from onnxslim_kit.fidelity import Fidelity, split_feed
    from onnxslim_kit.fidelity.context import held_out

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 2] x) => (float[1, 2] p) { p = Softmax <axis = -1> (x) }""")
    feed = [{"x": np.array([[m, 0.0]], np.float32)} for m in (0.1, 5.0, 6.0, 7.0, 0.2, 5.5, 6.5, 7.5)]

    class Feed(list):
        def take(self, n):
            return list(self[:n])

        def count(self):
            return len(self)

    fit, samples, _, _ = split_feed(Feed(feed))
    fidelity = Fidelity.build(model, "cos:0.99", samples, pool_feed=fit)
    pool = fidelity.margin_pool["p"]
    fit_margins = [float(s["x"][0, 0]) for i, s in enumerate(feed) if not held_out(i)]
    assert np.allclose(sorted(pool), sorted(fit_margins), atol=1e-3) and len(pool) == 6


def test_a_runner_up_at_zero_is_below_resolution_not_a_shift():
    """A uint8 output (steps of 1/255) writes a sure row's runner-up as 0: its move cannot be
    read, so only the top class's move counts; a top class gone to 0 still counts in full."""
    ref = _two_class(np.linspace(8.0, 20.0, 16))
    got = np.round(ref * 255) / 255  # runner-ups → 0, tops → 1
    margin, shift = margins_and_shifts(ref, got)
    assert np.all(got[:, 1] == 0) and np.abs(shift).max() < 1e-3
    assert estimated_agreement(margin, margin, shift) == 1.0
    flipped = got[::-1].copy()[:, ::-1]  # every top class at 0, the runner-up at 1
    assert margins_and_shifts(ref, flipped)[1].min() > 50
