"""bench: statistics, interleaving, drift, MACs, sizes, the CLI, and a real-model smoke run."""

from __future__ import annotations

import json
import lzma
import math
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import parse, run_ort

from onnxslim_kit import bench
from onnxslim_kit.bench_macs import estimate_macs
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.cli import main as cli_main
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import save_proto

AFFINE = """
<ir_version: 8, opset_import: ["" : 17]>
agraph (float[N, 16] x) => (float[N, 10] y) <float[10, 16] w = {W}, float[10] b = {B}> {
    y = Gemm<transB = 1>(x, w, b)
}
"""


def affine(weight: np.ndarray, bias: np.ndarray) -> onnx.ModelProto:
    fmt = lambda a: "{" + ", ".join(f"{v:.6f}" for v in a.ravel()) + "}"  # noqa: E731
    return parse(AFFINE.replace("{W}", fmt(weight)).replace("{B}", fmt(bias)))


@pytest.fixture
def pair(rng):
    w = rng.standard_normal((10, 16)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    return affine(w, b), affine(w, b + 0.25)


def samples_for(model, n=4):
    return CalibrationFeed(input_specs(model), None, num_samples=n).take(n)


# --- statistics and order ---------------------------------------------------------------

@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(rng, q):
    values = rng.standard_normal(37)
    assert bench.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_by_hand():
    values = [10, 1, 9, 2, 8, 3, 7, 4, 6, 5]  # sorted 1..10: h = 9·q/100
    assert bench.percentile(values, 50) == 5.5
    assert bench.percentile(values, 90) == pytest.approx(9.1)
    assert bench.percentile([4.0], 99) == 4.0
    with pytest.raises(ValueError):
        bench.percentile([], 50)


def test_latency_stats_in_milliseconds():
    stats = bench.latency_stats([0.004, 0.001, 0.003, 0.002])
    assert stats["median"] == pytest.approx(2.5)
    assert stats["mean"] == pytest.approx(2.5)
    assert stats["min"] == pytest.approx(1.0)
    assert stats["p90"] == pytest.approx(1 + 0.9 * 3)


def test_interleaved_order_rotates_and_balances_positions():
    n = 3
    rounds = [bench.interleaved_order(n, r) for r in range(2 * n)]
    assert rounds[:3] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert rounds[3:] == rounds[:3]
    for position in range(n):  # every model runs in every position equally often
        assert sorted(r[position] for r in rounds) == [0, 0, 1, 1, 2, 2]


def test_timed_rounds_interleaves_and_attributes_times(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    log = []

    def runner(m):
        def go(r):
            log.append((r, m))
            clock[0] += (m + 1) * 10 + r  # a fake duration that depends on model and round
        return go

    times = bench.timed_rounds([runner(0), runner(1)], runs=3, warmup=2)
    assert log == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1), (3, 1), (3, 0), (4, 0), (4, 1)]
    assert times == [[10 + r for r in (2, 3, 4)], [20 + r for r in (2, 3, 4)]]  # warm-up rounds excluded


def test_paired_ratio():
    median, spread = bench.paired_ratio([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])  # ratios 2, 2, 3
    assert median == 2.0
    assert spread == [pytest.approx(2.0), pytest.approx(2.8)]


# --- inputs, drift, size, MACs --------------------------------------------------------------

def test_batched_stacks_dynamic_first_axes_cycling(pair):
    specs = input_specs(pair[0])
    samples = [{"x": np.full((1, 16), i, np.float32)} for i in range(3)]
    out = bench.batched(samples, specs, 4)
    assert [s["x"].shape for s in out] == [(4, 16)] * 3
    assert out[2]["x"][:, 0].tolist() == [2, 0, 1, 2]
    assert bench.batched(samples, specs, None) == samples
    fixed = parse('<ir_version: 8, opset_import: ["" : 17]> g (float[2, 3] x) => (float[2, 3] y) { y = Relu(x) }')
    with pytest.raises(UserError, match="dynamic first axis"):
        bench.batched([{"x": np.zeros((2, 3), np.float32)}], input_specs(fixed), 4)


def test_drift_identical_vs_perturbed(pair):
    base, shifted = pair
    samples = samples_for(base)
    report = bench.benchmark([base, base, shifted], samples, names=["a", "same", "shifted"],
                             runs=3, warmup=1, memory=False)
    same, moved = report.rows[1]["drift"]["y"], report.rows[2]["drift"]["y"]
    assert same["cosine"] == 1.0 and same["max_abs"] == 0.0 and same["top1"] == 1.0
    expected_abs = max(float(np.abs(run_ort(shifted, s)[0] - run_ort(base, s)[0]).max()) for s in samples)
    assert moved["max_abs"] == pytest.approx(expected_abs, rel=1e-6)
    assert moved["cosine"] < 1.0
    assert [r["name"] for r in report.rows] == ["a", "same", "shifted"]
    assert all(r["latency_ms"]["min"] <= r["latency_ms"]["median"] <= r["latency_ms"]["p99"] for r in report.rows)
    assert report.rows[0]["latency_ratio_vs_first"] == 1.0


def test_metric_hook_gets_all_samples(pair):
    base, shifted = pair
    samples = samples_for(base, 3)

    def mean_shift(reference, outputs):
        return {"n": len(outputs), "shift": float(np.mean([o["y"] - r["y"] for r, o in zip(reference, outputs)]))}

    report = bench.benchmark([base, shifted], samples, runs=2, warmup=0, memory=False, metric=mean_shift)
    assert report.rows[0]["metric"] == {"n": 3, "shift": 0.0}
    assert report.rows[1]["metric"]["shift"] == pytest.approx(0.25, abs=1e-5)


CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) <float[4, 3, 3, 3] w> {
    y = Conv<pads = [1, 1, 1, 1]>(x, w)
}
"""
DEPTHWISE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 8, 8] x) => (float[1, 4, 4, 4] y) <float[4, 1, 3, 3] w> {
    y = Conv<group = 4, strides = [2, 2], pads = [1, 1, 1, 1]>(x, w)
}
"""
GEMM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 16] x) => (float[2, 10] y) <float[10, 16] w> { y = Gemm<transB = 1>(x, w) }
"""
MATMUL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3, 5] x) => (float[2, 3, 7] y) <float[5, 7] w> { y = MatMul(x, w) }
"""
DECONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 2, 4, 4] x) => (float[1, 3, 8, 8] y) <float[2, 3, 2, 2] w> { y = ConvTranspose<strides = [2, 2]>(x, w) }
"""
LSTM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[5, 1, 4] x) => (float[5, 1, 1, 3] y) <float[1, 12, 4] w, float[1, 12, 3] r> {
    y = LSTM<hidden_size = 3>(x, w, r)
}
"""


@pytest.mark.parametrize("text, expected", [
    (CONV, 1 * 4 * 8 * 8 * (3 * 3 * 3)),           # |Y| · C_in · k_h · k_w
    (DEPTHWISE, 1 * 4 * 4 * 4 * (1 * 3 * 3)),      # group = C: one input channel per output
    (GEMM, 2 * 10 * 16),                            # M · N · K
    (MATMUL, 2 * 3 * 7 * 5),                        # batch · M · N · K
    (DECONV, 1 * 2 * 4 * 4 * (3 * 2 * 2)),          # |X| · C_out · k_h · k_w
    (LSTM, 5 * 1 * 4 * 3 * (4 + 3)),                # T · B · gates · H · (I + H)
])
def test_macs_of_known_ops(text, expected):
    model = onnx.parser.parse_model(text)
    assert estimate_macs(model) == (expected, 0)


def test_macs_measured_when_inference_cannot_tell():
    weights = "{" + ", ".join(["0.5"] * 30) + "}"
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 24] x, int64[2] shape) => (float[M, 5] y) <float[6, 5] w = WEIGHTS> {
        r = Reshape(x, shape)
        y = MatMul(r, w)
    }
    """.replace("WEIGHTS", weights))
    feed = {"x": np.ones((1, 24), np.float32), "shape": np.array([4, 6], np.int64)}
    assert estimate_macs(model, {"x": [1, 24], "shape": [2]}) == (0, 1)
    assert estimate_macs(model, {"x": [1, 24], "shape": [2]}, feed) == (4 * 5 * 6, 0)


@pytest.mark.parametrize("op,b_index", [("Gemm", 1), ("QGemm", 3)])
@pytest.mark.parametrize("trans_b,b_shape", [(1, [10, 16]), (0, [16, 10])])
def test_gemm_macs_from_a_and_b_when_the_output_shape_is_unknown(op, b_index, trans_b, b_shape):
    from onnxslim_kit.bench_macs import node_macs

    inputs = ["a"] + [f"i{k}" for k in range(1, b_index)] + ["b"]
    node = onnx.helper.make_node(op, inputs, ["y"], transB=trans_b)
    assert node_macs(node, {"a": [2, 16], "b": b_shape}) == 2 * 10 * 16
    assert node_macs(node, {"a": [2, 16]}) is None  # neither Y nor B: unknown, never guessed


QDQ_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] y)
 <int8[8, 4, 1, 1] wq = {WQ}, float ws = {0.02}, int8 wz = {0}, float xs = {0.02}, uint8 xz = {128},
  float ys = {0.05}, uint8 yz = {128}> {
  xq = QuantizeLinear(x, xs, xz)
  xd = DequantizeLinear(xq, xs, xz)
  wd = DequantizeLinear(wq, ws, wz)
  c = Conv(xd, wd)
  TAIL
  yq = QuantizeLinear(a, ys, yz)
  y = DequantizeLinear(yq, ys, yz)
}
"""
CONV_MACS = 8 * 8 * 8 * 4  # |Y| · C_in (1×1 kernel)


def qdq_conv(tail: str, rng) -> onnx.ModelProto:
    """A 1×1 conv in QDQ; ``tail`` makes ``a`` from ``c`` (Identity: ORT fuses it to QLinearConv)."""
    wq = "{" + ", ".join(str(v) for v in rng.integers(-127, 128, 32)) + "}"
    return parse(QDQ_CONV.replace("{WQ}", wq).replace("TAIL", tail))


def test_rows_say_what_ort_runs_in_int8(rng):
    fused, unfused = qdq_conv("a = Identity(c)", rng), qdq_conv("a = HardSwish(c)", rng)
    samples = samples_for(fused, 2)
    report = bench.benchmark([fused, unfused], samples, names=["fused", "hardswish"], runs=2, warmup=0,
                             memory=False)
    first, second = (row["executed"] for row in report.rows)
    assert first["int8_ops"] == {"QLinearConv": 1} and first["macs_int8"] == CONV_MACS
    assert first["int8_mac_share"] == 1.0 and first["unfused"] == []
    assert second["int8_ops"] == {} and second["macs_float"] == CONV_MACS and second["int8_mac_share"] == 0.0
    assert {e["tensor"] for e in second["unfused"]} == {"xq", "wq"}
    table = report.table()
    header = table.splitlines()[0]
    assert "int8 MACs" in header
    cells = [line.split() for line in table.splitlines()[2:4]]
    assert "100.0%" in cells[0] and "0.0%" in cells[1]
    notes = [line for line in table.splitlines() if line.startswith("hardswish (cpu): ORT left DequantizeLinear → ")]
    assert len(notes) == 1 and "float compute 1 of 1" in notes[0]
    assert not any(line.startswith("fused (cpu): ORT left") for line in table.splitlines())
    assert "| int8 MACs |" in report.markdown()


def test_without_ort_optimizations_the_qdq_model_runs_float(rng):
    fused = qdq_conv("a = Identity(c)", rng)
    report = bench.benchmark([fused], samples_for(fused, 1), runs=1, warmup=0, memory=False, opt_level="disable")
    assert report.rows[0]["executed"]["int8_mac_share"] == 0.0
    assert report.rows[0]["executed"]["opt_level"] == "disable"


def test_int8_cell_marks_unknown_macs_and_errors():
    from onnxslim_kit.bench_render import int8_cell

    assert int8_cell({"int8_mac_share": 0.5, "macs_unresolved": 2}) == "50.0% (2 ops unknown)"
    assert int8_cell({"int8_mac_share": 6.5e-5}) == "<0.1%"  # a few tiny int8 convs: not 0
    assert int8_cell({"int8_mac_share": 0.9996}) == ">99.9%"
    assert int8_cell({"int8_mac_share": 0.0}) == "0.0%"
    assert int8_cell({"error": "ONNX Runtime: no"}) == "—"
    assert int8_cell(None) == "—"


@pytest.mark.parametrize("codec", ["zlib", "lzma"])
def test_compressed_size_of_file_and_proto(tmp_path, codec):
    zeros = affine(np.zeros((10, 16), np.float32), np.zeros(10, np.float32))
    path = save_proto(zeros, tmp_path / "zeros.onnx")
    data = path.read_bytes()
    expected = len(zlib.compress(data, 9)) if codec == "zlib" else len(lzma.compress(data, preset=6))
    info = bench.size_info(path, zeros, codec)
    assert info == {"size_bytes": len(data), "size_compressed_bytes": expected, "compression": codec}
    assert bench.size_info(None, zeros, codec)["size_bytes"] == zeros.ByteSize()


def test_compressed_size_counts_external_data(tmp_path, rng):
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 64] x) => (float[N, 64] y) { y = MatMul(x, w) }
    """)
    weight = rng.standard_normal((64, 64)).astype(np.float32)  # 16 KB: over the external-data threshold
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "w"))
    path = save_proto(model, tmp_path / "ext.onnx", external_data=True)
    on_disk = path.stat().st_size + (tmp_path / "ext.onnx.data").stat().st_size
    assert bench.size_info(path, model)["size_bytes"] == on_disk


def test_peak_memory_in_child_process(pair, tmp_path):
    report = bench.benchmark([pair[0]], samples_for(pair[0], 2), runs=2, warmup=0)
    row = report.rows[0]
    assert row["peak_rss_mb"] > row["peak_memory_mb"] >= 0
    assert "child failed" not in row["memory_method"]


# --- providers and CLI -------------------------------------------------------------------

def test_providers_listed_and_missing_ones_refused():
    assert "cpu" in bench.list_providers()
    assert bench.resolve_provider("CPU") == "CPUExecutionProvider"
    with pytest.raises(UserError, match="not available"):
        bench.resolve_provider("nosuch")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(UserError, match="onnxruntime-gpu"):
            bench.resolve_provider("cuda")


def test_cli_providers_list(capsys):
    assert cli_main(["bench", "--providers", "list"]) == 0
    assert "CPUExecutionProvider" in capsys.readouterr().out


def test_cli_writes_json_and_markdown(pair, tmp_path, capsys):
    a = save_proto(pair[0], tmp_path / "a.onnx")
    b = save_proto(pair[1], tmp_path / "b.onnx")
    argv = ["bench", str(a), str(b), "--runs", "3", "--warmup", "1", "--no-memory", "--threads", "1",
            "--report", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"), "--batch", "2"]
    assert cli_main(argv) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert [r["name"] for r in data["rows"]] == ["a", "b"]
    assert data["settings"]["runs"] == 3 and data["settings"]["batch"] == 2
    assert data["rows"][1]["macs"] == 2 * 10 * 16
    assert data["rows"][1]["size_bytes"] == b.stat().st_size
    assert math.isfinite(data["rows"][1]["latency_ratio_vs_first"])
    md_rows = [line for line in (tmp_path / "r.md").read_text().splitlines() if line.startswith("| ")]
    assert len(md_rows) == 3 and md_rows[2].startswith("| b | cpu | 1 |")  # header + one row per model
    assert "reference" in capsys.readouterr().out


def test_cli_metric_hook(pair, tmp_path, monkeypatch):
    a = save_proto(pair[0], tmp_path / "a.onnx")
    (tmp_path / "hookmod.py").write_text("def count(ref, out):\n    return {'samples': len(out)}\n"
                                         "def broken(ref, out):\n    raise KeyError('label')\n")
    monkeypatch.chdir(tmp_path)
    base = ["bench", str(a), "--runs", "2", "--warmup", "0", "--no-memory", "-q", "--num-samples", "3"]
    assert cli_main(base + ["--metric", "hookmod:count", "--report", "r.json"]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["rows"][0]["metric"] == {"samples": 3}
    assert cli_main(base + ["--metric", "hookmod:broken"]) == 2
    assert cli_main(base + ["--metric", "hookmod:missing"]) == 2


def test_cli_bad_input_exits_2(pair, tmp_path, capsys):
    a = save_proto(pair[0], tmp_path / "a.onnx")
    assert cli_main(["bench", str(a), "--providers", "nosuch"]) == 2
    assert cli_main(["bench", str(tmp_path / "missing.onnx")]) == 2
    assert cli_main(["bench", str(a), "--threads", "one"]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "no such file" in err and "--threads" in err


def test_model_ort_cannot_run_is_a_row(pair, tmp_path, capsys):
    custom = parse(AFFINE.replace("{W}", "{" + ",".join(["0.5"] * 160) + "}").replace("{B}", "{" + ",".join(["0"] * 10) + "}"))
    custom.graph.node[0].domain = "acme"
    custom.opset_import.append(onnx.helper.make_opsetid("acme", 1))
    a = save_proto(pair[0], tmp_path / "a.onnx")
    bad = save_proto(custom, tmp_path / "bad.onnx")
    assert cli_main(["bench", str(a), str(bad), "--runs", "2", "--warmup", "0", "--no-memory",
                     "--report", str(tmp_path / "r.json")]) == 2
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert rows[0]["error"] is None and rows[0]["latency_ms"]["median"] > 0
    assert "ONNX Runtime" in rows[1]["error"] and "latency_ms" not in rows[1]
    assert "FAILED" in capsys.readouterr().out
    assert cli_main(["bench", str(bad), "--runs", "2", "--no-memory"]) == 2  # every model fails: still rows


# --- real model --------------------------------------------------------------------------

@pytest.mark.realmodel
def test_bench_ppocr_cls_against_fuse(tmp_path):
    import onnxslim_kit
    from onnxslim_kit.zoo import fetch

    original = fetch("ppocr_cls_v2")
    fused, _ = onnxslim_kit.optimize(original, passes="fuse")
    fused_path = save_proto(fused, tmp_path / "cls.fuse.onnx")
    report_path = tmp_path / "r.json"
    argv = ["bench", str(original), str(fused_path), "--runs", "5", "--warmup", "1", "-q",
            "--input-shape", "x:1,3,48,192", "--num-samples", "2", "--report", str(report_path)]
    assert cli_main(argv) == 0
    first, second = json.loads(report_path.read_text())["rows"]
    assert first["size_bytes"] == original.stat().st_size
    assert first["macs"] > first["params"] > 0 and first["macs_unresolved_nodes"] == 0
    for drift in second["drift"].values():
        assert drift["cosine"] > 0.9999 and drift["max_rel"] < 1e-3
    for row in (first, second):
        assert row["peak_memory_mb"] > 0 and row["latency_ms"]["median"] > 0
        assert 0 < row["size_compressed_bytes"] < row["size_bytes"]
