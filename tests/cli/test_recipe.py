"""Replayable reports: the JSON report says what ran (versions, seed, every option, argv, the
input's sha256, data sources), and ``--recipe report.json`` replays it to the same bytes."""

import json
import re

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxslim_kit
from onnxslim_kit.cli import main
from onnxslim_kit.recipe import file_sha256, tool_versions


def _conv_bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.random(8).astype(np.float32) + 0.5, "s"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bb"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "m"),
        numpy_helper.from_array(rng.random(8).astype(np.float32) + 0.5, "v"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, ["N", 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_bn_model(), path)
    return path


ARGS = ["--passes", "fuse,int8", "--seed", "3", "--input-shape", "x:2,3,8,8", "--exclude", "relu1",
        "--atol", "y:10", "-q"]


def test_the_report_says_what_ran(model_path, tmp_path):
    assert main([str(model_path), *ARGS, "-o", str(tmp_path / "a.onnx"), "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tool"] == tool_versions() and set(report["tool"]) == {
        "onnxslim_kit", "onnx", "onnxruntime", "onnx_graphsurgeon", "numpy", "python"}
    assert report["seed"] == 3 and report["exclude"] == "relu1" and report["atol"] == {"y": 10.0}
    assert report["argv"][3:] == [str(model_path), *ARGS, "-o", str(tmp_path / "a.onnx"),
                                  "--report", str(tmp_path / "r.json")]
    assert report["input_sha256"] == file_sha256(model_path)
    assert [p["name"] for p in report["pass_list"]] == ["fuse", "int8"]
    int8_options = report["pass_list"][1]["options"]
    assert set(int8_options) == set(onnxslim_kit.pipeline.available_passes()["int8"].options)  # defaults filled in
    assert report["settings"]["input_shapes"] == {"x": [2, 3, 8, 8]}
    assert report["sources"] == {"calib": None, "eval": None}


def test_a_recipe_replays_to_the_same_bytes(model_path, tmp_path):
    first, again, other = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    assert main([str(model_path), *ARGS, "-o", str(first), "--report", str(tmp_path / "r.json")]) == 0
    assert main(["--recipe", str(tmp_path / "r.json"), "-o", str(again), "-q",
                 "--report", str(tmp_path / "r2.json")]) == 0
    assert first.read_bytes() == again.read_bytes()
    replayed = json.loads((tmp_path / "r2.json").read_text())
    assert replayed["seed"] == 3 and replayed["exclude"] == "relu1" and replayed["atol"] == {"y": 10.0}
    # the seed matters here (generated calibration data), so the recipe really carried it
    other_args = [a if a != "3" else "4" for a in ARGS]
    assert main([str(model_path), *other_args, "-o", str(other)]) == 0
    assert other.read_bytes() != first.read_bytes()


def test_the_model_and_data_paths_come_from_the_command_line_else_the_report(model_path, tmp_path, capsys):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(1).standard_normal((3, 1, 3, 8, 8)).astype(np.float32))
    assert main([str(model_path), "--passes", "fuse", "--calib", str(calib), "-q", "-o", str(tmp_path / "a.onnx"),
                 "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sources"]["calib"] == {"path": str(calib)}
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(model_path.read_bytes())
    assert main([str(copy), "--recipe", str(tmp_path / "r.json"), "-o", str(tmp_path / "b.onnx"),
                 "--report", str(tmp_path / "r2.json"), "-q"]) == 0
    replayed = json.loads((tmp_path / "r2.json").read_text())
    assert replayed["input_path"] == str(copy) and replayed["sources"]["calib"] == {"path": str(calib)}
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert "warning" not in capsys.readouterr().err


def test_a_version_mismatch_or_another_input_is_a_warning(model_path, tmp_path, capsys):
    assert main([str(model_path), "--passes", "fuse", "-q", "-o", str(tmp_path / "a.onnx"),
                 "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    report["tool"]["onnx"] = "0.0.1"
    report["input_sha256"] = "0" * 64
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert main(["--recipe", str(tmp_path / "r.json"), "-o", str(tmp_path / "b.onnx")]) == 0
    err = capsys.readouterr().err
    assert "made with other versions (onnx 0.0.1 → " in err
    assert "is not the input the recipe was made from (sha256 differs)" in err


@pytest.mark.parametrize("edit, extra, match", [
    (None, ["--passes", "fuse"], "--recipe gives the passes and their options; do not give --passes too"),
    (lambda r: r.update(pass_list=[]), [], "not an onnxslim_kit report with a pass list"),
    (lambda r: r.update(sources={"calib": {"python": "list of 8 samples"}}), [],
     r"its calibration data was given in Python \(list of 8 samples\); give --calib"),
    (lambda r: r["pass_list"][0]["options"].update(cse="maybe"), [], r"fuse\(cse=...\): expected true/false"),
])
def test_a_bad_recipe_is_one_line_exit_2(model_path, tmp_path, capsys, edit, extra, match):
    assert main([str(model_path), "--passes", "fuse", "-q", "-o", str(tmp_path / "a.onnx"),
                 "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    if edit:
        edit(report)
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert main(["--recipe", str(tmp_path / "r.json"), *extra, "-o", str(tmp_path / "b.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(match, err), err


def test_a_missing_recipe_file_is_a_user_error(tmp_path, capsys):
    assert main(["--recipe", str(tmp_path / "nope.json")]) == 2
    assert "cannot read it" in capsys.readouterr().err
