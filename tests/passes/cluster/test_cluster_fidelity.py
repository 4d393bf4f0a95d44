"""``cluster`` under the fidelity contract: the target is judged per output view on held-out
samples, so a score branch beside a large-scale regression branch keeps its decisions."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError
from onnxslim_kit.fidelity import Fidelity
from onnxslim_kit.fidelity.context import held_out_of
from onnxslim_kit.pipeline import parse_pass_list, resolve, run_pipeline

# a YOLO-style head: box regression ×100 beside sigmoid class scores, one output [1, 4+32, 16]
HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[16, 64] x) => (float[1, 36, 16] out) {
    t = MatMul(x, w1)
    h = Relu(t)
    reg = MatMul(h, wr)
    box = Mul(reg, scale)
    logit = MatMul(h, ws)
    cls = Sigmoid(logit)
    cat = Concat <axis = 1> (box, cls)
    tr = Transpose <perm = [1, 0]> (cat)
    out = Unsqueeze(tr, axes)
}
"""


def yolo_head(rng) -> onnx.ModelProto:
    """Trunk and box weights with 4 distinct values (exact at k = 4); the score weight Gaussian,
    scaled so that the logits have standard deviation ≈ 2 (many scores near the 0.25 cut)."""
    model = onnx.parser.parse_model(HEAD)
    w1 = (rng.choice(rng.standard_normal(4), (64, 64)) * 0.2).astype(np.float32)
    wr = rng.choice(rng.standard_normal(4), (64, 4)).astype(np.float32)
    ws = rng.standard_normal((64, 32)).astype(np.float32)
    h = np.maximum(rng.standard_normal((256, 64)).astype(np.float32) @ w1, 0)
    ws *= np.float32(2.0 / (h @ ws).std())
    model.graph.initializer.extend([
        numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(wr, "wr"), numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.array(100, np.float32), "scale"),
        numpy_helper.from_array(np.array([0], np.int64), "axes")])
    onnx.checker.check_model(model, full_check=True)
    return model


def outputs(model, samples) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [{"out": session.run(None, s)[0]} for s in samples]


def whole_output_cosine(reference: list, candidate: list) -> float:
    """What the pass measured before the contract: the worst cosine of the whole output."""
    return min(float(np.dot(r["out"].ravel(), c["out"].ravel()) / np.linalg.norm(r["out"]) / np.linalg.norm(c["out"]))
               for r, c in zip(reference, candidate))


def test_default_target_keeps_the_scores_view_the_whole_output_cosine_misses(rng):
    model = yolo_head(rng)
    samples = [{"x": rng.standard_normal((16, 64)).astype(np.float32)} for _ in range(32)]
    held_out = held_out_of(samples)  # the pipeline's judged samples: one in four
    judge = Fidelity.build(model, "cos:0.99", held_out, "held-out samples")  # an independent judge
    runs = {}
    for spec in ("cluster(k=4,target=none)", "cluster(k=4)"):
        out, report = run_pipeline(model, parse_pass_list(spec), CalibrationFeed(input_specs(model), samples))
        runs[spec] = (report.passes[0], judge.judge(outputs(out, held_out)), outputs(out, held_out))
    reference = outputs(model, held_out)

    _entry, damaged, damaged_out = runs["cluster(k=4,target=none)"]
    views = {s.view: s for s in damaged.scores}
    assert whole_output_cosine(reference, damaged_out) >= 0.999  # the old check would have accepted k = 4
    assert views["out[values]"].cosine == pytest.approx(1.0)
    assert views["out[scores]"].agreement < 0.99 and not damaged.met()  # but the detections changed

    entry, kept, _ = runs["cluster(k=4)"]
    views = {s.view: s for s in kept.scores}
    assert views["out[scores]"].cosine >= 0.99 and views["out[scores]"].agreement >= 0.99
    assert kept.met()
    assert entry.metrics["target"] == "cos:0.99" and entry.metrics["budget_allowed"] == 1.0
    assert entry.metrics["budget_used"] <= 1.0
    assert entry.metrics["weights_k4"] == 2  # the exact trunk and box weights stay at k
    assert entry.metrics["weights_k4"] + entry.metrics["weights_rows"] < 3  # the score weight moved up
    assert any("binding view out[" in n and "8 held-out calibration samples" in n for n in entry.notes)
    assert entry.metrics["bytes_after"] < entry.metrics["bytes_before"]


def test_older_target_spellings(rng):
    model = yolo_head(rng)
    feed = [{"x": rng.standard_normal((16, 64)).astype(np.float32)} for _ in range(8)]
    _, off = run_pipeline(model, parse_pass_list("cluster(k=4,target=0)"), CalibrationFeed(input_specs(model), feed))
    assert off.passes[0].metrics["weights_k4"] == 3 and "budget_used" not in off.passes[0].metrics
    _, bare = run_pipeline(model, parse_pass_list("cluster(k=4,target=0.995)"),
                           CalibrationFeed(input_specs(model), feed))
    assert bare.passes[0].metrics["target"] == "cos:0.995"
    for bad in ("cos:1.5", "psnr:30"):
        with pytest.raises(UserError, match=r"cluster\(target=") as info:
            resolve(parse_pass_list(f"cluster(target={bad})"))
        assert "\n" not in str(info.value)


def test_first_of_two_lossy_passes_spends_half_the_budget(rng):
    model = yolo_head(rng)
    samples = [{"x": rng.standard_normal((16, 64)).astype(np.float32)} for _ in range(32)]
    _, report = run_pipeline(model, parse_pass_list("cluster(k=4),svd(rank=2,measure=false)"),
                             CalibrationFeed(input_specs(model), samples))
    entry = report.passes[0]
    assert entry.metrics["budget_allowed"] == 0.5 and entry.metrics["budget_used"] <= 0.5
    assert entry.fidelity["allowed"] == 0.5 and entry.fidelity["met"]  # the verifier agrees


def test_run_alone_judges_the_default_target_on_its_own_feed(rng):
    from onnxslim_kit.api import PassContext
    from onnxslim_kit.model import Model
    from onnxslim_kit.passes.cluster import ClusterPass

    model = yolo_head(rng)
    feed = CalibrationFeed(input_specs(model), [{"x": rng.standard_normal((16, 64)).astype(np.float32)}
                                                for _ in range(8)])
    (instance, options), = resolve(parse_pass_list("cluster(k=4)"))
    graph = Model.from_proto(model)
    result = instance.run(graph, PassContext(options=options, feed=feed, original=model))
    assert result.metrics["target"] == "cos:0.99" and result.metrics["budget_used"] <= 1.0
    assert result.metrics["weights_k4"] == 2
    graph.commit()
    verdict = Fidelity.build(model, "cos:0.99", feed.take(8)).judge(outputs(graph.to_proto(), feed.take(8)))
    assert verdict.met()
