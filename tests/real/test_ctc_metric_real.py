"""A user metric on a real model outside the suite: ddddocr's CTC recognizer ends in raw logits
``[T, 1, 8210]`` (no Softmax, an output named ``387``), so the built-in views judge it by cosine
only; ``docs/examples/ctc_strings_kept.py`` judges the strings it reads (issue 18)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

import onnxslim_kit
from onnxslim_kit.fidelity.context import held_out_of
from onnxslim_kit.zoo import fetch

pytestmark = pytest.mark.realmodel
ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("ctc_strings_kept", ROOT / "docs/examples/ctc_strings_kept.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered_lines(n: int) -> list:
    """The benchmarks' ddddocr calibration lines (``inputs._ddddocr``: prepared as ddddocr
    reads them), without the task metric's character table."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import inputs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return inputs.BUILDERS["ddddocr"]("ddddocr", None, "calib", n, 0)[0]


def test_the_strings_metric_binds_int8_on_ddddocr():
    example = _example()
    calib = rendered_lines(24)
    source = str(fetch("ddddocr"))
    out, report = onnxslim_kit.optimize(source, "fuse,int8(speed=off)", calib=calib, metric=example.strings_kept)
    entry = report.passes[-1]
    assert entry.rewrites.get("Conv→int8", 0) > 0  # int8 kept where the strings hold
    assert report.target == "metric:0.99" and entry.fidelity["met"]
    assert entry.fidelity["binding"].startswith("metric strings_kept score")
    assert {v["view"] for v in entry.fidelity["views"]} == {"387", "metric strings_kept"}  # cosine only beside it
    # measured again here, on the samples the report names: the same score
    held = held_out_of(calib)
    sessions = [ort.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in (source, out.SerializeToString())]
    reference, candidate = ([{"387": s.run(None, x)[0]} for x in held] for s in sessions)
    score = next(v["agreement"] for v in entry.fidelity["views"] if v["view"] == "metric strings_kept")
    assert example.strings_kept(reference, candidate) == pytest.approx(score) and score >= 0.99
    assert example.decode(reference[0]["387"]) and len(reference[0]["387"].shape) == 3


def test_the_built_in_ctc_view_reads_the_strings_the_metric_reads():
    """No ``--metric``: the output ``387`` (a Gemm's projection to 8210 classes, time-major)
    reads as CTC, and its counted agreement is the documented metric's on the same lines."""
    example = _example()
    calib = rendered_lines(24)
    source = str(fetch("ddddocr"))
    out, report = onnxslim_kit.optimize(source, "fuse,int8(speed=off)", calib=calib)
    entry = report.passes[-1]
    (view,) = entry.fidelity["views"]
    assert view["view"] == "387" and view["kind"] == "ctc" and entry.fidelity["met"]
    assert view["agreement"] <= view["observed"] and view["agreement"] >= 0.99
    held = held_out_of(calib)
    sessions = [ort.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in (source, out.SerializeToString())]
    reference, candidate = ([{"387": s.run(None, x)[0]} for x in held] for s in sessions)
    assert example.strings_kept(reference, candidate) == pytest.approx(view["observed"])
