"""The large-model builder (``benchmarks/build_large_decoder.py``) at a ~1 MB size.

``benchmarks/`` is a folder of scripts, not a package: the builder is imported from its file.
Checked: the same flags give byte-identical files and another seed other bytes; the files are
the ones ``onnx.save_model(save_as_external_data=True)`` writes for the model held in memory;
the model passes the full checker, ONNX Runtime runs it at two batch/sequence shapes, and it is
a decoder (causal: an output position does not depend on later inputs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

BUILDER = Path(__file__).resolve().parents[2] / "benchmarks" / "build_large_decoder.py"
TINY = dict(layers=2, hidden=96, mlp=384, vocab=256, features=16)


@pytest.fixture(scope="module")
def builder():
    spec = importlib.util.spec_from_file_location("build_large_decoder", BUILDER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _build(builder, folder: Path, **flags) -> Path:
    out = folder / "decoder.onnx"
    builder.main([*(f"--{k}={v}" for k, v in {**TINY, **flags}.items()), "--out", str(out)])
    return out


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_same_flags_same_bytes_other_seed_other_bytes(builder, tmp_path):
    a, b = _build(builder, tmp_path / "a"), _build(builder, tmp_path / "b")
    c = _build(builder, tmp_path / "c", seed=1)
    data = [Path(str(p) + ".data") for p in (a, b, c)]
    assert 0.8e6 < data[0].stat().st_size < 1.5e6  # the ~1 MB test size
    assert (_sha(a), _sha(data[0])) == (_sha(b), _sha(data[1]))
    graphs = [onnx.load(str(path), load_external_data=False).graph for path in (a, c)]
    assert graphs[0].node == graphs[1].node  # the seed changes the weights, not the graph
    assert _sha(data[2]) != _sha(data[0])
    # building again over existing files replaces them (save_external_data appends)
    again = _build(builder, tmp_path / "a")
    assert _sha(Path(str(again) + ".data")) == _sha(data[0])


def test_files_are_what_onnx_save_model_writes(builder, tmp_path, monkeypatch):
    streamed = _build(builder, tmp_path / "s")
    model = onnx.load(str(streamed))  # weights read into memory
    assert not any(t.external_data for t in model.graph.initializer)
    ref = tmp_path / "ref" / "decoder.onnx"
    ref.parent.mkdir()
    monkeypatch.chdir(ref.parent.parent)  # save_model refuses a location that exists relative to the cwd
    onnx.save_model(model, str(ref), save_as_external_data=True, location="decoder.onnx.data")
    assert _sha(ref) == _sha(streamed)
    assert _sha(str(ref) + ".data") == _sha(str(streamed) + ".data")
    files = sorted(p.name for p in streamed.parent.iterdir())
    assert files == ["decoder.onnx", "decoder.onnx.data"]


def test_checker_parameters_and_two_shapes(builder, tmp_path):
    path = _build(builder, tmp_path)
    onnx.checker.check_model(str(path), full_check=True)
    cfg = builder.Config(**TINY)
    weights = [t for t in onnx.load(str(path)).graph.initializer if t.data_type == onnx.TensorProto.FLOAT
               and len(t.dims) >= 1 and "." in t.name and not t.name.startswith(("scalar.", "shape.", "index."))]
    assert sum(math.prod(t.dims) for t in weights) == cfg.parameters()
    assert len([t for t in weights if len(t.dims) == 2]) == 6 * cfg.layers + 1  # q k v o fc1 fc2 per layer, head
    session = _session(path)
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 8), (3, 21)):
        (logits,) = session.run(None, {"features": rng.standard_normal((batch, seq, 16)).astype(np.float32)})
        assert logits.shape == (batch, seq, 256)
        assert np.isfinite(logits).all() and 0.1 < logits.std() < 10


def test_decoder_is_causal(builder, tmp_path):
    session = _session(_build(builder, tmp_path))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 12, 16)).astype(np.float32)
    changed = x.copy()
    changed[:, 7:] = rng.standard_normal((2, 5, 16))
    (a,), (b,) = session.run(None, {"features": x}), session.run(None, {"features": changed})
    np.testing.assert_allclose(a[:, :7], b[:, :7], rtol=1e-5, atol=1e-5)
    assert np.abs(a[:, 7:] - b[:, 7:]).max() > 0.1


def test_bad_flags_are_one_line_errors(builder, tmp_path, capsys):
    assert builder.main(["--hidden", "100", "--heads", "3", "--out", str(tmp_path / "x.onnx")]) == 2
    assert builder.main(["--layers", "0", "--out", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --hidden 100 is not a multiple of the head count 3", "error: --layers must be ≥ 1, got 0"]
    assert not (tmp_path / "x.onnx").exists()


def test_benchmark_records_every_run_as_a_row(tmp_path):
    """``measure_large_model.py`` end to end on the ~1 MB size: a pass that works, one that does
    not exist (a failed row, the run goes on; after the anchor, ``--after-anchors``), an anchor; the
    drift child's cosine (ORT without packed weight copies, as for a model larger than memory) and
    the files."""
    flags = [f"--{k}={v}" for k, v in TINY.items()]
    cmd = [sys.executable, str(BUILDER.parent / "measure_large_model.py"), *flags, "--pipelines", "fuse",
           "--after-anchors", "fuse,no_such_pass", "--anchors", "ort_nbits", "--results", str(tmp_path), "--name", "tiny",
           "--mem-cap-gb", "8", "--time-cap-s", "300", "--no-prepack"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (json_file,) = tmp_path.glob("large-model-*-tiny.json")
    results = json.loads(json_file.read_text())
    assert results["ort_prepacking"] is False and results["caps"] == {"mem_cap_gb": 8.0, "time_cap_s": 300.0}
    rows = {r["run"]: r for r in results["rows"]}
    assert list(rows) == ["build", "reference", "fuse", "ort_nbits", "fuse,no_such_pass"]
    assert results["finished"] is not None  # the files were rewritten after each row, the last time final
    assert all(rows[k]["status"] == "ok" and rows[k]["exit"] == 0 for k in ("build", "reference", "fuse", "ort_nbits"))
    assert rows["fuse"]["loads"] and rows["fuse"]["runs"] and rows["fuse"]["worst_cosine"] > 0.99999
    assert [p["name"] for p in rows["fuse"]["passes"]] == ["fuse"]  # from the CLI's --report
    assert 0.9 < rows["ort_nbits"]["worst_cosine"] < 0.99999  # 4-bit weights drift, a little
    assert rows["ort_nbits"]["output_mb"] < 0.5 * rows["fuse"]["output_mb"]
    failed = rows["fuse,no_such_pass"]
    assert (failed["status"], failed["exit"], failed["output_mb"], failed["passes"]) == ("failed", 2, None, None)
    assert "no_such_pass" in failed["error"]
    for row in results["rows"]:
        assert row["wall_s"] > 0 and row["ru_maxrss_mb"] > 10 and row["peak_rss_tree_mb"] > 10
        assert row["peak_rss_mb"] == max(row["ru_maxrss_mb"], row["peak_rss_tree_mb"])
    assert 0.8e6 < results["model_bytes"] < 1.5e6
    table = (tmp_path / json_file.name.replace(".json", ".md")).read_text()
    assert table.count("\n| ") == 1 + len(rows) and "| fuse,no_such_pass | failed | 2 |" in table


@pytest.fixture()
def bench_module():
    sys.path.insert(0, str(BUILDER.parent))
    try:
        yield importlib.import_module("measure_large_model")
    finally:
        sys.path.remove(str(BUILDER.parent))


def test_a_child_over_a_cap_is_a_row(bench_module):
    """Over the memory cap (RLIMIT_AS, as the benchmark sets it) or the time cap: a row, no crash."""
    hog = ("import resource; cap = 1 << 30; resource.setrlimit(resource.RLIMIT_AS, (cap, cap)); "
           "x = bytearray(2 << 30)")
    row = bench_module.run_child("hog", [sys.executable, "-c", hog], timeout=60)
    assert (row["status"], row["exit"]) == ("memory cap", 1) and "MemoryError" in row["error"]
    row = bench_module.run_child("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert (row["status"], row["error"]) == ("time cap", "killed after 1 s") and 1 <= row["wall_s"] < 20
    row = bench_module.run_child("fails", [sys.executable, "-c", "raise SystemExit('bad input')"], timeout=60)
    assert (row["status"], row["exit"], row["error"]) == ("failed", 1, "bad input")
