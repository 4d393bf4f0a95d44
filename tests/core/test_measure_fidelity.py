"""The pure comparison and rendering of ``benchmarks/measure_fidelity.py`` (issue 18's honesty
benchmark), on report and bench dicts made by hand whose answers can be worked out on paper.

``benchmarks/`` is a folder of scripts, not a package: the module is imported from its file
with the folder on ``sys.path`` for the duration of the module, as
``tests/core/test_detection_metric.py`` does. No model is run.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def mf():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("measure_fidelity")
    finally:
        sys.path.remove(str(BENCH))


def _report(views, used=0.5, rolled_back=False):
    fidelity = {"target": "cos:0.99", "used": used, "binding": "out[scores] agreement 0.9950", "samples": 8,
                "views": views, "allowed": 1.0, "met": used <= 1, "pipeline_met": used <= 1,
                "judged_on": "held-out calibration samples"}
    return {"target": "cos:0.99", "passes": [
        {"name": "fuse", "lossless": True, "modified": True, "rolled_back": False, "fidelity": None, "metrics": {}},
        {"name": "prune", "lossless": False, "modified": False, "rolled_back": False, "fidelity": None,
         "metrics": {}},
        {"name": "int8", "lossless": False, "modified": True, "rolled_back": rolled_back, "fidelity": fidelity,
         "metrics": {"budget_used": used}},
    ]}


HELD = [{"view": "out[values]", "kind": "values", "cosine": 0.9999, "rel": 0.01, "worst_sample": 2},
        {"view": "out[scores]", "kind": "scores", "cosine": 0.995, "rel": 0.2, "agreement": 1.0, "worst_sample": 5}]
EVAL = [{"view": "out[values]", "kind": "values", "cosine": 0.9995, "rel": 0.02, "worst_sample": 0},
        {"view": "out[scores]", "kind": "scores", "cosine": 0.98, "rel": "inf", "agreement": 0.97, "worst_sample": 9},
        {"view": "idx", "kind": "exact", "agreement": 1.0, "worst_sample": 0}]


def test_last_fidelity_is_the_last_kept_lossy_verdict(mf):
    assert mf.last_fidelity(_report(HELD))["pass"] == "int8"
    assert mf.last_fidelity(_report(HELD, rolled_back=True)) is None
    assert mf.last_fidelity({"passes": []}) is None


def test_compare_views_differences_and_tolerance(mf):
    rows = {r["view"]: r for r in mf.compare_views(HELD, EVAL)}
    assert list(rows) == ["out[values]", "out[scores]", "idx"]  # the report's order, then bench-only views
    values, scores, idx = rows["out[values]"], rows["out[scores]"], rows["idx"]
    assert values["cosine_delta"] == pytest.approx(0.0004) and values["agreement_delta"] is None
    assert values["within"] is True
    assert scores["cosine_delta"] == pytest.approx(0.015) and scores["agreement_delta"] == pytest.approx(0.03)
    assert scores["within"] is False
    assert scores["rel_eval"] == math.inf  # "inf" as the fidelity dicts write it
    assert idx["cosine_held"] is None and idx["within"] is None  # nothing to compare against


def test_a_difference_of_exactly_the_tolerance_is_within(mf):
    held = [{"view": "p", "kind": "probs", "cosine": 1.0, "agreement": 1.0}]
    at = [{"view": "p", "kind": "probs", "cosine": 0.99, "agreement": 0.99}]  # |Δ| = 0.01 (in binary a hair over)
    over = [{"view": "p", "kind": "probs", "cosine": 0.9899, "agreement": 1.0}]
    assert mf.compare_views(held, at)[0]["within"] is True
    assert mf.compare_views(held, over)[0]["within"] is False


def test_eval_budget_uses_the_targets_formula(mf):
    # losses: cos 1 − 0.98 = 0.02, decision 1 − 0.97 = 0.03 (worst over views), rel inf
    assert mf.eval_used(EVAL, "cos:0.99") == pytest.approx(3.0)
    assert mf.eval_used(EVAL, "top1:0.95") == pytest.approx(0.6)
    assert mf.eval_used(EVAL[:1], "rel:0.1") == pytest.approx(0.2)
    assert mf.eval_used(EVAL, "none") == 0.0
    assert mf.eval_used(None, "cos:0.99") is None


def test_decision_views_must_keep_cosine_and_agreement(mf):
    kept = mf.decisions_kept(EVAL)
    assert kept["ok"] is False and kept["views"] == 2  # scores + exact; the values view does not count
    assert kept["failing"] == ["out[scores] cos 0.9800, agree 0.9700"]
    fine = [dict(EVAL[1], cosine=0.995, agreement=0.99), EVAL[2], dict(EVAL[0], cosine=0.5)]
    assert mf.decisions_kept(fine) == {"ok": True, "failing": [], "views": 2}
    assert mf.decisions_kept(EVAL[:1])["ok"] is None  # no decision view: nothing to hold


def test_task_figures_detections_kept(mf):
    detector = {"task": "detections kept", "score": 0.9, "score_original": 0.92, "agreement": 0.94,
                "kept_mean": 0.94, "kept_worst": 0.5}
    figures = mf.task_figures(detector)
    assert figures["kept_ok"] is False and figures["kept_worst"] == 0.5
    assert mf.task_figures(dict(detector, kept_mean=0.95))["kept_ok"] is True
    assert "kept_mean" not in mf.task_figures({"task": "accuracy", "score": 1.0, "score_original": 1.0,
                                                "agreement": 1.0})
    assert mf.task_figures(None) == {}


def test_speed_against_original_and_fuse(mf):
    rows = {"original": {"latency_ratio_vs_first": 1.0},
            "fuse": {"latency_ratio_vs_first": 0.8},
            "fuse,int8": {"latency_ratio_vs_first": 0.5, "latency_ratio_spread": [0.4, 0.6],
                          "latency_ms": {"median": 2.0}}}
    sp = mf.speed(rows, "fuse,int8")
    assert sp["x_original"] == 0.5 and sp["x_fuse"] == pytest.approx(0.625) and sp["faster_than_fuse"] is True
    slower = mf.speed({**rows, "fuse": {"latency_ratio_vs_first": 0.4}}, "fuse,int8")
    assert slower["x_fuse"] == pytest.approx(1.25) and slower["faster_than_fuse"] is False
    assert mf.speed({"fuse,int8": rows["fuse,int8"]}, "fuse,int8")["x_fuse"] is None


def test_control_and_lossy_passes(mf):
    same = [dict(HELD[0]), dict(HELD[1], cosine=0.9951)]
    control = mf.control_check(mf.last_fidelity(_report(HELD)), same)
    assert control["worst_delta"] == pytest.approx(0.0001) and control["compared"] == 3
    report = _report(HELD, used=0.25)
    report["passes"][2]["metrics"].update(layers_int8=12, layers_float=3)
    passes = mf.pass_entries(report)
    assert [p["name"] for p in passes] == ["prune", "int8"]  # after fuse
    assert mf.passes_text(passes) == "prune unchanged, int8 0.25/1.00 (int8 12, float 3)"
    report["passes"][1].update(lossless=True, modified=True)
    report["passes"][2]["rolled_back"] = True
    assert mf.passes_text(mf.pass_entries(report)) == "prune lossless, int8 rolled back (int8 12, float 3)"


def _results(mf, entries):
    return {"command": "python benchmarks/measure_fidelity.py --models m", "started_utc": "2026-12-02T06:00+00:00",
            "finished_utc": None, "calib": 32, "eval": 32, "runs": 5, "warmup": 1,
            "versions": {"onnxruntime": "1.0", "torch": None}, "cpu": {"model": "cpu", "logical_cpus": 2},
            "models": {"m": {"load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 1.0, 1.0], "seconds": 3.0,
                             "fuse": {"x_original": 0.8, "error": None}, "pipelines": entries},
                       "gone": {"skipped": "ModuleNotFoundError: torch"}}}


def test_markdown_tables(mf):
    rows = {"fuse": {"latency_ratio_vs_first": 0.8},
            "fuse,int8": {"views": EVAL, "latency_ratio_vs_first": 0.5, "latency_ratio_spread": [0.4, 0.6],
                          "metric": {"task": "detections kept", "score": 0.9, "score_original": 0.9,
                                     "agreement": 0.9, "kept_mean": 0.9, "kept_worst": 0.5}}}
    summary = mf.summarize(_report(HELD), rows["fuse,int8"], rows, "fuse,int8")
    entries = [{"pipeline": "fuse,int8", "tool": {"wall_seconds": 12.0, "peak_rss_mb": 150.0}, "error": None,
                "summary": summary},
               {"pipeline": "fuse,prune,int8", "tool": {}, "error": "exit 1: boom | bang"}]
    text = mf.markdown(_results(mf, entries))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| model | pipeline | passes after fuse"))
    row = next(line for line in lines if line.startswith("| m | fuse,int8 | prune unchanged"))
    assert row.count("|") == header.count("|")  # no stray pipe from a view name or an error
    assert "0.500 / 3.000" in row and "**no**: out[scores] cos 0.9800, agree 0.9700" in row
    assert "1/2 (worst Δ 0.0300)" in row and "90.0% (worst 50%) **< 95 %**" in row and "0.62×" in row
    failed = next(line for line in lines if line.startswith("| m | fuse,prune,int8 |"))
    assert "failed: exit 1: boom / bang" in failed and failed.count("|") == header.count("|")
    view_row = next(line for line in lines if line.startswith("| m | fuse,int8 | out[scores] |"))
    view_header = next(line for line in lines if line.startswith("| model | pipeline | view |"))
    assert view_row.count("|") == view_header.count("|") == len(mf.VIEW_HEADER) + 1
    assert "0.99500 | 0.98000 | 0.0150 | 1.0000 | 0.9700 | 0.0300 | **no** |" in view_row
    assert "State: partial" in text and "gone: skipped: ModuleNotFoundError: torch" in text
    assert "torch" not in text.split("Versions:")[1].splitlines()[0]  # absent packages are not listed


def test_write_gives_strict_json(mf, tmp_path):
    summary = mf.summarize(_report(HELD), {"views": EVAL}, {}, "p")
    summary["views"][0]["cosine_held"] = float("nan")
    md, js = mf.write(_results(mf, [{"pipeline": "p", "error": None, "tool": {}, "summary": summary}]), tmp_path,
                      "fidelity-test")

    def reject(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(js.read_text(), parse_constant=reject)
    views = data["models"]["m"]["pipelines"][0]["summary"]["views"]
    assert views[0]["cosine_held"] == "nan" and views[1]["rel_eval"] == "inf"
    assert md.read_text().startswith("# Fidelity honesty (issue 18)")


def test_chunk_range_of_the_eval_set(mf):
    rows = mf.compare_views(HELD, EVAL)
    chunks = [[{"view": "out[scores]", "cosine": 0.98, "agreement": 0.97}, {"view": "out[values]", "cosine": 0.9999}],
              [{"view": "out[scores]", "cosine": 0.99, "agreement": 0.995}, {"view": "out[values]", "cosine": 1.0}],
              None]  # a chunk the bench could not score
    by = {r["view"]: r for r in mf.add_chunks(rows, chunks)}
    assert by["out[scores]"]["cosine_chunks"] == [0.98, 0.99] and by["out[scores]"]["agreement_chunks"] == [0.97, 0.995]
    # held-out cos 0.995 ≤ 0.99 + 0.01 and agreement 1.0 ≤ 0.995 + 0.01: within the chunks' range
    assert by["out[scores]"]["in_chunk_range"] is True
    assert by["out[values]"]["in_chunk_range"] is True and by["idx"]["in_chunk_range"] is None
    far = mf.add_chunks(mf.compare_views(HELD, EVAL), [[{"view": "out[scores]", "cosine": 0.9, "agreement": 0.9}]])
    assert next(r for r in far if r["view"] == "out[scores]")["in_chunk_range"] is False
