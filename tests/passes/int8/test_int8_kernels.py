"""The int8 search's choice judged on ORT's fused int8 kernels (``passes/int8/kernels.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from onnxslim_kit.passes.int8 import kernels
from onnxslim_kit.passes.int8.fallback import Used

from test_int8_fidelity import quantize, yolo_head


class _Verdict:
    def __init__(self, used: float):
        self.used = used


def _used(value: float) -> Used:
    return Used.of(_Verdict(value))


EMULATED = SimpleNamespace(kernels=False)  # a scorer whose trials ran Q/DQ emulation


@pytest.fixture
def no_export(monkeypatch):
    monkeypatch.setattr(kernels, "layer_weight_bytes", lambda *_: 0)


def test_a_choice_the_kernels_keep_within_the_budget_stands(monkeypatch, no_export):
    monkeypatch.setattr(kernels, "kernel_score", lambda *_: _used(0.9))
    result = SimpleNamespace(notes=[], metrics={})
    searched = []
    chosen, score = kernels.on_kernels(None, None, {"a": "int8", "b": "float"}, _used(0.8), {}, EMULATED,
                                       SimpleNamespace(allowed=1.0), result, searched.append)
    assert chosen == {"a": "int8", "b": "float"} and float(score) == 0.9 and not searched
    assert result.metrics["budget_used_kernels"] == 0.9
    assert result.notes == ["judged on ORT's int8 kernels: 90% of the budget (the search's emulation: 80%)"]


def test_a_choice_the_kernels_take_over_the_budget_is_searched_again_with_the_gap_taken_off(monkeypatch, no_export):
    readings = iter([_used(1.1), _used(0.7)])  # the first choice on the kernels, then the second
    monkeypatch.setattr(kernels, "kernel_score", lambda *_: next(readings))
    asked = []

    def search(allowed):
        asked.append(allowed)
        return {"a": "float", "b": "int8"}, _used(0.6), None

    result = SimpleNamespace(notes=[], metrics={})
    chosen, score = kernels.on_kernels(None, None, {"a": "int8", "b": "int8"}, _used(0.9), {}, EMULATED,
                                       SimpleNamespace(allowed=1.0), result, search)
    assert asked == [pytest.approx(0.8)]  # 1.0 − (1.1 − 0.9)
    assert chosen == {"a": "float", "b": "int8"} and float(score) == 0.7
    assert "searched again at 80% of it: 70% on the kernels" in result.notes[0]


def test_a_gap_as_large_as_the_budget_leaves_every_layer_float(monkeypatch, no_export):
    monkeypatch.setattr(kernels, "kernel_score", lambda *_: _used(2.5))
    result = SimpleNamespace(notes=[], metrics={})
    chosen, _ = kernels.on_kernels(None, None, {"a": "int8"}, _used(0.5), {}, EMULATED, SimpleNamespace(allowed=1.0),
                                   result, lambda allowed: pytest.fail("no search below a zero allowance"))
    assert chosen == {"a": "float"}


def test_trials_that_ran_the_kernels_are_not_judged_again(monkeypatch):
    monkeypatch.setattr(kernels, "kernel_score", lambda *_: pytest.fail("the trials ran the kernels already"))
    result = SimpleNamespace(notes=[], metrics={})
    chosen, score = kernels.on_kernels(None, None, {"a": "int8"}, _used(0.7), {}, SimpleNamespace(kernels=True),
                                       SimpleNamespace(allowed=1.0), result, lambda allowed: pytest.fail("no search"))
    assert chosen == {"a": "int8"} and float(score) == 0.7 and result.metrics["budget_used_kernels"] == 0.7
    assert result.notes == ["judged on ORT's int8 kernels: 70% of the budget (the search's trials ran them)"]


def test_the_pass_reports_what_the_verification_measures():
    """The pass's own figure is the written model's, judged as the pipeline's verification
    judges it (ORT's optimizations on)."""
    _, entry = quantize(yolo_head())
    assert entry.metrics["budget_used_kernels"] == pytest.approx(entry.fidelity["used"], abs=1e-3)
    assert entry.metrics["budget_used"] == pytest.approx(entry.metrics["budget_used_kernels"], abs=1e-3)
    assert any(n.startswith("judged on ORT's int8 kernels") for n in entry.notes)
