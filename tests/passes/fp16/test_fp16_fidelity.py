"""``fp16`` under the fidelity contract (issue 18): the drift search judges output views on the
held-out samples against the original, so a YOLO-style head's Sigmoid scores keep their
detections even where the whole output's cosine (dominated by ×100 box values) reads ≈ 1."""

from __future__ import annotations

import numpy as np
from test_fp16 import build

from onnxslim_kit.api import Fidelity
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.metrics import cosine
from onnxslim_kit.model import Model
from onnxslim_kit.passes.fp16 import search as fp16_search
from onnxslim_kit.passes.fp16.plan import build_plan
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

N = 64
# boxes = 100·|Conv₁(x)| beside scores = σ((Conv₂(x) + 3000) − 3000): in float16 the sum's spacing
# is 2, so the logits lose ±1 and the scores move by up to 0.25; the boxes barely move
HEAD = """
reg = Conv(x, WB)
pos = Abs(reg)
box = Mul(pos, hundred)
logit = Conv(x, WC)
shifted = Add(logit, big)
back = Sub(shifted, big)
cls = Sigmoid(back)
cat = Concat<axis=1>(box, cls)
y = Transpose<perm=[0, 2, 1]>(cat)
"""


def head():
    rng = np.random.default_rng(0)
    return build(HEAD, f"float[1, 8, {N}] x", {
        "WB": rng.normal(0, 0.3, (4, 8, 1)).astype(np.float32),
        "WC": rng.normal(0, 1.5, (3, 8, 1)).astype(np.float32),
        "hundred": np.array(100.0, np.float32), "big": np.array(3000.0, np.float32)})


def calibration(model, n: int = 32) -> CalibrationFeed:
    rng = np.random.default_rng(1)
    return CalibrationFeed(input_specs(model), [{"x": rng.normal(0, 1, (1, 8, N)).astype(np.float32)}
                                                for _ in range(n)])


def views(metrics: dict) -> dict:
    return {v["view"]: v for v in metrics["views"]}


def test_whole_output_cosine_would_accept_what_the_scores_view_rejects():
    model = head()
    samples = calibration(model).take(8)
    fid = Fidelity.build(model, "cos:0.99", samples, "test samples")
    assert [v.name for v in fid.views] == ["y[values]", "y[scores]"]
    dtypes = {v.name: np.dtype(np.float32) for v in list(model.graph.value_info) + list(model.graph.output)}
    search = fp16_search.Search(model, (dtypes, {}, True), {"keep_io": True, "merge_limit": -1}, fid)
    infos = build_plan(Model.from_proto(model).graph, dtypes, {}, True)
    everything = {k for k, info in enumerate(infos) if info.reason is None}
    trial = search.evaluate(everything)
    _, emulation = search.emulation(everything)
    got = fp16_search.outputs(emulation, samples)
    whole = min(cosine(r["y"], g["y"]) for r, g in zip(fid.reference, got))
    assert whole > 0.999  # the old whole-output test (even its stricter cos:0.999 default) accepts this
    scores = next(s for s in trial.verdict.scores if s.view == "y[scores]")
    assert scores.cosine < 0.99 or scores.agreement < 0.99
    assert not trial.ok and trial.verdict.used > 1 and trial.verdict.binding.startswith("y[scores]")


def test_default_target_keeps_the_scores_view_on_the_held_out_samples():
    model = head()
    out, report = run_pipeline(model, parse_pass_list("fp16(merge_limit=-1)"), calibration(model))
    entry = report.passes[0]
    m = entry.metrics
    assert m["target"] == "cos:0.99" and m["budget_allowed"] == 1.0 and m["budget_used"] <= 1.0
    scores = views(m)["y[scores]"]
    assert scores["cosine"] >= 0.99 and scores["agreement"] >= 0.99
    assert entry.skipped["float32 for the drift target / NaN-Inf"] >= 1
    assert 1 <= entry.rewrites["node→float16"] < 9  # the box branch stays float16
    assert any("held-out calibration samples" in note and "binds" in note for note in entry.notes)
    # judged on the held-out samples: one in four of the 32 calibration samples
    assert any("8 held-out calibration samples" in note for note in entry.notes)
    assert views(m)["y[values]"]["cosine"] > 0.9999
    loose, loose_report = run_pipeline(model, parse_pass_list("fp16(merge_limit=-1,target=none)"),
                                       calibration(model))
    damaged = views(loose_report.passes[0].metrics)["y[scores]"]
    assert damaged["cosine"] < 0.99 or damaged["agreement"] < 0.99
    assert loose_report.passes[0].metrics["target"] == "none"
    assert any(note.startswith("target none: worst view y[scores]") for note in loose_report.passes[0].notes)


def test_own_target_holds_that_target_not_the_share():
    model = head()
    _, report = run_pipeline(model, parse_pass_list("fp16(merge_limit=-1,target=rel:0.5)"), calibration(model))
    m = report.passes[0].metrics
    assert m["target"] == "rel:0.5" and m["budget_allowed"] == 1.0
    assert max(v["rel"] for v in m["views"]) <= 0.5
