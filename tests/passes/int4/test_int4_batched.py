"""The fidelity stop's stacked runs (:mod:`onnxslim_kit.passes.int4.batched`): used only after
they reproduced the one-by-one outputs bit for bit; a model that mixes samples along axis 0 or
fixes the batch keeps the one-by-one runs; the pass's output is the same either way."""

from __future__ import annotations

import numpy as np
import pytest
import test_fp16 as fp16_tests
from test_int4 import int4
from test_int4_suffix import decoder

from onnxslim_kit.passes.int4 import batched
from onnxslim_kit.runtime import make_session

RNG = np.random.default_rng(4)


def _session(body: str, batch: str = "B"):
    w = {"W": RNG.standard_normal((8, 6)).astype(np.float32)}
    model = fp16_tests.build(body, f"float[{batch}, 5, 8] x", w, opset=17)
    return make_session(model, "basic", threads=2, arena=False, prepack=False)


def _feeds(n: int, rows: int = 1) -> list:
    return [{"x": RNG.standard_normal((rows, 5, 8)).astype(np.float32)} for _ in range(n)]


def test_stack_and_split_round_trip():
    feeds = _feeds(3)
    stacked, sizes = batched.stack(feeds, {"x"})
    assert stacked["x"].shape == (3, 5, 8) and sizes == [1, 1, 1]
    parts = batched.split({"y": stacked["x"]}, sizes)
    assert all(np.array_equal(p["y"], f["x"]) for p, f in zip(parts, feeds))
    assert batched.split({"y": stacked["x"][:2]}, sizes) is None  # no batch axis of that size


def test_stack_refuses_what_it_cannot_stack():
    assert batched.stack(_feeds(1), {"x"}) == (None, None)  # one sample
    assert batched.stack(_feeds(2), set()) == (None, None)  # the first dim is fixed
    uneven = [{"x": np.zeros((1, 5, 8), np.float32)}, {"x": np.zeros((1, 4, 8), np.float32)}]
    assert batched.stack(uneven, {"x"}) == (None, None)


def test_runs_stack_after_an_exact_check():
    session = _session("h = MatMul(x, W)\ny = Relu(h)")
    feeds = _feeds(3)
    runs = batched.Runs(session, ["y"], feeds)
    first = runs.run({})
    assert runs.checked  # the stacked run gave the same outputs
    again = runs.run({})
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(first, again))
    assert all(np.array_equal(a["y"], session.run(["y"], f)[0]) for a, f in zip(again, feeds))


@pytest.mark.parametrize("body, batch", [
    ("h = MatMul(x, W)\nm = ReduceMean<axes = [0], keepdims = 1>(h)\ny = Sub(h, m)", "B"),  # mixes the samples
    ("y = MatMul(x, W)", "1"),  # the batch is fixed
])
def test_runs_stay_one_by_one_where_stacking_differs(body, batch):
    session = _session(body, batch)
    feeds = _feeds(2)
    runs = batched.Runs(session, ["y"], feeds)
    got = runs.run({})
    assert not runs.checked and runs.stacked is None
    assert all(np.array_equal(a["y"], session.run(["y"], f)[0]) for a, f in zip(got, feeds))
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(runs.run({}), got))


class _Counted:
    """A session that counts its runs."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, outputs, feed):
        self.runs += 1
        return self.session.run(outputs, feed)


@pytest.mark.parametrize("body, batch, first_trial", [
    ("h = MatMul(x, W)\ny = Relu(h)", "B", 2),  # the first sample alone and all stacked
    ("h = MatMul(x, W)\nm = ReduceMean<axes = [0], keepdims = 1>(h)\ny = Sub(h, m)", "B", 4),  # + the other two
    ("y = MatMul(x, W)", "1", 3),  # one by one
])
def test_first_trial_runs_the_first_sample_alone_and_the_stack(body, batch, first_trial):
    session = _Counted(_session(body, batch))
    feeds = _feeds(3)
    runs = batched.Runs(session, ["y"], feeds)
    got = runs.run({})
    assert session.runs == first_trial
    assert all(np.array_equal(a["y"], session.session.run(["y"], f)[0]) for a, f in zip(got, feeds))
    runs.run({})
    assert session.runs == first_trial + (1 if runs.checked else 3)


def test_pass_output_is_the_same_with_and_without_stacked_runs(monkeypatch):
    model = decoder("T", batch="B")
    options = "method=rtn,block_size=16,max_ratio=0.25,target=cos:0.9999,measured=20"
    stacked, report = int4(model, options, samples=16)
    assert report.metrics["mixed_trials"] > 1 and report.metrics["mixed_stacked"]  # the later trials ran stacked
    monkeypatch.setattr(batched, "stack", lambda feeds, symbolic: (None, None))
    alone, report_alone = int4(model, options, samples=16)
    assert not report_alone.metrics["mixed_stacked"]
    assert report.metrics["mixed_probes"] == report_alone.metrics["mixed_probes"]
    assert stacked.SerializeToString() == alone.SerializeToString()


@pytest.mark.parametrize("body, batch, runs", [
    ("h = Relu(x)\ny = MatMul(h, W)", "B", 2),  # the first sample alone, then all stacked
    ("m = ReduceMean<axes = [0], keepdims = 1>(x)\nh = Sub(x, m)\ny = MatMul(h, W)", "B", 4),  # mixes the samples
    ("h = Relu(x)\ny = MatMul(h, W)", "1", 3),  # the batch is fixed
])
def test_proxy_rows_equal_the_one_by_one_rows(monkeypatch, body, batch, runs):
    """The proxy's rows come from a stacked run only where that reproduces the one-by-one values."""
    from onnxslim_kit.model import Model
    from onnxslim_kit.passes.int4 import proxy

    w = {"W": RNG.standard_normal((8, 6)).astype(np.float32)}
    model = Model.from_proto(fp16_tests.build(body, f"float[{batch}, 5, 8] x", w, opset=17))
    samples = [{"x": RNG.standard_normal((1, 5, 8)).astype(np.float32)} for _ in range(3)]
    count = []
    real = proxy.iter_activations

    def counted(proto, names, feeds, **kwargs):
        for values in real(proto, names, feeds, **kwargs):
            count.append(1)
            yield values

    monkeypatch.setattr(proxy, "iter_activations", counted)
    rows = proxy.input_rows(model, {"h": 8}, samples)
    assert len(count) == runs and rows["h"].shape == (15, 8)
    monkeypatch.setattr(proxy, "_activations", lambda proto, names, feeds, threads: real(proto, names, feeds))
    np.testing.assert_array_equal(rows["h"], proxy.input_rows(model, {"h": 8}, samples)["h"])
