"""``svd`` under the fidelity contract: the end-to-end target is judged per output view on
held-out samples, so a score branch beside a large-scale regression branch keeps its decisions."""

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

# a YOLO-style head: box regression ×100 beside sigmoid class scores, one output [1, 8+32, 16]
HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[16, 64] x) => (float[1, 40, 16] out) {
    reg = MatMul(x, wr)
    box = Mul(reg, scale)
    logit = MatMul(x, ws)
    cls = Sigmoid(logit)
    cat = Concat <axis = 1> (box, cls)
    tr = Transpose <perm = [1, 0]> (cat)
    out = Unsqueeze(tr, axes)
}
"""


def yolo_head(rng) -> onnx.ModelProto:
    """The box weight has rank 2 (exact at rank 2), the score weight full rank, scaled so that
    the logits have standard deviation ≈ 2 (many scores near the 0.25 cut)."""
    model = onnx.parser.parse_model(HEAD)
    wr = (rng.standard_normal((64, 2)) @ rng.standard_normal((2, 8))).astype(np.float32)
    ws = (rng.standard_normal((64, 32)) * 0.25).astype(np.float32)
    model.graph.initializer.extend([
        numpy_helper.from_array(wr, "wr"), numpy_helper.from_array(ws, "ws"),
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
    for spec in ("svd(rank=2,measure=false,target=none)", "svd(rank=2,measure=false)"):
        out, report = run_pipeline(model, parse_pass_list(spec), CalibrationFeed(input_specs(model), samples))
        runs[spec] = (report.passes[0], judge.judge(outputs(out, held_out)), outputs(out, held_out), out)
    reference = outputs(model, held_out)

    entry, damaged, damaged_out, _ = runs["svd(rank=2,measure=false,target=none)"]
    assert entry.rewrites == {"matmul → 2 × matmul": 2}
    views = {s.view: s for s in damaged.scores}
    assert whole_output_cosine(reference, damaged_out) >= 0.999  # the old check would have accepted both
    assert views["out[values]"].cosine == pytest.approx(1.0, abs=1e-6)
    assert views["out[scores]"].agreement < 0.99 and not damaged.met()  # but the detections changed

    entry, kept, _, out = runs["svd(rank=2,measure=false)"]
    views = {s.view: s for s in kept.scores}
    assert entry.rewrites == {"matmul → 2 × matmul": 1}
    assert entry.skipped["dropped to hold the output target"] == 1
    assert "ws" in {t.name for t in out.graph.initializer} and "wr" not in {t.name for t in out.graph.initializer}
    assert views["out[scores]"].cosine >= 0.99 and views["out[scores]"].agreement >= 0.99 and kept.met()
    assert entry.metrics["target"] == "cos:0.99" and entry.metrics["budget_allowed"] == 1.0
    assert entry.metrics["budget_used"] <= 1.0
    assert any("binding view out[" in n and "8 held-out calibration samples" in n for n in entry.notes)


def test_older_target_spellings(rng):
    model = yolo_head(rng)
    feed = [{"x": rng.standard_normal((16, 64)).astype(np.float32)} for _ in range(8)]
    _, off = run_pipeline(model, parse_pass_list("svd(rank=2,measure=false,target=0)"),
                          CalibrationFeed(input_specs(model), feed))
    assert off.passes[0].rewrites == {"matmul → 2 × matmul": 2} and "budget_used" not in off.passes[0].metrics
    _, bare = run_pipeline(model, parse_pass_list("svd(rank=2,measure=false,target=0.5)"),
                           CalibrationFeed(input_specs(model), feed))
    assert bare.passes[0].metrics["target"] == "cos:0.5"
    for bad in ("cos:1.5", "psnr:30"):
        with pytest.raises(UserError, match=r"svd\(target=") as info:
            resolve(parse_pass_list(f"svd(target={bad})"))
        assert "\n" not in str(info.value)
