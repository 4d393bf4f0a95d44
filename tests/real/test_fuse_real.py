"""`fuse` on the real models of the zoo: BN folded, no more nodes than OnnxSlim, outputs kept.

Acceptance of issue 2: after `fuse`, zero BatchNormalization nodes where a fold exists, no
more nodes than OnnxSlim 0.1.98 leaves on the same file, outputs within 1e-4 relative
(of each output's scale, plus 1e-6 absolute for outputs near zero) under ONNX Runtime with its own optimisations disabled.
"""

import numpy as np
import onnx
import pytest
from conftest import nodes_counting_prelu_once, run_ort

import onnxslim_kit
from onnxslim_kit.zoo import fetch

pytestmark = pytest.mark.realmodel

SHAPES = {
    "ppocrv4_det": {"x": [1, 3, 160, 160]},
    "ppocrv4_rec": {"x": [1, 3, 48, 320]},
    "ppocr_cls_v2": {"x": [1, 3, 48, 192]},
    "orientation": {"x": [1, 3, 224, 224]},
    "mtcnn_pnet": {"input_1": [1, 24, 24, 3]},
    "mtcnn_onet": {"input_3": [1, 48, 48, 3]},
}


def _silero_samples():
    rng = np.random.default_rng(0)
    t = np.arange(512) / 16000
    return [
        {"input": (0.3 * np.sin(2 * np.pi * f * t) + 0.01 * rng.standard_normal(512))[None].astype(np.float32),
         "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
        for f in (150.0, 440.0)
    ]


def _count(proto, op):
    return sum(1 for n in proto.graph.node if n.op_type == op)


def _onnxslim_nodes(path) -> int:
    onnxslim = pytest.importorskip("onnxslim")
    return len(onnxslim.slim(str(path)).graph.node)


@pytest.mark.parametrize("name", sorted(SHAPES) + ["silero_vad"])
def test_fuse_real_model(name):
    path = fetch(name)
    original = onnx.load(path)
    calib = _silero_samples() if name == "silero_vad" else None
    proto, report = onnxslim_kit.optimize(
        path, "fuse", input_shapes=SHAPES.get(name), calib=calib, verify_samples=2, num_samples=2,
    )
    entry = report.passes[0]
    assert not entry.rolled_back, entry.verification
    if entry.modified:
        assert entry.verification["status"] == "ok", entry.verification
    assert _count(proto, "BatchNormalization") == 0
    assert nodes_counting_prelu_once(proto) <= _onnxslim_nodes(path)
    # independent re-check of the outputs, outside the pipeline's own verifier
    samples = calib or onnxslim_kit.CalibrationFeed(
        onnxslim_kit.calibration.input_specs(original), None, SHAPES[name], seed=7).take(1)
    for sample in samples:
        for ref, got in zip(run_ort(original, sample), run_ort(proto, sample)):
            scale = float(np.abs(ref).max())
            assert float(np.abs(ref.astype(np.float64) - got).max()) <= 1e-6 + 1e-4 * scale
