"""``fuse,int8`` on real models: loads, runs integer kernels, meets its fidelity target."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
from test_int8 import optimized_ops

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline
from onnxslim_kit.zoo import fetch

pytestmark = pytest.mark.realmodel


def quantize_real(name: str, shape: list, passes: str):
    model = onnx.load(fetch(name))
    specs = input_specs(model)
    feed = CalibrationFeed(specs, None, input_shapes={specs[0].name: shape}, num_samples=4)
    out, report = run_pipeline(model, parse_pass_list(passes), feed, verify_samples=4)
    return model, out, report.passes[-1]


@pytest.mark.parametrize(
    "name, shape, target, kernels",
    [
        ("ppocr_cls_v2", [1, 3, 48, 192], 0.99, {"QLinearConv": 50}),
        ("mtcnn_onet", [1, 48, 48, 3], 0.99, {"QLinearConv": 3, "QGemm": 3}),
    ],
)
def test_fuse_int8_meets_target_and_fuses(name, shape, target, kernels, tmp_path):
    model, out, rep = quantize_real(name, shape, f"fuse,int8(target=cos:{target},eval_samples=4,speed_check=false)")
    assert rep.verification["status"] == "drift"  # loads and runs in ORT, outputs moved
    assert rep.metrics["target"] == f"cos:{target}" and rep.metrics["budget_used"] <= 1
    # the verifier judged the views on the samples the fallback was judged on
    assert rep.fidelity["met"] and min(v["cosine"] for v in rep.fidelity["views"] if "cosine" in v) >= target
    assert min(d["cosine"] for d in rep.verification["outputs"].values()) >= target
    fused = optimized_ops(out, tmp_path)
    for op, least in kernels.items():
        assert fused[op] >= least, (op, fused)
    assert out.ByteSize() < 0.5 * model.ByteSize()
    assert Counter(o.version for o in out.opset_import if o.domain in ("", "ai.onnx")) == Counter([13])


def test_strict_target_falls_back_on_its_own():
    _, _, rep = quantize_real("mtcnn_onet", [1, 48, 48, 3],
                              "fuse,int8(target=cos:0.9995,eval_samples=4,speed_check=false)")
    _, _, loose = quantize_real("mtcnn_onet", [1, 48, 48, 3], "fuse,int8(fallback=false,speed_check=false)")
    if min(d["cosine"] for d in loose.verification["outputs"].values()) >= 0.9995:
        pytest.skip("all-int8 already meets the strict target on these samples")
    assert rep.metrics["layers_float"] + rep.metrics["layers_weights"] + rep.metrics["layers_dynamic"] >= 1
    assert min(d["cosine"] for d in rep.verification["outputs"].values()) >= 0.9995


@pytest.mark.parametrize("name, shape, fallback", [("ppocr_cls_v2", [1, 3, 48, 192], True),
                                                   ("orientation", [1, 3, 224, 224], False)])
def test_hard_swish_and_squeeze_excite_run_in_int8_kernels(name, shape, fallback):
    """Issue 14: ORT has no QLinear HardSigmoid / HardSwish; ``int8`` writes them as QLinearAdd +
    QLinearMul and quantizes the squeeze-excite pools' inputs, so ORT leaves none of the 46
    (ppocr_cls_v2) / 58 (orientation) ``DequantizeLinear → HardSigmoid → Mul → QuantizeLinear``
    float detours it left before (at most the one before the classifier's final pool).
    orientation on random inputs misses the target in int8 (its real pages hold it, 0.99999):
    placement is checked there with ``fallback=false``."""
    from onnxslim_kit.executed import executed

    model, out, rep = quantize_real(name, shape, f"fuse,int8(eval_samples=4,speed_check=false,fallback={fallback})")
    assert rep.fidelity["met"] or not fallback
    ran = executed(out, input_shapes={input_specs(model)[0].name: shape})
    assert ran["int8_mac_share"] == 1.0
    hard = sum(n for path, n in ran["detours"].items() if "HardSigmoid" in path or "HardSwish" in path)
    assert hard <= 1, ran["detours"]
    assert ran["int8_other_ops"].get("QLinearGlobalAveragePool", 0) >= 1


def test_silu_runs_in_int8_kernels_on_yolov8n():
    """Issue 14: YOLOv8n's 57 SiLUs (``x·σ(x)``) ran as float ``DequantizeLinear → Sigmoid → Mul →
    QuantizeLinear`` detours between QLinearConvs; with σ on its fixed grid those between two
    int8 layers run in QLinearSigmoid + QLinearMul (the ones whose Mul feeds a Split, Add or
    Concat stay float: 23 on this model). Placement only: the floor (every layer int8)."""
    from onnxslim_kit.executed import executed

    floor = "fuse,int8(target=none,speed=off,fallback=false,max_range=0,heads=false,concat_ratio=0)"
    model, out, rep = quantize_real("yolov8n_coco", [1, 3, 640, 640], floor)
    assert rep.rewrites["Sigmoid gate→QLinearSigmoid+QLinearMul"] >= 30
    ran = executed(out, input_shapes={input_specs(model)[0].name: [1, 3, 640, 640]})
    assert ran["int8_other_ops"].get("QLinearSigmoid", 0) >= 30 and ran["int8_other_ops"].get("QLinearMul", 0) >= 30
    assert ran["unfused_by_op"].get("Sigmoid", 0) <= 57 - 30, ran["unfused_by_op"]
