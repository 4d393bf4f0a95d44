"""The command line: outputs, reports, exit codes, and clear one-line errors for bad input."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import scale_constants

from onnxslim_kit.cli import main
from onnxslim_kit.pipeline import Pass, register_pass

@register_pass
class _Scale(Pass):
    name = "test_cli_scale"
    lossless = True

    def run(self, model, ctx):
        return scale_constants(model, 3, "scaled")


def test_default_output_and_json_report(model_path, tmp_path, capsys):
    original = model_path.read_bytes()
    assert main([str(model_path), "--report", str(tmp_path / "r.json")]) == 0
    out = tmp_path / "m.slim.onnx"
    assert out.exists() and model_path.read_bytes() == original
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] and report["passes"][0]["name"] == "fuse"
    assert report["output_path"] == str(out)
    assert "fuse" in capsys.readouterr().out


def test_strict_failure_writes_nothing(model_path, tmp_path, capsys):
    code = main([str(model_path), "--passes", "test_cli_scale", "--strict", "-o", str(tmp_path / "o.onnx")])
    assert code == 3
    assert not (tmp_path / "o.onnx").exists()
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: pass 'test_cli_scale' changed the outputs")


def test_rollback_without_strict_writes_the_model_unchanged(model_path, tmp_path):
    assert main([str(model_path), "--passes", "test_cli_scale", "-q", "-o", str(tmp_path / "o.onnx")]) == 0
    y_in = onnx.numpy_helper.to_array(onnx.load(model_path).graph.initializer[0])
    y_out = onnx.numpy_helper.to_array(onnx.load(tmp_path / "o.onnx").graph.initializer[0])
    np.testing.assert_array_equal(y_in, y_out)


@pytest.mark.parametrize("args_fn,match", [
    (lambda p, t: [str(t / "missing.onnx")], "no such file"),
    (lambda p, t: [str(p), "--passes", "nope"], "unknown pass 'nope'"),
    (lambda p, t: [str(p), "--passes", "fuse(x=1)"], "has no option 'x'"),
    (lambda p, t: [str(p), "-o", str(p)], "is the input"),
    (lambda p, t: [str(p), "--calib", str(t / "nothing.npz")], "no such file"),
    (lambda p, t: [str(p), "--input-shape", "x1,4"], "expected name"),
    (lambda p, t: [], "no model given"),
])
def test_bad_input_exit_2_one_line(model_path, tmp_path, capsys, args_fn, match):
    assert main(args_fn(model_path, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and match in err[0]
    assert not list(tmp_path.glob("*.slim.onnx"))


def test_garbage_file(tmp_path, capsys):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(np.random.default_rng(1).bytes(1000))
    assert main([str(bad)]) == 2
    assert "garbage.onnx" in capsys.readouterr().err
    assert not (tmp_path / "garbage.slim.onnx").exists()


def test_list_passes(capsys):
    assert main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    assert "fuse" in out and "lossless" in out


def test_module_entry_point_runs(model_path, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "onnxslim_kit", str(model_path), "-o", str(tmp_path / "x.onnx"), "-q"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x.onnx").exists()
    help_proc = subprocess.run([sys.executable, "-m", "onnxslim_kit", "--help"], capture_output=True, text=True)
    assert help_proc.returncode == 0 and "exit codes" in help_proc.stdout


def test_eval_option(model_path, tmp_path):
    np.savez(tmp_path / "eval.npz", x=np.ones((3, 1, 4), np.float32))
    assert main([str(model_path), "-q", "--eval", str(tmp_path / "eval.npz"), "--report", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["verified_on"] == "held-out evaluation samples"
