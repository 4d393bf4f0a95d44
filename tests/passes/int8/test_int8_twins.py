"""The bias correction's twins and the activation sessions hold only what they are read for:
the same numbers as the whole forms (tiny graphs)."""

from __future__ import annotations

import numpy as np
import pytest
from test_int8 import build, quantize, w

from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8.correct import measure_twins
from onnxslim_kit.passes.int8.fallback import activations, keep_only, trial_copy

RNG = np.random.default_rng(11)


def conv_then_matmuls():
    """Conv (a bias to correct) → Flatten → two MatMuls (no bias): Conv and MatMul layers."""
    return build("c = Conv (x, cw, cb)\nr = Relu (c)\nf = Flatten (r)\nm = MatMul (f, w1)\nn = Relu (m)\ny = MatMul (n, w2)",
                 "float[1, 3, 6, 6] x",
                 {"cw": w(4, 3, 3, 3, rng=RNG), "cb": w(4, rng=RNG), "w1": w(64, 32, rng=RNG), "w2": w(32, 8, rng=RNG)})


def both_ways(monkeypatch, options: str):
    """Run the pass on ``conv_then_matmuls`` with ``measure_twins`` measured both ways on the
    pass's own plan and samples: ``(plan, (shifts, sensitivity) with every twin, the same
    with the Conv / Gemm twins only, the local flag the pass asked for)``."""
    import onnxslim_kit.passes.int8 as int8

    real, seen = int8.measure_twins, {}

    def spy(model, plan, samples, correct=True, local=True):
        seen.update(plan=plan, asked=local, samples=samples, model=trial_copy(model), every=real(trial_copy(model), plan, samples, correct),
                    only=real(trial_copy(model), plan, samples, correct, local=False))
        return real(model, plan, samples, correct, local)

    monkeypatch.setattr(int8, "measure_twins", spy)
    quantize(conv_then_matmuls(), options)
    return seen


def test_twins_of_the_biased_layers_alone_give_the_same_shifts(monkeypatch):
    seen = both_ways(monkeypatch, "sensitivity=e2e")
    (every_shift, every), (shifts, only) = seen["every"], seen["only"]
    conv = next(s.name for s in seen["plan"].layers if s.op == "Conv")
    assert seen["asked"] is False  # e2e ranks end to end: no local sensitivity needed
    assert set(every) == {s.name for s in seen["plan"].layers} and len(every) == 3
    assert set(only) == {conv}  # the MatMuls got no twin
    assert set(shifts) == set(every_shift) == {conv}
    assert np.array_equal(shifts[conv], every_shift[conv]) and np.abs(shifts[conv]).max() > 0
    assert only[conv] == every[conv]


@pytest.mark.parametrize("sensitivity", ["hybrid", "local"])
def test_a_local_ranking_still_gets_every_twin(monkeypatch, sensitivity):
    assert both_ways(monkeypatch, f"sensitivity={sensitivity}")["asked"] is True


def test_keep_only_cuts_the_graph_to_what_the_names_need():
    model = Model.from_proto(conv_then_matmuls())
    trial = trial_copy(model)
    keep_only(trial.graph, ["r"])
    assert [n.op for n in trial.graph.nodes] == ["Conv", "Relu"]
    assert {t for t in trial.graph.tensors()} >= {"cw", "cb"} and "w1" not in trial.graph.tensors()
    assert len(model.graph.nodes) == 6  # the model itself is untouched
    samples = [{"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(2)]
    cut = [a["r"] for a in activations(model, ["r"], samples)]
    whole = [a["r"] for a in activations(model, ["r", "y"], samples)]
    assert all(np.array_equal(a, b) for a, b in zip(cut, whole))


def test_keep_only_leaves_the_graph_whole_for_an_unknown_name():
    model = Model.from_proto(conv_then_matmuls())
    trial = trial_copy(model)
    keep_only(trial.graph, ["r", "no such tensor"])
    assert len(trial.graph.nodes) == 6


def test_a_model_too_large_for_the_e2e_ranking_ranks_hybrid_measuring_twins_only_if_ranking(monkeypatch):
    """sensitivity=auto on a dense model above ``E2E_COST``: hybrid; the bias correction measures
    the Conv twin alone, and the local ranking's twins run only when the search ranks (a
    target all-int8 misses), uncorrected and with the float path unsmoothed."""
    import onnxslim_kit.passes.int8 as int8

    real, calls = int8.measure_twins, []

    def spy(model, plan, samples, correct=True, local=True, before_run=None, rounds=1):
        calls.append((correct, local, before_run is not None, rounds))
        return real(model, plan, samples, correct, local, before_run, rounds)

    monkeypatch.setattr(int8, "measure_twins", spy)
    _, entry = quantize(conv_then_matmuls(), "target=none")
    assert entry.metrics.get("sensitivity") is None and calls == [(True, False, False, 1)]  # no search
    monkeypatch.setattr("onnxslim_kit.passes.int8.ranking.E2E_COST", 0)
    calls.clear()
    _, entry = quantize(conv_then_matmuls(), "target=cos:0.99")
    assert entry.metrics["sensitivity"] == "hybrid"
    assert calls[0] == (True, False, False, 1)
    calls.clear()
    _, entry = quantize(conv_then_matmuls(), "target=cos:0.999999999")  # all int8 misses it: the search ranks
    assert entry.metrics["sensitivity"] == "hybrid" and entry.metrics["layers_int8"] < 3
    assert calls == [(True, False, False, 1), (False, True, True, int8.TWIN_ROUNDS)]


def test_twins_in_rounds_give_the_same_numbers(monkeypatch):
    seen = both_ways(monkeypatch, "sensitivity=local")
    from onnxslim_kit.passes.int8.correct import twin_rounds

    model, plan, samples = seen["model"], seen["plan"], seen["samples"]
    one = measure_twins(trial_copy(model), plan, samples)
    chunks = twin_rounds(model.graph, plan.layers, 3)
    assert len(chunks) >= 2 and [s for c in chunks for s in c] == plan.layers
    three = measure_twins(trial_copy(model), plan, samples, rounds=3)
    assert one[1] == three[1] and set(one[0]) == set(three[0])
    assert all(np.array_equal(one[0][k], three[0][k]) for k in one[0])
