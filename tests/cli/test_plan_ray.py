"""``plan --executor ray`` on a real local Ray cluster (``ray.init(num_cpus=2)``, no mocks):
the same choice and the same bytes as ``--executor local`` given the same timing cache, the
timing as one task after every optimize task, and a one-line error without Ray."""

import importlib
import json
import os
import shutil
import sys

import numpy as np
import onnx
import pytest

from onnxslim_kit.cli import main
from onnxslim_kit.errors import EXIT_BAD_INPUT

from test_plan import _model

PIPELINES = "fuse;fuse,int8;fuse,fp16"
VOLATILE = {"seconds", "argv", "output_path", "cached"}  # wall times, the command line, where it went


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install onnxslim_kit[ray])")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture
def files(tmp_path):
    model, calib = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(_model(), model)
    np.savez(calib, x=np.random.default_rng(1).standard_normal((12, 1, 3, 8, 8)).astype(np.float32))
    return model, calib


def _plan(files, tmp_path, name, *extra, pipelines=PIPELINES):
    model, calib = files
    out = tmp_path / f"{name}.onnx"
    argv = ["plan", str(model), "--calib", str(calib), "-o", str(out), "--runs", "5", "--warmup", "1", "-q",
            "--pipelines", pipelines, "--report", str(tmp_path / f"{name}.plan.json"),
            "--recipe", str(tmp_path / f"{name}.recipe.json"), *extra]
    assert main(argv) == 0
    recipe = json.loads((tmp_path / f"{name}.recipe.json").read_text())
    return out.read_bytes(), json.loads((tmp_path / f"{name}.plan.json").read_text()), recipe


def _stable(value):
    """``value`` without what differs between two runs of the same plan (VOLATILE keys)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def test_ray_and_local_choose_the_same_and_write_the_same_bytes_with_the_same_cache(ray_cluster, files, tmp_path):
    cache = tmp_path / "timing.json"
    local, local_report, local_recipe = _plan(files, tmp_path, "local", "--timing-cache", str(cache))
    assert local_report["timed"] >= 1 and local_report["executor"] == {"name": "local"}
    shutil.copy(cache, tmp_path / "before.json")
    remote, report, recipe = _plan(files, tmp_path, "ray", "--timing-cache", str(cache), "--executor", "ray")
    assert report["executor"]["name"] == "ray" and report["timed"] == 0  # every timing from the cache
    assert cache.read_text() == (tmp_path / "before.json").read_text()
    assert remote == local and report["chosen"] == local_report["chosen"]
    assert [c["pipeline"] for c in report["candidates"]] == ["fuse", "fuse,int8", "fuse,fp16"]
    assert [(c["sha256"], c["met"], c["same_as"]) for c in report["candidates"]] == \
        [(c["sha256"], c["met"], c["same_as"]) for c in local_report["candidates"]]
    assert _stable(recipe) == _stable(local_recipe)
    assert recipe["input_path"] == str(files[0]) and recipe["sources"]["calib"] == {"path": str(files[1])}
    tasks = report["executor"]["tasks"]
    assert sorted(t["pipeline"] for t in tasks) == ["fuse", "fuse,fp16", "fuse,int8"]
    assert all(t["kind"] == "optimize" and t["pid"] != os.getpid() for t in tasks)  # in workers, not here
    # the recipe replays to the same bytes without Ray
    again = tmp_path / "again.onnx"
    assert main([str(files[0]), "--recipe", str(tmp_path / "ray.recipe.json"), "-o", str(again), "-q"]) == 0
    assert again.read_bytes() == remote


def test_the_timing_is_one_task_started_after_every_optimize_task_ended(ray_cluster, files, tmp_path):
    _, report, _ = _plan(files, tmp_path, "ray", "--executor", "ray")
    tasks = report["executor"]["tasks"]
    timing = [t for t in tasks if t["kind"] == "timing"]
    optimize = [t for t in tasks if t["kind"] == "optimize"]
    confirmation = report["confirmation"]  # a choice other than fuse: one more timing task, after the first
    assert len(timing) == 1 + (confirmation is not None) and len(optimize) == 3
    timed = [c["pipeline"] for c in report["candidates"] if c["timing"] and not c["same_as"]]
    assert timing[0]["pipelines"] == timed and report["timed"] == len(timed) >= 1
    if confirmation is not None:
        assert timing[1]["pipelines"] == ["fuse", confirmation["pipeline"]]
        assert timing[1]["started"] >= timing[0]["ended"]
    for task in timing:
        assert task["started"] >= max(t["ended"] for t in optimize)  # never beside an optimize run
        assert task["node"] == ray_cluster.get_runtime_context().get_node_id()  # the driver's node
        assert task["pid"] != os.getpid()


def test_without_ray_the_ray_executor_is_a_one_line_error(files, tmp_path, monkeypatch, capsys):
    real = importlib.import_module

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_ray)
    monkeypatch.setitem(sys.modules, "ray", None)
    model, calib = files
    out = tmp_path / "out.onnx"
    code = main(["plan", str(model), "--calib", str(calib), "-o", str(out), "--executor", "ray"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and not out.exists()
    assert len(err) == 1 and "pip install onnxslim_kit[ray]" in err[0] and "--executor ray" in err[0]


@pytest.mark.parametrize("extra, message", [
    (["--pipelines", "fuse;fuse,nosuchpass"], "--pipelines 'fuse,nosuchpass': unknown pass 'nosuchpass'"),
    (["--pipelines", "fuse,int8;fuse,int8"], "--pipelines: 'fuse,int8' is named twice"),
    (["--pipelines", " ; "], "--pipelines: no pipeline given"),
    (["--ray-address", "localhost:6379"], "--ray-address is for --executor ray"),
])
def test_bad_pipelines_and_a_ray_address_without_ray_are_one_line_errors(files, tmp_path, capsys, extra, message):
    model, calib = files
    code = main(["plan", str(model), "--calib", str(calib), "-o", str(tmp_path / "o.onnx"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and len(err) == 1 and message in err[0]


def test_pipelines_are_tried_with_fuse_first(files, tmp_path):
    _, report, _ = _plan(files, tmp_path, "sub", "--goal", "size", pipelines="fuse,fp16")
    assert [c["pipeline"] for c in report["candidates"]] == ["fuse", "fuse,fp16"]
    assert report["settings"]["pipelines"] == ["fuse", "fuse,fp16"] and report["timed"] == 0


def test_at_the_budget_the_unfinished_tasks_are_cancelled_and_fuse_always_finishes(ray_cluster, files, tmp_path):
    # 4 pipelines on 2 CPUs: when fuse (submitted first) ends, the budget is long spent and at
    # least one later pipeline has not finished (it waits for a CPU behind the other)
    _, report, _ = _plan(files, tmp_path, "budget", "--executor", "ray", "--goal", "size", "--budget-s", "0.001",
                         pipelines="fuse;fuse,int8;fuse,fp16;fuse,prune,int8")
    by_pipeline = {c["pipeline"]: c for c in report["candidates"]}
    assert list(by_pipeline) == ["fuse", "fuse,int8", "fuse,fp16", "fuse,prune,int8"]
    assert by_pipeline["fuse"]["met"] and report["chosen"] in by_pipeline
    skipped = {p for p, c in by_pipeline.items() if c["skipped"]}
    ran = {t["pipeline"] for t in report["executor"]["tasks"]}
    assert skipped and report["budget_stopped"] and "fuse" in ran and ran == set(by_pipeline) - skipped
    assert all(by_pipeline[p]["skipped"] == "time budget of 0.001 s spent" for p in skipped)


def test_pipelines_split_at_the_semicolons_outside_parentheses():
    from onnxslim_kit.plan.candidates import checked_pipelines

    text = "fuse,int8(speed=off);fuse,prune(exclude=op:Softmax; re:^head/)"
    assert checked_pipelines(text, "latency") == ("fuse", "fuse,int8(speed=off)",
                                                  "fuse,prune(exclude=op:Softmax; re:^head/)")
    assert checked_pipelines(None, "size")[-1] == "fuse,cluster"
