"""The ``int8`` fallback under the fidelity contract (:mod:`onnxslim_kit.fidelity`): judged per
output view on held-out samples, within the budget share the pipeline gives it.

The model is a YOLO-style head: one output ``y = Reshape(Concat(box · 300, Sigmoid(cls)))``.
Its input has an outlier channel (×300) that the box branch reads and that sets the 8-bit
step of the shared input; the score branch reads the other channel, whose values (~1) the
step (~10) wipes out. The whole output's cosine is the box branch's (hundreds against scores
in 0…1) and reads ≈ 1 with the scores destroyed; the ``y[scores]`` view sees it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxslim_kit.api import Fidelity, PassContext
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.fidelity.context import held_out_of
from onnxslim_kit.metrics import cosine
from onnxslim_kit.model import Model
from onnxslim_kit.pipeline import parse_pass_list, resolve, run_pipeline
from onnxslim_kit.runtime import make_session, run

THRESHOLD = 0.25  # the views' score threshold (onnxslim_kit.fidelity.SCORE_THRESHOLD)


def yolo_head() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    scale = np.array([300.0, 1.0], np.float32).reshape(1, 2, 1, 1)
    wb = np.zeros((4, 2, 1, 1), np.float32)
    wb[:, 0] = rng.uniform(0.5, 1.5, (4, 1, 1))  # box regression from the outlier channel
    wc = np.zeros((3, 2, 1, 1), np.float32)
    wc[:, 1] = rng.uniform(0.5, 1.5, (3, 1, 1))  # class scores from the small channel
    bc = np.full(3, np.log(THRESHOLD / (1 - THRESHOLD)), np.float32)  # about half the scores above 0.25
    text = """<ir_version: 8, opset_import: ["" : 13]>
    q (float[1, 2, 8, 8] x) => (float y) {
        m = Mul (x, s)
        box = Conv (m, wb)
        cls = Conv (m, wc, bc)
        sig = Sigmoid (cls)
        cat = Concat <axis = 1> (box, sig)
        y = Reshape (cat, shape)
    }"""
    model = onnx.parser.parse_model(text)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    inits = {"s": scale, "wb": wb, "wc": wc, "bc": bc, "shape": np.array([1, 7, 64], np.int64)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def feed_of(model, n: int = 32, seed: int = 0) -> CalibrationFeed:
    rng = np.random.default_rng(seed)
    return CalibrationFeed(input_specs(model), [{"x": rng.standard_normal((1, 2, 8, 8)).astype(np.float32)}
                                                for _ in range(n)])


def quantize(model, options: str = ""):
    options = ",".join(filter(None, [options, "speed_check=false"]))
    out, report = run_pipeline(model, parse_pass_list(f"int8({options})"), feed_of(model))
    return out, report.passes[-1]


def views(entry) -> dict:
    return {v["view"]: v for v in entry.fidelity["views"]}


def held_out(model) -> list:
    """The samples the pipeline judges on: one in four of the feed."""
    return held_out_of(feed_of(model))


def test_scores_view_keeps_what_the_whole_output_cosine_would_give_away():
    model = yolo_head()
    loose, rep_loose = quantize(model, "fallback=false")
    # all int8: the whole output's cosine on the held-out samples would accept it ...
    reference, candidate = make_session(model), make_session(loose)
    whole = [cosine(run(reference, s)["y"], run(candidate, s)["y"]) for s in held_out(model)]
    assert min(whole) >= 0.999
    # ... while the scores lost most of their detections
    lost = views(rep_loose)["y[scores]"]
    assert lost["agreement"] < 0.5 and rep_loose.fidelity["binding"].startswith("y[scores]")
    assert not rep_loose.fidelity["met"]

    out, rep = quantize(model)  # the pipeline's default target, cos:0.99
    kept = views(rep)["y[scores]"]
    assert kept["cosine"] >= 0.99 and kept["agreement"] >= 0.99  # on the held-out samples
    assert rep.fidelity["met"] and rep.fidelity["samples"] == 8 and "held-out" in rep.fidelity["judged_on"]
    assert rep.metrics["target"] == "cos:0.99" and rep.metrics["budget_allowed"] == 1
    assert rep.metrics["budget_used"] <= 1
    assert rep.metrics["layers_int8"] == 1  # the box branch stays static int8: only the score conv left it
    assert any("judged on 8 held-out calibration samples" in n and "binds" in n for n in rep.notes)


def test_fallback_holds_the_share_it_is_given():
    """A pass given a share of the budget (``allowed`` < 1: what the pipeline gives one of
    several lossy passes) stays within that share, not within the whole target: a share
    below what it used with the whole budget sends more layers to float."""
    model = yolo_head()
    [(instance, options)] = resolve(parse_pass_list("int8(speed_check=false,ladder=none)"))
    samples = held_out(model)
    fid = Fidelity.build(model, "cos:0.99", samples, "held-out test samples")

    def run_with(remaining: int):
        ctx = PassContext(options=options, feed=feed_of(model), original=model)
        ctx.fidelity = fid.for_pass("", remaining=remaining)  # allowed = 1 / remaining of a fresh budget
        graph = Model.from_proto(model)
        result = instance.run(graph, ctx)
        graph.commit()
        session = make_session(graph.to_proto())
        verdict = fid.judge([run(session, s) for s in samples])  # judged again, outside the pass
        assert result.metrics["budget_allowed"] == round(ctx.fidelity.allowed, 4)
        assert verdict.used <= ctx.fidelity.allowed
        assert abs(result.metrics["budget_used"] - verdict.used) < 1e-3
        return result

    whole = run_with(1)
    assert 0 < whole.metrics["budget_used"] < 1 and whole.metrics["layers_int8"] >= 1
    tight = run_with(int(2 / whole.metrics["budget_used"]) + 1)  # under half of what it used
    assert tight.metrics["layers_float"] > whole.metrics["layers_float"]


def test_old_target_spellings_still_read():
    from onnxslim_kit.passes.int8.options import check_target

    assert [check_target(t) for t in ("off", "0", "0.0", "none", "", "cos:0.99", "0.995")] == [
        "none", "none", "none", "none", "", "cos:0.99", "0.995"]
    _, rep = quantize(yolo_head(), "target=off")
    assert rep.metrics["target"] == "none" and "budget_used" not in rep.metrics and rep.metrics["layers_int8"] == 2
