"""prune(alloc=sensitivity): masked teacher = pruned model, loss curves, greedy allocation; held-out re-fit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import random_feeds, run_ort
from onnx import helper
from test_prune_ratio import NET, min_cosine
from test_prune_strip import build, conv, conv_weight, run_prune, weight

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.model import Model
from onnxslim_kit.passes.prune.apply import apply
from onnxslim_kit.passes.prune.importance import activation_stats, consumer_inputs
from onnxslim_kit.passes.prune.refit import fit_held_out, ridge
from onnxslim_kit.passes.prune.sensitivity import (
    LossProbe,
    budget_report,
    allocate,
    levels,
    masked_model,
    measured_tensors,
)
from onnxslim_kit.passes.prune import analyse_model
from onnxslim_kit.pipeline import PassContext, PassResult


def _unpadded():
    """conv a (3×3, no padding) → Relu → conv b (1×1) → Relu → GAP → Flatten → Gemm: every consumer
    is unpadded, so moving a removed channel's mean into the bias is exactly the masked model."""
    nodes = [conv("a", "x", weight(16, 3, 3, 3), weight(16)), helper.make_node("Relu", ["a"], ["r"]),
             conv("b", "r", weight(12, 16, 1, 1), weight(12)), helper.make_node("Relu", ["b"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], name="fc", transB=1)]
    inits = {"a.w": weight(16, 3, 3, 3), "a.b": weight(16), "b.w": weight(12, 16, 1, 1), "b.b": weight(12),
             "fc.w": weight(5, 12), "fc.b": weight(5)}
    return build(nodes, inits, [1, 3, 10, 10], {"y": 2})


def _analysed(proto, samples=4):
    feed = CalibrationFeed(input_specs(proto), None, num_samples=samples)
    model = Model.from_proto(proto)
    cg = analyse_model(model, PassContext(options={}, feed=feed, original=proto))
    samples = feed.take(samples)
    return model, cg, samples, activation_stats(cg, model.to_proto(), samples, consumer_inputs(cg))


def test_masked_teacher_equals_the_pruned_model():
    proto = _unpadded()
    model, cg, samples, stats = _analysed(proto)
    teacher = model.to_proto()
    masked, inputs = masked_model(teacher, cg)
    onnx.checker.check_model(masked, full_check=True)
    a_units = cg.units_of("a").tolist()
    removed = {a_units[1], a_units[4], a_units[9]}
    probe = LossProbe(teacher, cg, stats, samples)
    feed = probe._feed(np.array(sorted(removed)))
    means = {i: stats[c.tensor.name][0] for i, c in enumerate(cg.consumers)}
    apply(model, cg, removed, means)
    model.commit()
    pruned = model.to_proto()
    assert conv_weight(pruned, "a").shape[0] == 13
    for sample in samples:
        expected = run_ort(pruned, sample)[0]
        np.testing.assert_allclose(run_ort(masked, {**sample, **feed})[0], expected, rtol=1e-4, atol=1e-5)
        assert not np.allclose(run_ort(teacher, sample)[0], expected, atol=1e-3)  # the cut does change y
    # no units masked: the teacher itself, loss 0; the cut above: its relative error
    assert probe.loss(set()) == 0.0
    ref = [run_ort(teacher, s)[0].astype(np.float64) for s in samples]
    got = [run_ort(pruned, s)[0].astype(np.float64) for s in samples]
    expected_loss = sum(np.sum((g - r) ** 2) for g, r in zip(got, ref)) / sum(np.sum(r ** 2) for r in ref)
    assert probe.loss(removed) == pytest.approx(expected_loss, rel=1e-3)


def test_levels_are_multiples_within_the_cap():
    assert levels(64, 64, 0.5, 8, 8, 8) == [8, 16, 24, 32]
    assert levels(64, 64, 0.9, 8, 8, 3) == [8, 32, 56]  # at most 3, evenly spread, the largest kept
    assert levels(24, 24, 0.6, 8, 8, 8) == [8]  # 24 → 16 (8 more would break min / cap)
    assert levels(16, 16, 0.6, 16, 8, 8) == []  # at min_channels already
    assert levels(64, 4, 0.5, 8, 1, 8) == [1, 2, 3, 4]  # only 4 prunable units


def test_allocate_spends_the_budget_where_loss_per_cost_is_least():
    cheap = [(0, 0.0, 0.0), (8, 10.0, 0.01), (16, 20.0, 0.02), (24, 30.0, 0.50)]
    sensitive = [(0, 0.0, 0.0), (8, 10.0, 0.20), (16, 20.0, 0.40)]
    assert allocate([cheap, sensitive], 20.0) == [2, 0]
    assert allocate([cheap, sensitive], 25.0) == [2, 1]  # the last 8 of "cheap" cost 0.48, of "sensitive" 0.20
    assert allocate([cheap, sensitive], 0.0) == [0, 0]
    assert allocate([cheap, sensitive], 1e9) == [3, 2]  # budget beyond everything: all levels


def test_sensitivity_allocation_prunes_as_much_with_less_loss():
    rank, r1 = run_prune(NET, ratio=0.4, multiple=4, min_channels=4, refit=False)
    sens, r2 = run_prune(NET, ratio=0.4, multiple=4, min_channels=4, refit=False, alloc="sensitivity")
    assert r2.rewrites["prune channel"] > 0 and r2.metrics["sensitivity_runs"] > 0

    def macs(p):
        from onnxslim_kit.bench_macs import estimate_macs

        return estimate_macs(p, feed=random_feeds(p, 0))[0]

    assert macs(sens) <= macs(rank) * 1.02  # the budget (MACs removed) is at least the default's
    assert min_cosine(sens) >= min_cosine(rank) - 1e-3
    fitted, _ = run_prune(NET, ratio=0.4, multiple=4, min_channels=4, alloc="sensitivity")
    assert min_cosine(fitted) > 0.98


def test_fit_held_out_matches_ridge_on_all_rows():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal((200, 12)), np.ones((200, 1))], axis=1)
    w_true = rng.standard_normal((13, 4))
    y = x @ w_true + 0.05 * rng.standard_normal((200, 4))
    w0 = w_true + 0.5 * rng.standard_normal(w_true.shape)
    alpha, after, before, solved = fit_held_out(x, y, w0, np.arange(200) % 2 == 1, 12)
    assert after < 0.1 * before
    np.testing.assert_allclose(solved, ridge(x, y, w0, 12, alpha), rtol=1e-8, atol=1e-10)


def test_loss_is_measured_on_logits_of_softmax_and_sigmoid_outputs():
    nodes = [conv("a", "x", weight(8, 3, 3, 3), weight(8)), helper.make_node("Relu", ["a"], ["r"]),
             conv("b", "r", weight(4, 8, 1, 1), weight(4)), helper.make_node("Softmax", ["b"], ["p"], axis=1),
             helper.make_node("Sigmoid", ["b"], ["q"]), helper.make_node("Relu", ["b"], ["z"])]
    inits = {"a.w": weight(8, 3, 3, 3), "a.b": weight(8), "b.w": weight(4, 8, 1, 1), "b.b": weight(4)}
    proto = build(nodes, inits, [1, 3, 6, 6], {"p": 4, "q": 4, "z": 4})
    assert measured_tensors(proto) == ["b", "z"]  # both squashed outputs share the logits "b"


def test_a_ratio_the_cap_and_channel_steps_cannot_reach_is_reported():
    """Steps of 16 channels with at most 2·ratio of a group: ratio=0.1 cannot cut NET's groups
    (32, 16, 24 channels) at all, and says why; a budget met only in part is a note with the share."""
    _, result = run_prune(NET, ratio=0.1, multiple=16, min_channels=4, refit=False)
    (reason,) = [r for r in result.skipped if r.startswith("nothing to prune at this ratio")]
    assert "multiple=16" in reason and "max_ratio=0.2" in reason

    class Saves:  # a cost model: each unit saves 1
        saved = staticmethod(len)

    notes = PassResult()
    assert budget_report({1, 2}, 8.0, Saves, notes, 0.2, 16, 8) == {1, 2}
    assert notes.metrics["budget_saved"] == [8.0, 2.0]
    assert notes.notes == ["ratio not reached: 25% of the compute asked for can go within max_ratio=0.2, "
                           "multiple=16, min_channels=8 (the groups' cuts come in steps of 16 channels, at most "
                           "0.2 of a group)"]
    met = PassResult()
    budget_report({1, 2}, 2.0, Saves, met, 0.2, 16, 8)
    assert not met.notes
