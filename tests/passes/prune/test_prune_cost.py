"""prune's cost model: exact MACs of a cut (a conv cut on both sides counts once), channel blocks,
and the sensitivity allocation spending exactly its budget (ppocr_cls_v2 ratio=0.5 regression)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_prune_sensitivity import _analysed
from test_prune_strip import build, conv, weight

from onnxslim_kit.bench_macs import estimate_macs
from onnxslim_kit.passes.prune.apply import apply
from onnxslim_kit.passes.prune.cost import CostModel
from onnxslim_kit.passes.prune.importance import unit_costs
from onnxslim_kit.passes.prune.sensitivity import sensitivity_select
from onnxslim_kit.pipeline import PassResult

SHAPE = [1, 3, 8, 8]


def _chain():
    """x → a (3→16) → b (16→16) → c (16→16) → d (16→12) → y, 3×3 convs with padding, Relu between:
    the output channels of a, b, c are three source groups; b and c are cut on both sides."""
    nodes, inits, x = [], {}, "x"
    for name, cin, cout in (("a", 3, 16), ("b", 16, 16), ("c", 16, 16), ("d", 16, 12)):
        w, b = weight(cout, cin, 3, 3), weight(cout)
        nodes.append(conv(name, x, w, b, pads=1))
        inits.update({f"{name}.w": w, f"{name}.b": b})
        if name != "d":
            nodes.append(helper.make_node("Relu", [name], [f"{name}_r"]))
            x = f"{name}_r"
    return build(nodes, inits, SHAPE, {"d": 4})


def _macs(proto) -> int:
    return estimate_macs(proto, {"x": SHAPE})[0]


def _group(cg, source: str) -> list:
    return cg.units_of(source).tolist()


@pytest.mark.parametrize("cut", [{"a": 8}, {"a": 8, "b": 8}, {"a": 4, "b": 12, "c": 8}, {"b": 16 - 1}])
def test_saved_equals_the_macs_the_pruned_model_loses(cut):
    proto = _chain()
    model, cg, _, _ = _analysed(proto, samples=1)
    removed = {u for name, n in cut.items() for u in _group(cg, name)[:n]}
    saved = CostModel(cg).saved(removed)
    per_unit = sum(unit_costs(cg)[u] for u in removed)
    apply(model, cg, removed, None)
    model.commit()
    assert saved == pytest.approx(_macs(proto) - _macs(model.to_proto()), rel=1e-9)
    if len(cut) > 1:  # the per-unit sum counts b (and c) twice
        assert per_unit > saved * 1.05


def test_channel_blocks_round_kept_counts_up():
    proto = _chain()
    _, cg, _, _ = _analysed(proto, samples=1)
    per_pair = 8 * 8 * 9  # MACs of one (input, output) channel pair of b, c, d
    exact, blocked, eights = CostModel(cg), CostModel(cg, block=16), CostModel(cg, block=8)
    assert blocked.full() == exact.full() == pytest.approx(_macs(proto))
    # 6 of a's 16 channels: exact saves their share; with blocks of 16 the 10 left still cost 16,
    # with blocks of 8 they cost as 16 of 16 — a and b then run at 1/2 (a: 8 × 27 taps, b: 8 × 16 pairs)
    six = _group(cg, "a")[:6]
    assert exact.saved(six) == pytest.approx(6 * (8 * 8 * 27 + 16 * per_pair))
    assert blocked.saved(six) == 0.0
    assert eights.saved(six) == 0.0
    ten = _group(cg, "a")[:10]
    assert eights.saved(ten) == pytest.approx(8 * (8 * 8 * 27 + 16 * per_pair))


class _FakeProbe:
    """Output loss: cutting any unit of ``sensitive`` costs 100, the others nothing."""

    def __init__(self, sensitive):
        self.sensitive = set(sensitive)

    def loss(self, removed) -> float:
        return 100.0 * len(self.sensitive & set(removed))


def test_allocation_spends_the_exact_budget():
    """Default selection: half of a and half of b (b's conv is cut on both sides). Loss says: spare
    b. Cutting a and c saves at least as much as the default really does, so b must be spared — a
    budget summed per unit counts b's conv twice and made the allocation cut b as well (cls_v2
    ratio=0.5 lost every decision that way)."""
    proto = _chain()
    model, cg, samples, stats = _analysed(proto, samples=1)
    a, b, c = (_group(cg, name) for name in "abc")
    default = set(a[:8]) | set(b[:8])
    scores = {u: float(i) for group in (a, b, c) for i, u in enumerate(group)}
    cost = CostModel(cg)
    result = PassResult()
    removed = sensitivity_select(cg, None, stats, samples, scores, cost, default, 0.5, 8, 8, result,
                                 probe=_FakeProbe(b))
    assert not removed & set(b)
    assert removed == set(a[:8]) | set(c[:8])
    target, got = result.metrics["budget_saved"]
    assert got >= target
    apply(model, cg, removed, None)
    model.commit()
    assert _macs(proto) - _macs(model.to_proto()) == pytest.approx(got, rel=1e-3)  # metric: 4 digits


def test_floor_raises_a_budget_the_ranking_leaves_small():
    proto = _chain()
    _, cg, samples, stats = _analysed(proto, samples=1)
    a, b, c = (_group(cg, name) for name in "abc")
    scores = {u: float(i) for group in (a, b, c) for i, u in enumerate(group)}
    result = PassResult()
    # default cuts 8 of a only (cheap); a floor of 0.45 of everything prunable asks for more
    removed = sensitivity_select(cg, None, stats, samples, scores, CostModel(cg), set(a[:8]), 0.5, 8, 8, result,
                                 probe=_FakeProbe([]), floor=0.45)
    total = CostModel(cg).saved(a + b + c)
    target, got = result.metrics["budget_saved"]
    assert target == pytest.approx(0.45 * total, rel=1e-3)
    assert got >= target and len(removed) > 8
    assert np.isclose(CostModel(cg).saved(removed), got, rtol=1e-3)


class _InteractingProbe(_FakeProbe):
    """Like :class:`_FakeProbe`, but a and c together cost 1000: the groups' losses are not additive."""

    def __init__(self, sensitive, a, c):
        super().__init__(sensitive)
        self.a, self.c = set(a), set(c)

    def loss(self, removed) -> float:
        removed = set(removed)
        return super().loss(removed) + (1000.0 if removed & self.a and removed & self.c else 0.0)


def test_ranked_selection_kept_when_its_joint_loss_is_smaller():
    proto = _chain()
    _, cg, samples, stats = _analysed(proto, samples=1)
    a, b, c = (_group(cg, name) for name in "abc")
    default = set(a[:8]) | set(b[:8])
    scores = {u: float(i) for group in (a, b, c) for i, u in enumerate(group)}
    args = (cg, None, stats, samples, scores, CostModel(cg), default, 0.5, 8, 8)
    # additive view: a and c are free, b costs 800 → a + c; jointly a + c cost 1000 > 800
    result = PassResult()
    removed = sensitivity_select(*args, result, probe=_InteractingProbe(b, a, c),
                                 fallback=lambda target, cost: default)
    assert removed == default
    assert result.metrics["sensitivity_joint_loss"] == [1000.0, 800.0]
    assert result.skipped["alloc=sensitivity: the ranked selection measured a smaller loss, kept"] == 1
    result = PassResult()  # additive losses: the allocation stays
    removed = sensitivity_select(*args, result, probe=_FakeProbe(b), fallback=lambda target, cost: default)
    assert removed == set(a[:8]) | set(c[:8])


def test_default_keeps_channel_counts_in_blocks_of_16():
    from test_prune_ratio import NET, min_cosine
    from test_prune_strip import conv_weight, run_prune

    out, result = run_prune(NET, ratio=0.3)
    assert result.rewrites["prune channel"] > 0
    widths = {name: conv_weight(out, name).shape[0] for name in ("c1", "c4", "c5")}
    assert widths["c1"] in (16, 32) and widths["c4"] == 16 and widths["c5"] in (16, 24)
    assert any(w < full for w, full in zip(widths.values(), (32, 16, 24)))
    assert min_cosine(out) > 0.9
