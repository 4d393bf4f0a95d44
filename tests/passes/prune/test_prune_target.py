"""prune's fidelity target (issue 18): without ratio= it removes as much compute as the budget
allows, judged per output view on held-out samples; with ratio= it reports the verdict."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import numpy_helper

import onnxslim_kit
from onnxslim_kit.errors import UserError
from onnxslim_kit.fidelity.context import held_out_of
from onnxslim_kit.passes.prune import PrunePass
from onnxslim_kit.passes.prune.search import MAX_TRIALS
from onnxslim_kit.passes.prune.sensitivity import measured_tensors

# trunk a (64) → b (64); boxes (×100, offset ~1100) read b[0:48], sigmoid scores read b[48:64],
# concatenated YOLO-style [1, N, 4 + 3]; b reads a[48:64] only weakly (a harmless cut)
YOLO = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,16,16] x) => (float[1,256,7] out) {
    c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
    a = Relu (c1)
    c2 = Conv <pads = [1,1,1,1]> (a, w2, b2)
    b = Relu (c2)
    reg = Conv (b, wbox, bbox)
    logit = Conv (b, wcls, bcls)
    box_flat = Reshape (reg, box_shape)
    box = Mul (box_flat, scale)
    cls_flat = Reshape (logit, cls_shape)
    cls = Sigmoid (cls_flat)
    cat = Concat <axis = 1> (box, cls)
    out = Transpose <perm = [0, 2, 1]> (cat)
}
"""


def yolo_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(YOLO)
    w2 = rng.standard_normal((64, 64, 3, 3)) * 0.08
    w2[:, 48:] *= 0.01
    wbox = rng.standard_normal((4, 64, 1, 1)) * 0.2
    wbox[:, 48:] = 0
    wcls = rng.standard_normal((3, 64, 1, 1)) * 0.5
    wcls[:, :48] = 0
    inits = {"w1": rng.standard_normal((64, 3, 3, 3)) * 0.4, "b1": rng.standard_normal(64) * 0.1, "w2": w2,
             "b2": rng.standard_normal(64) * 0.1, "wbox": wbox, "bbox": rng.uniform(10, 12, 4), "wcls": wcls,
             "bcls": np.full(3, -1.1), "box_shape": np.array([1, 4, 256], np.int64),
             "cls_shape": np.array([1, 3, 256], np.int64), "scale": np.array(100.0)}
    for name, value in inits.items():
        value = np.asarray(value)
        model.graph.initializer.append(
            numpy_helper.from_array(value.astype(np.float32) if value.dtype.kind == "f" else value, name))
    for node in model.graph.node:
        node.name = node.output[0]
    onnx.checker.check_model(model, full_check=True)
    return model


MODEL = yolo_model()
RNG = np.random.default_rng(1)
CALIB = [{"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(32)]
HELD_OUT = held_out_of(CALIB)  # what the pipeline holds out (one in four)
REFERENCE = [run_ort(MODEL, s)[0] for s in HELD_OUT]


def _cos(a, b) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def drift(proto) -> dict:
    """Measured here, independently of the judge: the whole output's worst cosine, and the score
    branch's worst cosine and its decision agreement (|A ∩ Â| / |A ∪ Â|, A = scores > 0.25)."""
    got = [run_ort(proto, s)[0] for s in HELD_OUT]
    a = np.concatenate([(r[..., 4:] > 0.25).ravel() for r in REFERENCE])
    b = np.concatenate([(g[..., 4:] > 0.25).ravel() for g in got])
    return {"whole": min(_cos(r, g) for r, g in zip(REFERENCE, got)),
            "scores": min(_cos(r[..., 4:], g[..., 4:]) for r, g in zip(REFERENCE, got)),
            "agreement": float((a & b).sum() / (a | b).sum())}


def run(passes: str):
    out, report = onnxslim_kit.optimize(MODEL, passes, calib=CALIB)
    onnx.checker.check_model(out, full_check=True)
    return out, report.passes[-1]


@pytest.fixture(scope="module")
def searched():
    return run("prune")


def test_search_keeps_the_scores_view_the_whole_output_cosine_would_lose(searched):
    out, entry = searched
    trials = entry.metrics["search"]
    assert 1 <= len(trials) <= MAX_TRIALS + 1  # and the back-off's
    assert 0 < entry.metrics["ratio_reached"] < 1 and entry.rewrites["prune channel"] > 0
    assert entry.metrics["target"] == "cos:0.99" and entry.metrics["budget_used"] <= entry.metrics["budget_allowed"]
    kept = drift(out)
    assert kept["scores"] >= 0.99 and kept["agreement"] >= 0.99  # on the held-out samples
    # the largest amount it rejected: the whole-output cosine would have accepted it, the scores did not
    rejected = max((t for t in trials if not t[3]), key=lambda t: t[0])
    assert rejected[1] > entry.metrics["ratio_reached"]
    damaged, entry_r = run(f"prune(ratio={rejected[0]})")
    assert entry_r.metrics["budget_used"] == pytest.approx(rejected[2], rel=1e-6)  # the same candidate
    worse = drift(damaged)
    assert worse["whole"] >= 0.99  # the old whole-output cosine says fine
    assert worse["agreement"] < 0.99  # the scores' decisions are lost
    assert any("out[scores]" in note and "missed" in note for note in entry_r.notes)


def test_report_names_the_binding_view_and_the_judged_samples(searched):
    _, entry = searched
    (note,) = [n for n in entry.notes if n.startswith("fidelity holds")]
    assert "binds" in note and "out[" in note
    # the search's candidates: the 8 held-out samples and the 8 fit samples the re-fit (16) did not use
    assert "judged on 16 samples: 8 held-out calibration samples" in note
    assert "and 8 fit samples the re-fit did not use" in note and entry.metrics["search_samples"] == 16
    views = {v["view"]: v for v in entry.metrics["views"]}
    assert set(views) == {"out[values]", "out[scores]"}
    assert views["out[scores]"]["agreement"] >= 0.99


def test_a_stricter_own_target_removes_less(searched):
    _, loose = searched
    out, strict = run("prune(target=cos:0.9999)")
    assert strict.metrics["target"] == "cos:0.9999" and strict.metrics["budget_allowed"] == 1.0
    assert strict.metrics["ratio_reached"] < loose.metrics["ratio_reached"]
    if strict.metrics["ratio_reached"] == 0:  # nothing held: the stripped model, and the note says why
        assert "prune channel" not in strict.rewrites
        assert any(n.startswith("no amount held the target") and "binding" in n for n in strict.notes)
        assert drift(out) == {"whole": pytest.approx(1.0), "scores": pytest.approx(1.0), "agreement": 1.0}
    else:
        assert drift(out)["agreement"] >= 0.9999


@pytest.mark.parametrize("target", ["none", "0"])
def test_target_none_is_strip_only_and_lossless(target):
    out, entry = run(f"prune(target={target})")
    assert entry.lossless and not entry.modified and "search" not in entry.metrics


def test_pipeline_target_none_means_no_search():
    out, report = onnxslim_kit.optimize(MODEL, "prune", calib=CALIB, target="none")
    entry = report.passes[-1]
    assert not entry.modified and "search" not in entry.metrics


@pytest.mark.parametrize("text, expected", [("0.995", "0.995"), ("cos:0.98", "cos:0.98"), ("top1:0.9", "top1:0.9"),
                                            ("0", "none"), ("none", "none"), ("", "")])
def test_target_option_accepts_the_old_and_new_spellings(text, expected):
    assert PrunePass.options["target"].convert(text, "prune(target=…)") == expected


@pytest.mark.parametrize("text", ["cos:2", "psnr:30", "cos:x"])
def test_bad_target_is_one_line(text):
    with pytest.raises(UserError) as info:
        PrunePass.options["target"].convert(text, "prune(target=…)")
    assert "\n" not in str(info.value) and "prune(target=…)" in str(info.value)


def test_sensitivity_measures_each_branch_of_a_concatenated_head():
    assert measured_tensors(MODEL) == ["box", "cls_flat"]  # the boxes, and the scores' logits


def test_the_search_backs_off_from_the_largest_amount_that_held(searched):
    assert "backoff_from" not in searched[1].metrics  # 0.8 r selects the same blocks of 16: no back-off
    _, entry = run("prune(multiple=4)")
    found = entry.metrics["backoff_from"]
    last = entry.metrics["search"][-1]  # the back-off's candidate, judged last
    assert last[0] == pytest.approx(0.8 * found, abs=1e-4) and last[3]
    assert entry.metrics["ratio_reached"] == last[1]
    assert any(n.startswith(f"backed off from r={found:.3g}") for n in entry.notes)
    _, eager = run("prune(multiple=4,backoff=0)")
    assert "backoff_from" not in eager.metrics
    assert eager.metrics["ratio_reached"] > entry.metrics["ratio_reached"]
    assert max(t[0] for t in eager.metrics["search"] if t[3]) == pytest.approx(found)  # the same search


@pytest.mark.parametrize("value", ["1", "-0.1"])
def test_backoff_out_of_range_is_one_line(value):
    with pytest.raises(UserError) as info:
        onnxslim_kit.optimize(MODEL, f"prune(backoff={value})", calib=CALIB)
    assert "\n" not in str(info.value) and "backoff" in str(info.value)


def test_spare_samples_stop_where_the_references_would_grow_too_large(monkeypatch):
    from types import SimpleNamespace

    from onnxslim_kit.passes.prune import judged

    feed = SimpleNamespace(take=lambda n: list(range(n)))
    fid = SimpleNamespace(reference=[{"out": np.zeros((1, 1024), np.float32)}])  # 4 KiB a sample
    ctx = SimpleNamespace(feed=feed)
    assert judged.spare_samples(ctx, 16, fid) == list(range(16, 16 + judged.SPARE_SAMPLES))
    monkeypatch.setattr(judged, "SPARE_BYTES", 10 * 4096)
    assert judged.spare_samples(ctx, 16, fid) == list(range(16, 26))
    monkeypatch.setattr(judged, "SPARE_BYTES", 100)
    assert judged.spare_samples(ctx, 16, fid) == []
