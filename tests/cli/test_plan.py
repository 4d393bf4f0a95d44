"""``plan``: whole-pipeline candidates judged on held-out samples, timed, cached, replayable."""

import json
import re

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit import bench
from onnxslim_kit.cli import main
from onnxslim_kit.plan.candidates import Candidate
from onnxslim_kit.plan.choose import choose, pareto_front

GRAPH = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 3, 8, 8] x) => (float[1, 32] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    r = Relu (c)
    f = Reshape (r, shape)
    y = MatMul (f, w2)
}
"""


def _model() -> onnx.ModelProto:
    proto = onnx.parser.parse_model(GRAPH)
    rng = np.random.default_rng(0)
    proto.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape"),
        numpy_helper.from_array((rng.standard_normal((1024, 32)) * 0.05).astype(np.float32), "w2"),
    ])
    onnx.checker.check_model(proto, full_check=True)
    return proto


@pytest.fixture
def files(tmp_path):
    model, calib = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(_model(), model)
    np.savez(calib, x=np.random.default_rng(1).standard_normal((12, 1, 3, 8, 8)).astype(np.float32))
    return model, calib


def _plan(files, tmp_path, *extra, name="out"):
    model, calib = files
    out = tmp_path / f"{name}.onnx"
    argv = ["plan", str(model), "--calib", str(calib), "-o", str(out), "--runs", "5", "--warmup", "1", "-q",
            "--report", str(tmp_path / f"{name}.plan.json"), *extra]
    assert main(argv) == 0
    return out, json.loads((tmp_path / f"{name}.plan.json").read_text())


def test_plan_writes_the_chosen_model_and_a_recipe_that_replays_byte_identically(files, tmp_path):
    out, report = _plan(files, tmp_path, "--recipe", str(tmp_path / "recipe.json"))
    pipelines = [c["pipeline"] for c in report["candidates"]]
    assert pipelines == ["fuse", "fuse,int8", "fuse,dynamic", "fuse,dynamic(weights=s8)", "fuse,fp16", "fuse,prune",
                         "fuse,prune,int8"]
    chosen = next(c for c in report["candidates"] if c["pipeline"] == report["chosen"])
    fuse = report["candidates"][0]
    assert chosen["met"] and chosen["timing"]["ratio"] <= fuse["timing"]["ratio"]  # never slower than fuse
    assert report["timed"] >= 1 and fuse["timing"] is not None and report["front"]
    recipe = json.loads((tmp_path / "recipe.json").read_text())
    assert ",".join(p["name"] for p in recipe["pass_list"]) == re.sub(r"\([^)]*\)", "", report["chosen"])
    assert recipe["planned"]["pipeline"] == report["chosen"]
    again = tmp_path / "again.onnx"
    assert main([str(files[0]), "--recipe", str(tmp_path / "recipe.json"), "-o", str(again), "-q"]) == 0
    assert again.read_bytes() == out.read_bytes()
    assert len(out.read_bytes()) == chosen["size_bytes"]


def test_a_second_plan_with_the_timing_cache_does_no_timing_and_writes_the_same_bytes(files, tmp_path, monkeypatch):
    cache = tmp_path / "timing.json"
    first, report = _plan(files, tmp_path, "--timing-cache", str(cache), name="a")
    entries = json.loads(cache.read_text())["entries"]
    timed = [c for c in report["candidates"] if c["timing"] and not c["same_as"]]
    confirmed = [key for key in entries if key.endswith("|confirm")]
    assert len(entries) - len(confirmed) == len(timed) == report["timed"]
    assert len(confirmed) == (report["chosen"] != "fuse" or report["confirmation"] is not None)
    assert all(key.split("|")[1:3] == ["CPUExecutionProvider", "1"] for key in entries)

    def no_timing(*_, **__):
        raise AssertionError("timed although every candidate is in the timing cache")

    monkeypatch.setattr(bench, "benchmark", no_timing)
    second, again = _plan(files, tmp_path, "--timing-cache", str(cache), name="b")
    assert second.read_bytes() == first.read_bytes() and again["chosen"] == report["chosen"]
    assert again["timed"] == 0 and again["cache_hits"] == len(entries)
    # another thread count is another machine: not in the cache, so it would be timed
    with pytest.raises(AssertionError, match="timed although"):
        from onnxslim_kit.plan import plan
        from onnxslim_kit.plan.timing_cache import TimingCache

        plan(files[0], calib=files[1], threads=2, timing_cache=TimingCache(cache), runs=2, warmup=0)


def test_a_candidate_that_misses_the_target_is_never_chosen(files, tmp_path):
    # at cos:0.99999 dynamic int8 (the smallest file) misses; goal size would take it otherwise
    _, loose = _plan(files, tmp_path, "--goal", "size", name="loose")
    _, tight = _plan(files, tmp_path, "--goal", "size", "--target", "cos:0.99999", name="tight")
    sizes = {c["pipeline"]: c["size_bytes"] for c in tight["candidates"] if c["size_bytes"] is not None}
    missed = [c["pipeline"] for c in tight["candidates"] if not c["met"]]
    smallest = min(sizes, key=sizes.get)
    assert missed and smallest in missed and tight["chosen"] not in missed
    assert next(c for c in tight["candidates"] if c["pipeline"] == tight["chosen"])["met"]
    held = {c["pipeline"]: c for c in loose["candidates"]}[smallest]
    assert held["met"] and held["size_bytes"] < sizes[tight["chosen"]]  # only the target kept it out
    assert "fuse,cluster" in sizes and tight["timed"] == 0  # goal size: no timing
    assert all(c["timing"] is None for c in tight["candidates"])


def _fake(pipeline, ratio, size, met=True, used=0.5):
    c = Candidate(pipeline, proto=object(), sha256=pipeline, size_bytes=size, met=met, used=used)
    c.timing = {"ratio": ratio, "spread": [ratio, ratio]}
    return c


def test_choose_takes_the_fastest_that_holds_ties_go_to_the_smaller_never_slower_than_fuse():
    fuse, int8, dyn, fp16 = (_fake("fuse", 0.80, 100, used=0.0), _fake("fuse,int8", 0.60, 30),
                             _fake("fuse,dynamic", 0.40, 25, met=False), _fake("fuse,fp16", 0.61, 50))
    assert choose([fuse, int8, dyn, fp16], "latency") is int8  # dynamic is faster but misses
    small = _fake("fuse,prune,int8", 0.615, 20)
    assert choose([fuse, int8, dyn, fp16, small], "latency") is small  # within 3 %: the smaller
    slower = _fake("fuse,int8", 0.81, 30)
    assert choose([fuse, slower], "latency") is fuse  # within 3 % of fuse but slower: fuse
    assert choose([fuse, int8, dyn, fp16], "size") is int8
    assert pareto_front([fuse, int8, dyn, fp16]) == ["fuse", "fuse,int8"]  # fp16 is dominated by int8


def test_the_time_budget_skips_later_pipelines(files, tmp_path):
    _, report = _plan(files, tmp_path, "--budget-s", "1e-9")
    states = {c["pipeline"]: c["skipped"] for c in report["candidates"]}
    assert states["fuse"] is None and report["chosen"] == "fuse" and report["budget_stopped"]
    assert all(re.fullmatch(r"time budget of 1e-09 s spent", states[p]) for p in states if p != "fuse")


@pytest.mark.parametrize("extra, match", [
    (["--goal", "speed"], r"argument --goal: invalid choice: 'speed'"),
    (["--threads", "-1"], r"argument --threads: expected one integer >= 0"),
    (["--budget-s", "0"], r"argument --budget-s: expected seconds > 0"),
    (["--providers", "cpu,cuda"], r"plan times on one provider"),
    (["--target", "cos:2"], r"--target"),
    (["--runs", "0"], r"argument --runs: expected an integer >= 1"),
    (["--timing-cache", "BAD"], r"--timing-cache .*: not JSON"),
    (["--report", "OUT"], r"the output model|must be different files"),
])
def test_bad_flags_are_one_line_errors(files, tmp_path, capsys, extra, match):
    (tmp_path / "BAD").write_text("{not json")
    out = tmp_path / "OUT"
    extra = [str(tmp_path / "BAD") if a == "BAD" else str(out) if a == "OUT" else a for a in extra]
    argv = ["plan", str(files[0]), "--calib", str(files[1]), "-o", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and re.search(match, err), err
    assert not out.exists()


def test_no_model_or_a_missing_one_is_a_one_line_error(tmp_path, capsys):
    assert main(["plan"]) == 2
    assert main(["plan", str(tmp_path / "nope.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: plan: no model given (see plan --help)", f"error: plan: {tmp_path / 'nope.onnx'}: no such file"]


def test_the_timing_cache_is_keyed_by_model_and_machine_and_ignores_another_original(tmp_path):
    from onnxslim_kit.plan.timing_cache import TimingCache, cpu_model, machine_fields

    machine = machine_fields("CPUExecutionProvider", 1)
    assert machine["cpu"] == cpu_model() and machine["threads"] == 1 and machine["onnxruntime"]
    cache = TimingCache()
    cache.put("a" * 64, machine, "ref", {"ratio": 0.5, "spread": [0.4, 0.6], "median_ms": 1.0})
    path = tmp_path / "cache.json"
    path.write_text(cache.to_json())
    again = TimingCache(path)
    assert again.get("a" * 64, machine, "ref")["ratio"] == 0.5 and again.hits == 1
    assert again.get("a" * 64, machine, "another original") is None
    assert again.get("a" * 64, {**machine, "threads": 2}, "ref") is None
    assert again.get("b" * 64, machine, "ref") is None and again.hits == 1


def test_goal_memory_takes_the_smallest_session_peak_that_holds_and_caches_the_peaks(files, tmp_path, monkeypatch):
    cache = tmp_path / "memory.json"
    page = tmp_path / "m.html"
    first, report = _plan(files, tmp_path, "--goal", "memory", "--timing-cache", str(cache), "--html", str(page),
                          name="m1")
    feasible = [c for c in report["candidates"] if c["met"] and not c["same_as"] and not c["error"]]
    peaks = {c["pipeline"]: c["memory"]["peak_mb"] for c in feasible}
    chosen = report["chosen"]
    assert all(p > 0 for p in peaks.values()) and report["timed"] == 0  # peaks, no latency timing
    assert peaks[chosen] <= min(peaks.values()) * 1.03 and peaks[chosen] <= peaks["fuse"]
    entries = json.loads(cache.read_text())["entries"]
    peak_entries = {k: e for k, e in entries.items() if k.endswith("|memory")}
    assert len(peak_entries) == report["measured"] == len(feasible) + 1  # the original as well
    assert all(entry["peak_mb"] > 0 for entry in peak_entries.values())
    assert sum(k.endswith("|profile") for k in entries) == 2  # --html: the original's and the chosen's op profile
    assert report["reference"]["peak_mb"] > 0
    front = page.read_text().split("<h2>Pareto front</h2>")[1].split("</svg>")[0]
    assert "session peak (MB)" in front and front.count('class="mark"') == len(feasible)

    def no_measuring(*_, **__):
        raise AssertionError("measured although every peak is in the timing cache")

    monkeypatch.setattr(bench, "peak_memory", no_measuring)
    second, again = _plan(files, tmp_path, "--goal", "memory", "--timing-cache", str(cache), "--html", str(page),
                          name="m2")
    assert second.read_bytes() == first.read_bytes() and again["chosen"] == chosen
    assert again["measured"] == 0 and all(c["memory"]["cached"] for c in again["candidates"] if c["memory"])
    assert again["profiles"]["chosen"]["cached"] and again["profiles"]["original"] == {
        **report["profiles"]["original"], "cached": True}


def test_choose_under_goal_memory_mirrors_the_latency_rules():
    def fake(pipeline, peak, size, met=True):
        c = _fake(pipeline, 1.0, size, met=met, used=0.0 if pipeline == "fuse" else 0.5)
        c.timing, c.memory = None, {"peak_mb": peak}
        return c

    fuse, int8, dyn, fp16 = fake("fuse", 20.0, 100), fake("fuse,int8", 12.0, 30), fake("fuse,dynamic", 8.0, 25,
                                                                                        met=False), fake("fuse,fp16", 12.2, 20)
    assert choose([fuse, int8, dyn, fp16], "memory") is fp16  # dynamic misses; fp16 within 3 % and smaller
    assert choose([fuse, fake("fuse,int8", 20.4, 30)], "memory") is fuse  # within 3 % but above fuse's peak
    assert pareto_front([fuse, int8, fp16]) == ["fuse", "fuse,int8", "fuse,fp16"]
    assert pareto_front([fuse, int8, fake("fuse,fp16", 12.5, 40)]) == ["fuse", "fuse,int8"]


def test_the_plans_timing_cache_holds_int8s_layer_timings_so_a_second_plan_times_nothing(files, tmp_path,
                                                                                          monkeypatch):
    """With ``speed=auto`` (the environment unset), int8's per-layer timings go to the plan's
    ``--timing-cache``: a second plan on a machine whose own cache folder is empty times nothing."""
    from onnxslim_kit.passes.int8 import layer_speed

    def fake_pair(fields):
        ratio = 0.5 if fields["op"] == "MatMul" else 2.0  # the Conv "slower in int8"
        return {"ratio": ratio, "spread": [ratio, ratio], "float_ms": 1.0, "int8_ms": ratio, "rounds": 3, "reps": 1}

    monkeypatch.delenv(layer_speed.SPEED_ENV, raising=False)
    monkeypatch.setenv("ONNXSLIM_KIT_CACHE", str(tmp_path / "machine-a"))
    monkeypatch.setattr(layer_speed, "time_pair", fake_pair)
    cache = tmp_path / "timing.json"
    first, report = _plan(files, tmp_path, "--timing-cache", str(cache), "--pipelines", "fuse;fuse,int8", name="a")
    keys = json.loads(cache.read_text())["entries"]
    assert sum(k.startswith("int8-layer|") for k in keys) == 2  # the Conv and the MatMul kind
    assert not (tmp_path / "machine-a" / "timings.json").exists()
    int8_run = next(c for c in report["candidates"] if c["pipeline"] == "fuse,int8")
    assert int8_run["error"] is None

    def no_timing(*_, **__):
        raise AssertionError("timed although the plan's cache holds it")

    monkeypatch.setenv("ONNXSLIM_KIT_CACHE", str(tmp_path / "machine-b"))
    monkeypatch.setattr(layer_speed, "time_pair", no_timing)
    monkeypatch.setattr(bench, "benchmark", no_timing)
    second, again = _plan(files, tmp_path, "--timing-cache", str(cache), "--pipelines", "fuse;fuse,int8", name="b")
    assert second.read_bytes() == first.read_bytes() and again["chosen"] == report["chosen"]
    assert json.loads(cache.read_text())["entries"] == keys
    assert layer_speed.TIMINGS_ENV not in __import__("os").environ  # restored after the plan
