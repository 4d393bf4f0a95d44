"""What keeps ``int4``'s mixed precision cheap on large models (issue 16): the fidelity stop's
probes placed by the predicted losses find the same prefix as a bisection in fewer trials, the
sensitivity samples shrink with the model's bytes, each weight is read once for the int4
results, the proxy and the emulation copies, and the tiled transposes equal numpy's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_int4 import int4
from test_int4_mixed import _stack

from onnxslim_kit.model import Model
from onnxslim_kit.passes.int4 import judged, mixed, rounds
from onnxslim_kit.passes.int4 import quant as iq
from onnxslim_kit.passes.int4.target import collect_targets, transposed
from onnxslim_kit.api import PassResult


class FakeEmulation:
    """``u(j)`` given; counts the trials like :class:`judged.Emulation`."""

    def __init__(self, used, allowed: float = 1.0):
        self.used, self.count, self.probes = used, 0, []
        self.fid = SimpleNamespace(allowed=allowed, met=lambda v: v.used <= allowed + 1e-9)

    def judge(self, promoted: list):
        self.count += 1
        self.probes.append(len(promoted))
        return SimpleNamespace(used=self.used(len(promoted)))


def _first_met(used, m: int, allowed: float = 1.0) -> int:
    return next((j for j in range(m + 1) if used(j) <= allowed + 1e-9), m)


ORDER = [f"l{i:02d}" for i in range(40)]
LOSSES = {n: 1.0 / (1 + i) for i, n in enumerate(ORDER)}  # the greedy order: largest first


def _linear(j: int) -> float:
    """u proportional to the loss left at int4: what the probes assume."""
    left = sum(LOSSES[n] for n in ORDER[j:])
    return 3.0 * left / sum(LOSSES.values())


@pytest.mark.parametrize("used", [
    _linear,
    lambda j: 5.0 - 0.1 * j,  # met from j = 40 on
    lambda j: 2.0 if j < 7 else 0.5,  # a step the prediction does not see
    lambda j: 1.5 * 0.9 ** j,  # geometric
    lambda j: 9.0,  # never met: the size cap binds
    lambda j: 0.5,  # met with no 8-bit layer
])
def test_stop_finds_the_shortest_prefix_that_holds(used):
    emulation = FakeEmulation(used)
    kept, verdict, trials = judged.stop(emulation, ORDER, LOSSES)
    assert len(kept) == _first_met(used, len(ORDER)) and kept == ORDER[:len(kept)]
    assert verdict.used == used(len(kept)) and trials == emulation.count
    assert trials <= 2 * int(np.ceil(np.log2(len(ORDER)))) + 2  # never much worse than bisection


def test_probes_placed_by_the_losses_take_fewer_trials_than_bisection():
    emulation = FakeEmulation(_linear)
    kept, _, trials = judged.stop(emulation, ORDER, LOSSES)
    assert len(kept) == _first_met(_linear, len(ORDER)) > 0
    assert trials <= 3 < 2 + np.ceil(np.log2(len(ORDER)))  # j = 0, the prediction, its neighbour


def test_stop_with_no_order_or_all_int4_holding_judges_once():
    for order, used in (([], lambda j: 2.0), (ORDER, lambda j: 0.9)):
        kept, _, trials = judged.stop(FakeEmulation(used), order, LOSSES)
        assert kept == [] and trials == 1


def test_sensitivity_samples_shrink_with_the_model_bytes():
    assert mixed.sample_count(16, 88 << 20) == 16  # MiniLM: as many as asked
    assert mixed.sample_count(4, 933 << 20) == 4
    assert mixed.sample_count(4, 2747 << 20) == 1  # issue 16's decoder
    assert mixed.sample_count(4, 1 << 40) == 1 and mixed.sample_count(0, 1) == 1
    sizes = [mixed.sample_count(16, b << 20) for b in (100, 300, 1000, 3000)]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("shape", [(1, 1), (3, 700), (513, 257), (256, 512)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tiled_transpose_equals_numpy(shape, dtype):
    a = np.random.default_rng(0).normal(size=shape).astype(dtype)
    out = transposed(a, np.float32)
    assert out.flags.c_contiguous and out.dtype == np.float32
    np.testing.assert_array_equal(out, a.T.astype(np.float32))
    assert transposed(a).dtype == dtype


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_quantize_all_shows_each_weight_once_with_its_result(monkeypatch, threads):
    """RTN layers run ``LAYER_THREADS`` at a time; what ``visit`` returns runs in the layers' order,
    and the results are those of one thread."""
    monkeypatch.setattr(rounds, "LAYER_THREADS", threads)
    model = Model.from_proto(_stack(4))
    targets = collect_targets(model, PassResult())
    seen = []
    opts = {"method": "rtn", "search": False, "block_size": 32, "symmetric": False}
    results = rounds.quantize_all(model, targets, opts, None, PassResult(),
                                  visit=lambda t, wt, qw: (lambda: seen.append((t.key, wt, qw))))
    assert [k for k, _, _ in seen] == [t.key for t in targets] and set(results) == {t.key for t in targets}
    for key, wt, qw in seen:
        target = next(t for t in targets if t.key == key)
        np.testing.assert_array_equal(wt, target.load())
        np.testing.assert_array_equal(qw.q, rounds.codes(results[key]).q)  # a code per byte
        np.testing.assert_array_equal(iq.dequantize(qw), iq.dequantize(rounds.codes(results[key])))


def test_mixed_precision_with_the_proxy_is_deterministic():
    model = _stack(6)
    a, ra = int4(model, "method=rtn,max_ratio=0.2,measured=2", samples=4)
    b, rb = int4(model, "method=rtn,max_ratio=0.2,measured=2", samples=4)
    assert a.SerializeToString() == b.SerializeToString()
    assert ra.metrics["mixed_samples"] == 4 and ra.metrics["mixed_measured"] == 2


def test_hessians_from_one_pass_of_rows_equal_those_of_a_pass_per_round(monkeypatch):
    from onnxslim_kit.calibration import CalibrationFeed, input_specs

    proto = _stack(4)
    model = Model.from_proto(proto)
    targets = collect_targets(model, PassResult())
    ctx = SimpleNamespace(feed=CalibrationFeed(input_specs(proto), None, num_samples=3),
                          options={"samples": 3, "threads": 1})
    passes = []
    real = rounds.iter_activations
    monkeypatch.setattr(rounds, "iter_activations", lambda *a, **k: passes.append(1) or real(*a, **k))
    monkeypatch.setattr(rounds, "HESSIAN_BYTES_PER_ROUND", 64 * 64 * 8 * 2)  # two Hessians a round
    one = list(rounds.hessian_rounds(model, targets, ctx))
    assert len(one) == 2 and len(passes) == 1  # 4 inputs (x, h1, h2, h3): two rounds, one pass
    monkeypatch.setattr(rounds, "ROWS_BYTES_ONE_PASS", 0)  # rows too large: a pass per round
    per_round = list(rounds.hessian_rounds(model, targets, ctx))
    assert len(passes) == 1 + 1 + 2  # the aborted pass, then one per round
    assert [sorted(r) for r in one] == [sorted(r) for r in per_round]
    for a, b in zip(one, per_round):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
