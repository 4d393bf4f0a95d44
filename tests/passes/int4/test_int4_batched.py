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
