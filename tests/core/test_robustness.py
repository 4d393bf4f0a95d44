""""Nothing lost", end to end: the CLI (in-process and one subprocess) and the API on odd models.

External data (the >2 GB path, forced by lowering the threshold), dynamic shapes, If/Loop/Scan
bodies, custom-domain ops, old and too-new opsets, odd graph inputs, atomic writes, interrupts
and byte-identical output across runs. Every model is a tiny graph built here.
"""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import assert_same_outputs, parse, run_ort
from onnx import TensorProto, helper, numpy_helper

import onnxslim_kit.model as model_mod
import onnxslim_kit.runtime as runtime_mod
from onnxslim_kit import optimize
from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import load_proto
from onnxslim_kit.pipeline import Pass, register_pass


@pytest.fixture(autouse=True)
def one_thread_ort(monkeypatch):
    """Verification sessions on one thread (the machine is shared)."""
    original = runtime_mod.session_options
    monkeypatch.setattr(runtime_mod, "session_options",
                        lambda level="disable", threads=0, prepack=True: original(level, 1, prepack))


def conv_bn(opset: int = 13, ir: int = 8, out_channels: int = 16) -> onnx.ModelProto:
    """x → Conv → BatchNormalization → Relu → Dropout → Identity → y; W is 1.7 KB at 16 channels.

    IR 3 lists every initializer as a graph input too (as old exporters did).
    """
    rng = np.random.default_rng(0)
    c = out_channels
    arrays = {
        "W": rng.standard_normal((c, 3, 3, 3)).astype(np.float32),
        "scale": (rng.random(c) + 0.5).astype(np.float32),
        "bias": rng.random(c).astype(np.float32),
        "mean": rng.random(c).astype(np.float32),
        "var": (rng.random(c) + 0.5).astype(np.float32),
    }
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items()]
    bn_attrs = {"spatial": 1} if opset < 9 else {}
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], **bn_attrs),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Dropout", ["r"], ["d"], **({"ratio": 0.5} if opset < 12 else {})),
        helper.make_node("Identity", ["d"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    if ir < 4:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in inits]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    onnx.checker.check_model(model, full_check=True)
    return model


def x_feed(seed: int = 0) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)}


def ops_of(proto: onnx.ModelProto) -> list:
    return [n.op_type for n in proto.graph.node]


def files_in(folder) -> dict:
    """Every file below ``folder`` (relative name → bytes): catches temp files and half files."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def ort_path_session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_cli(args, capsys) -> tuple:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    """The one line the CLI prints for a refused input (ORT may log its own lines before it)."""
    lines = [line for line in err.strip().splitlines() if not line.startswith("[onnxslim_kit]")]
    assert lines and lines[-1].startswith("error:"), err
    assert "Traceback" not in err
    return lines[-1]


def save_external(proto: onnx.ModelProto, path, location=None):
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location or path.name + ".data", size_threshold=0)


# --- 1. models over 2 GB (threshold lowered) and --external-data --------------------------------------

@pytest.fixture
def small_threshold(monkeypatch):
    """Every model counts as 'over 2 GB': external-data save, checker skip, ORT through a temp folder."""
    monkeypatch.setattr(model_mod, "EXTERNAL_DATA_THRESHOLD", 1000)


def test_big_model_external_data_in_and_out(tmp_path, capsys, small_threshold):
    src = tmp_path / "in"
    src.mkdir()
    save_external(conv_bn(), src / "m.onnx", location="weights.bin")
    before = files_in(src)
    out = tmp_path / "out" / "m.fused.onnx"
    report_path = tmp_path / "reports" / "r.json"  # folders of -o and --report are created
    code, stdout, err = run_cli([src / "m.onnx", "--passes", "fuse", "-o", out, "--report", report_path], capsys)
    assert code == 0, err
    assert files_in(src) == before  # the input model and its data file untouched
    assert sorted(files_in(out.parent)) == ["m.fused.onnx", "m.fused.onnx.data"]
    assert out.stat().st_size < 1000 < (out.parent / "m.fused.onnx.data").stat().st_size
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["passes"][0]["verification"]["status"] == "ok"
    fused = load_proto(out)
    assert "BatchNormalization" not in ops_of(fused)
    got = ort_path_session(out).run(None, x_feed())[0]
    want = run_ort(load_proto(src / "m.onnx"), x_feed())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_big_model_through_the_api(tmp_path, small_threshold, monkeypatch):
    save_external(conv_bn(), tmp_path / "m.onnx")
    before = files_in(tmp_path)
    given = []  # what ORT was handed: the weights go as arrays, never serialized (any model size)
    real_session = runtime_mod.ort.InferenceSession
    monkeypatch.setattr(runtime_mod.ort, "InferenceSession", lambda m, *a, **k: given.append(m) or real_session(m, *a, **k))
    proto, report = optimize(tmp_path / "m.onnx", "fuse")
    assert report.passes[0].verification["status"] == "ok" and report.ok
    assert len(given) == 2 and all(len(m) < 1000 for m in given)  # original and candidate, weights not inside
    assert files_in(tmp_path) == before
    assert_same_outputs(load_proto(tmp_path / "m.onnx"), proto, x_feed())


def test_external_data_flag_on_a_small_model(tmp_path, capsys):
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    code, _, err = run_cli([tmp_path / "m.onnx", "--external-data", "-q", "-o", out], capsys)
    assert code == 0, err
    data = tmp_path / "o.onnx.data"
    assert data.stat().st_size >= 16 * 27 * 4  # the folded conv weight lives there
    assert not onnx.load(out, load_external_data=False).graph.initializer[0].HasField("raw_data")
    got = ort_path_session(out).run(None, x_feed())[0]
    np.testing.assert_allclose(got, run_ort(conv_bn(), x_feed())[0], rtol=1e-5, atol=1e-5)


def test_missing_external_data_is_a_clear_error(tmp_path, capsys):
    save_external(conv_bn(), tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").unlink()
    code, _, err = run_cli([tmp_path / "m.onnx"], capsys)
    assert code == 2 and "external data" in error_line(err)
    assert sorted(files_in(tmp_path)) == ["m.onnx"]


# --- 2. dynamic shapes ----------------------------------------------------------------------------------

DYNAMIC = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, S, 8] x) => (float[N, S, 4] y) <float[8, 4] w = {%s}, float[4] b = {1.0, 2.0, 3.0, 4.0}> {
  m = MatMul (x, w)
  a = Add (m, b)
  i = Identity (a)
  y = Relu (i)
}
""" % ", ".join(str(v / 10) for v in range(32))

NEEDS_16 = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, S] x) => (float[1, 16] y) <int64[2] shp = {1, 16}> {
  i = Identity (x)
  y = Reshape (i, shp)
}
"""


@pytest.mark.parametrize("extra", [[], ["--input-shape", "x:3,5,8"]])
def test_symbolic_dims_verified_and_kept(tmp_path, capsys, extra):
    onnx.save(parse(DYNAMIC), tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--report", tmp_path / "r.json", *extra],
                           capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["passes"][0]["verification"]["status"] == "ok"
    out = onnx.load(tmp_path / "o.onnx")
    dims = [d.dim_param for d in out.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", "S", ""]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 7, 8)).astype(np.float32)}
    assert_same_outputs(parse(DYNAMIC), out, feeds)


def test_generated_shape_that_does_not_fit_asks_for_input_shape(tmp_path, capfd):
    """The generated sample (1, 64) cannot be reshaped to (1, 16): a bad-input error, not 'unverified'."""
    onnx.save(parse(NEEDS_16), tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "--strict"], capfd)
    line = error_line(err)
    assert code == 2 and "--input-shape" in line and "--calib" in line and "x:1,64" in line
    assert "onnxruntime" not in err.replace(line, "")  # one line from us, no ORT log lines
    assert sorted(files_in(tmp_path)) == ["m.onnx"]
    with pytest.raises(UserError, match="input-shape"):
        optimize(tmp_path / "m.onnx", "fuse")


def test_input_shape_makes_it_verifiable(tmp_path, capsys):
    onnx.save(parse(NEEDS_16), tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "--input-shape", "x:1,16", "-o", tmp_path / "o.onnx",
                            "--report", tmp_path / "r.json", "--strict"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["passes"][0]["verification"]["status"] == "ok"
    _, report = optimize(tmp_path / "m.onnx", "fuse", input_shapes={"x": [2, 8]})
    assert report.passes[0].verification["status"] == "ok"


# --- 3. If / Loop / Scan bodies -----------------------------------------------------------------------

IF_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (bool c, float[2,4] x) => (float[2,4] y) {
  y = If (c) <
    then_branch = t () => (float[2,4] a) { k = Constant <value = float[4] {1.0, 2.0, 3.0, 4.0}> ()
                                           k2 = Constant <value = float[4] {0.5, 0.5, 0.5, 0.5}> ()
                                           kk = Add (k, k2)
                                           i = Identity (x)
                                           a = Add (i, kk) },
    else_branch = e () => (float[2,4] b) { j = Identity (x)
                                           b = Relu (j) }
  >
}
"""

LOOP_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (int64 n, float[2,4] x) => (float[2,4] y) {
  cond = Constant <value = bool {1}> ()
  y = Loop (n, cond, x) <
    body = b (int64 it, bool cin, float[2,4] acc) => (bool cout, float[2,4] acc2) {
        cout = Identity (cin)
        k = Constant <value = float[4] {0.5, 0.25, 0.5, 0.25}> ()
        k2 = Mul (k, k)
        i = Identity (acc)
        acc2 = Add (i, k2)
    }
  >
}
"""

SCAN_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[4] init, float[3,4] xs) => (float[4] last, float[3,4] ys) {
  last, ys = Scan (init, xs) <num_scan_inputs = 1,
    body = b (float[4] st, float[4] xi) => (float[4] st2, float[4] yo) {
        k = Constant <value = float[4] {0.5, 0.5, 0.5, 0.5}> ()
        k2 = Mul (k, k)
        i = Identity (xi)
        st2 = Add (st, i)
        yo = Mul (st2, k2)
    }
  >
}
"""

_x24 = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


@pytest.mark.parametrize("text,samples", [
    (IF_MODEL, [{"c": np.array(True), "x": _x24}, {"c": np.array(False), "x": _x24}]),
    (LOOP_MODEL, [{"n": np.array(3, np.int64), "x": _x24}, {"n": np.array(0, np.int64), "x": _x24}]),
    (SCAN_MODEL, [{"init": np.ones(4, np.float32), "xs": np.arange(12, dtype=np.float32).reshape(3, 4)}]),
], ids=["if", "loop", "scan"])
def test_fuse_inside_subgraphs(tmp_path, capsys, text, samples):
    original = parse(text)
    proto, report = optimize(original, "fuse", calib=samples)
    entry = report.passes[0]
    assert entry.modified and entry.verification["status"] == "ok" and not entry.rolled_back
    assert entry.before["nodes"] > entry.after["nodes"]  # the body lost its Identity/constant arithmetic
    onnx.checker.check_model(proto, full_check=True)
    for sample in samples:
        assert_same_outputs(original, proto, sample)
    onnx.save(original, tmp_path / "m.onnx")  # and through the CLI on generated data
    code, _, err = run_cli([tmp_path / "m.onnx", "-q", "--strict", "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0, err
    ort_path_session(tmp_path / "o.onnx")


# --- 4. custom-domain ops ---------------------------------------------------------------------------

CUSTOM = """
<ir_version: 8, opset_import: ["" : 13, "com.example" : 1]>
g (float[2,4] x) => (float[2,4] y) {
  i = Identity (x)
  c = com.example.Foo (i)
  y = Relu (c)
}
"""


@pytest.mark.parametrize("strict", [False, True])
def test_custom_op_written_unverified_with_a_warning(tmp_path, capsys, strict):
    onnx.save(parse(CUSTOM), tmp_path / "m.onnx")
    args = [tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--report", tmp_path / "r.json"]
    code, out, err = run_cli(args + (["--strict", "-q"] if strict else []), capsys)
    assert code == 0, err
    entry = json.loads((tmp_path / "r.json").read_text())["passes"][0]
    assert entry["verification"]["status"] == "unverified"
    assert "com.example" in entry["verification"]["message"]
    assert "warning: pass 'fuse' not verified" in err and "only the onnx checker ran" in err
    if not strict:
        assert "checker only" in out and "not verified, only the onnx checker ran" in out
    written = onnx.load(tmp_path / "o.onnx")
    assert ops_of(written) == ["Foo", "Relu"] and written.graph.node[0].domain == "com.example"


def test_custom_op_quiet_without_strict_prints_nothing(tmp_path, capsys):
    onnx.save(parse(CUSTOM), tmp_path / "m.onnx")
    code, out, err = run_cli([tmp_path / "m.onnx", "-q", "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0 and out == "" and "warning" not in err


def test_strict_behaviour_is_documented(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "unverified" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("node", [
    "c = com.microsoft.Gelu (i)",
    "c = com.microsoft.FusedMatMul <alpha = 2.0, transB = 1> (i, w)",
], ids=["Gelu", "FusedMatMul"])
def test_contrib_op_is_verified(node, capsys, tmp_path):
    text = f"""
    <ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
    g (float[4,4] x) => (float[4,4] y) <float[4,4] w = {{{", ".join(str(v / 7) for v in range(16))}}}> {{
      i = Identity (x)
      {node}
      y = Relu (c)
    }}
    """
    onnx.save(parse(text), tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--strict",
                            "--report", tmp_path / "r.json"], capsys)
    assert code == 0 and "warning" not in err
    entry = json.loads((tmp_path / "r.json").read_text())["passes"][0]
    assert entry["verification"]["status"] == "ok"
    assert [n.domain for n in onnx.load(tmp_path / "o.onnx").graph.node] == ["com.microsoft", ""]


# --- 5. old and too-new opsets -------------------------------------------------------------------

@pytest.mark.parametrize("opset,ir", [(7, 3), (9, 4), (11, 6)])
def test_old_opsets_fuse_and_run(tmp_path, capsys, opset, ir):
    original = conv_bn(opset, ir, out_channels=4)
    onnx.save(original, tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--strict",
                            "--report", tmp_path / "r.json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passes"][0]["verification"]["status"] == "ok"
    out = onnx.load(tmp_path / "o.onnx")
    assert ops_of(out) == ["Conv", "Relu"]
    assert out.opset_import[0].version == opset
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(original, out, x_feed())
    if ir == 3:  # initializers were graph inputs: dropped, so the model is written as IR 4
        assert out.ir_version == 4 and [i.name for i in out.graph.input] == ["x"]
        assert any("graph inputs" in note for note in report["load_notes"])


def test_opset_9_upsample_and_reshape(tmp_path, capsys):
    text = """
    <ir_version: 4, opset_import: ["" : 9]>
    g (float[1,2,3,3] x) => (float[1,2,36] y) <float[4] sc = {1.0, 1.0, 2.0, 2.0}, int64[3] shp = {1, 2, -1}> {
      i = Identity (x)
      u = Upsample <mode = "nearest"> (i, sc)
      y = Reshape (u, shp)
    }
    """
    original = parse(text)
    onnx.save(original, tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "-q", "--strict", "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0, err
    out = onnx.load(tmp_path / "o.onnx")
    assert "Upsample" in ops_of(out) and "Identity" not in ops_of(out)
    feeds = {"x": np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)}
    assert_same_outputs(original, out, feeds)


@pytest.mark.parametrize("opset,match", [(6, "opset 6 is older than 7"), (10_000, "is newer than")])
def test_unsupported_opset_is_a_clear_error(tmp_path, capsys, opset, match):
    proto = conv_bn()
    proto.opset_import[0].version = opset
    (tmp_path / "m.onnx").write_bytes(proto.SerializeToString())
    code, _, err = run_cli([tmp_path / "m.onnx"], capsys)
    assert code == 2 and match in error_line(err)
    assert sorted(files_in(tmp_path)) == ["m.onnx"]


# --- 6. odd inputs -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,feeds,expect_inputs", [
    ("""<ir_version: 8, opset_import: ["" : 13]>
        g (float[2,4] x) => (float[2,4] y) { i = Identity (x)
                                             y = Relu (i) }""",
     {"x": _x24}, ["x"]),
    ("""<ir_version: 8, opset_import: ["" : 13]>
        g (float[2,4] x) => (float[2,4] x) { }""",
     {"x": _x24}, ["x"]),
    ("""<ir_version: 8, opset_import: ["" : 13]>
        g (float[2,4] x, float[3] unused) => (float[2,4] y) { i = Identity (x)
                                                              y = Relu (i) }""",
     {"x": _x24, "unused": np.zeros(3, np.float32)}, ["x", "unused"]),
], ids=["no-initializers", "output-is-input", "unused-input"])
def test_odd_graphs_survive(tmp_path, capsys, text, feeds, expect_inputs):
    original = parse(text)
    onnx.save(original, tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "-q", "--strict", "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0, err
    out = onnx.load(tmp_path / "o.onnx")
    assert [i.name for i in out.graph.input] == expect_inputs
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(original, out, feeds)


STRING_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (string[2] s, float[2] x) => (string[2] t, float[2] y) {
  t = Identity (s)
  i = Identity (x)
  y = Relu (i)
}
"""


def test_string_input_without_data_uses_generated_words(tmp_path, capsys):
    onnx.save(parse(STRING_MODEL), tmp_path / "m.onnx")
    code, _, err = run_cli([tmp_path / "m.onnx", "-q", "-o", tmp_path / "v.onnx"], capsys)
    assert code == 0, err  # verified on generated words
    assert [i.name for i in onnx.load(tmp_path / "v.onnx").graph.input] == ["s", "x"]
    code, _, err = run_cli([tmp_path / "m.onnx", "--no-verify", "-q", "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0, err  # nothing needs data: the model is still written
    assert [i.name for i in onnx.load(tmp_path / "o.onnx").graph.input] == ["s", "x"]


# --- 7. atomic writes, input never touched --------------------------------------------------------

def _disk_full_midway(real_save):
    def save(proto, path, *args, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"half a model")
        raise OSError(28, "No space left on device", str(path))
    return save


@pytest.mark.parametrize("external", [False, True])
def test_failed_save_leaves_nothing_and_keeps_an_old_output(tmp_path, capsys, monkeypatch, external):
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    (tmp_path / "o.onnx").write_bytes(b"previous output")
    before = files_in(tmp_path)
    if external:
        monkeypatch.setattr(onnx, "save_model", _disk_full_midway(onnx.save_model))
    else:
        real_replace = os.replace

        def replace(src, dst):
            if str(dst).endswith("o.onnx"):
                raise OSError(28, "No space left on device", str(dst))
            real_replace(src, dst)
        monkeypatch.setattr(model_mod.os, "replace", replace)
    args = [tmp_path / "m.onnx", "-o", tmp_path / "o.onnx"] + (["--external-data"] if external else [])
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "cannot write" in error_line(err) and "No space left" in error_line(err)
    assert files_in(tmp_path) == before  # no half file, no temp folder, old output intact


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_destination(tmp_path, capsys):
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, _, err = run_cli([tmp_path / "m.onnx", "-o", ro / "o.onnx"], capsys)
        assert code == 2 and "cannot write" in error_line(err)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("target", [
    lambda d: d / "sub" / ".." / "m.onnx",
    lambda d: d / "link.onnx",
    lambda d: d / "weights.bin",
    lambda d: d / "weights",  # a new file beside the input: allowed
], ids=["dotdot", "symlink", "data-file", "other"])
def test_output_onto_input_files_refused(tmp_path, capsys, target):
    save_external(conv_bn(), tmp_path / "m.onnx", location="weights.bin")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.onnx").symlink_to(tmp_path / "m.onnx")
    before = files_in(tmp_path)
    out = target(tmp_path)
    code, _, err = run_cli([tmp_path / "m.onnx", "-q", "-o", out], capsys)
    if out.name == "weights":
        assert code == 0, err  # a new file beside the input is fine
        assert {k: v for k, v in files_in(tmp_path).items() if k in before} == before
        return
    assert code == 2 and "is the input" in error_line(err)
    assert files_in(tmp_path) == before


def test_output_whose_data_file_is_the_inputs_data_refused(tmp_path, capsys):
    save_external(conv_bn(), tmp_path / "m.onnx", location="o.onnx.data")
    before = files_in(tmp_path)
    code, _, err = run_cli([tmp_path / "m.onnx", "--external-data", "-o", tmp_path / "o.onnx"], capsys)
    assert code == 2 and "is the input" in error_line(err)
    assert files_in(tmp_path) == before


# --- 8. interrupt ---------------------------------------------------------------------------

@register_pass
class _Interrupt(Pass):
    name = "test_robustness_interrupt"

    def run(self, model, ctx):
        raise KeyboardInterrupt


def test_interrupt_inside_a_pass(tmp_path, capsys):
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    before = files_in(tmp_path)
    code, _, err = run_cli([tmp_path / "m.onnx", "--passes", "fuse,test_robustness_interrupt"], capsys)
    assert code == 130 and "interrupted; nothing written" in err
    assert files_in(tmp_path) == before


def test_interrupt_while_saving(tmp_path, capsys, monkeypatch):
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    before = files_in(tmp_path)

    def save(proto, path, *args, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"half")
        raise KeyboardInterrupt
    monkeypatch.setattr(onnx, "save_model", save)
    code, _, err = run_cli([tmp_path / "m.onnx", "--external-data"], capsys)
    assert code == 130 and files_in(tmp_path) == before


# --- 9. deterministic output --------------------------------------------------------------------

def test_same_command_same_bytes_in_process_and_in_a_subprocess(tmp_path):
    """Runs into separate folders under the same name (the .onnx names its .data file)."""
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    onnx.save(parse(IF_MODEL), tmp_path / "if.onnx")
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        assert main([str(tmp_path / "m.onnx"), "-q", "-o", str(tmp_path / run / "o.onnx"), "--external-data"]) == 0
        assert main([str(tmp_path / "if.onnx"), "-q", "-o", str(tmp_path / run / "if.onnx")]) == 0
    env = dict(os.environ, PYTHONHASHSEED="12345", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "onnxslim_kit", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "c" / "o.onnx"),
         "--external-data", "--report", str(tmp_path / "c.json")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and json.loads((tmp_path / "c.json").read_text())["ok"]
    a, b, c = (files_in(tmp_path / run) for run in "abc")
    assert a == b and sorted(a) == ["if.onnx", "o.onnx", "o.onnx.data"]
    assert c == {k: a[k] for k in ("o.onnx", "o.onnx.data")}
