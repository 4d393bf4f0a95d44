"""docs/fidelity.md's worked example (a detector metric) runs as written, through --metric."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxslim_kit

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
CLASSES, ANCHORS = 3, 64


def _example_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return next(b for b in blocks if "def detections_kept" in b)


def _detector() -> onnx.ModelProto:
    """x [1, 8, N] → boxes = 100·Conv₁(x) (cx, cy, w, h), scores = σ(Conv₂(x)) → Concat [1, 4+C, N]."""
    rng = np.random.default_rng(0)
    wb = rng.normal(0, 0.3, (4, 8, 1)).astype(np.float32)
    wc = rng.normal(0, 1.5, (CLASSES, 8, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "wb"], ["reg"]),
        helper.make_node("Abs", ["reg"], ["pos"]),
        helper.make_node("Mul", ["pos", "hundred"], ["box"]),
        helper.make_node("Conv", ["x", "wc"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["cls"]),
        helper.make_node("Concat", ["box", "cls"], ["output0"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, ANCHORS])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + CLASSES, ANCHORS])],
        [numpy_helper.from_array(wb, "wb"), numpy_helper.from_array(wc, "wc"),
         numpy_helper.from_array(np.array(100.0, np.float32), "hundred")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_documented_detector_metric_binds_the_target(tmp_path, monkeypatch):
    (tmp_path / "detections_kept.py").write_text(_example_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("detections_kept")
    model = _detector()
    rng = np.random.default_rng(1)
    calib = {"x": rng.normal(0, 1, (8, 1, 8, ANCHORS)).astype(np.float32)}
    proto, report = onnxslim_kit.optimize(model, "fuse,fp16", calib=[{"x": s} for s in calib["x"]],
                                          metric=module.detections_kept, target="metric:0.9")
    fidelity = report.passes[-1].fidelity
    assert fidelity["binding"].startswith("metric detections_kept score")
    assert {v["view"] for v in fidelity["views"]} >= {"output0[values]", "output0[scores]"}
    # the original finds detections on these samples, so the metric measures something
    from onnxslim_kit.runtime import make_session, run

    outputs = [run(make_session(model), {"x": s}) for s in calib["x"][:2]]
    assert sum(len(module.detect(o["output0"][0])) for o in outputs) > 0
    assert module.detections_kept(outputs, outputs) == 1.0

    onnx.save(model, tmp_path / "det.onnx")
    np.savez(tmp_path / "calib.npz", **calib)
    done = subprocess.run(
        [sys.executable, "-m", "onnxslim_kit", "det.onnx", "--passes", "fuse,fp16", "--calib", "calib.npz",
         "--metric", "detections_kept:detections_kept", "--target", "metric:0.9", "-o", "out.onnx",
         "--report", "r.json", "-q"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["metric"] == "detections_kept:detections_kept" and saved["target"] == "metric:0.9"
