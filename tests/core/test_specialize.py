"""--fix-input: inputs made constants before the passes, so fuse folds what depends on them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import TensorProto, helper, numpy_helper

import onnxslim_kit
from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError
from onnxslim_kit.specialize import parse_input_values


def rate_model() -> onnx.ModelProto:
    """``y = If(sr == 16000) {x · 2} else {x · 3}`` — a mode input choosing a branch, as silero's ``sr``."""
    def branch(name, factor):
        k = numpy_helper.from_array(np.array(factor, np.float32), f"{name}_k")
        return helper.make_graph([helper.make_node("Mul", ["x", f"{name}_k"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2, 3])], [k])

    rate = numpy_helper.from_array(np.array(16000, np.int64), "rate")
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
         helper.make_node("If", ["is16k"], ["y"], then_branch=branch("t", 2.0), else_branch=branch("e", 3.0))],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [rate])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_fixed_input_is_folded_away_and_outputs_match(rng):
    model = rate_model()
    before = model.SerializeToString()
    out, report = onnxslim_kit.optimize(model, "fuse", fixed_inputs={"sr": 8000})
    assert model.SerializeToString() == before  # the caller's proto is untouched
    assert [i.name for i in out.graph.input] == ["x"]
    assert "If" not in {n.op_type for n in out.graph.node}
    assert report.load_notes[0] == "input 'sr' fixed to 8000 (int64) and removed from the model's inputs"
    assert report.passes[0].verification["status"] == "ok"
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(out, {"x": x})[0], run_ort(model, {"x": x, "sr": np.array(8000)})[0])


@pytest.mark.parametrize("fixed,match", [
    ({"rate": 1}, "not an input of the model"),           # an initializer, not an input
    ({"nosuch": 1}, "not an input of the model .inputs: x, sr"),
    ({"sr": [1, 2]}, "2 value.s. given, the input holds 1"),
    ({"sr": "fast"}, "are not int64 values"),
])
def test_bad_fixed_inputs_are_clear_errors(fixed, match):
    with pytest.raises(UserError, match=match):
        onnxslim_kit.optimize(rate_model(), "fuse", fixed_inputs=fixed)


def test_parse_input_values():
    assert parse_input_values(["sr=16000", "k = 1, 2"]) == {"sr": ["16000"], "k": ["1", "2"]}
    for bad in ("sr", "=3", "sr="):
        with pytest.raises(UserError, match="expected NAME=VALUE"):
            parse_input_values([bad])


def test_cli_fix_input(tmp_path, capsys):
    path = tmp_path / "rate.onnx"
    onnx.save(rate_model(), path)
    assert main([str(path), "--fix-input", "sr=16000", "-o", str(tmp_path / "o.onnx")]) == 0
    assert [i.name for i in onnx.load(tmp_path / "o.onnx").graph.input] == ["x"]
    assert main([str(path), "--fix-input", "rate=1", "-o", str(tmp_path / "p.onnx")]) == 2
    err = capsys.readouterr().err
    assert "--fix-input rate: not an input" in err and "Traceback" not in err


@pytest.mark.realmodel
def test_silero_with_the_sample_rate_fixed(rng):
    """silero_vad's 16 kHz network alone: the 8 kHz branch and its weights go, outputs equal."""
    from onnxslim_kit.zoo import fetch

    path = fetch("silero_vad")
    original = onnx.load(path)
    samples = [{"input": (0.1 * rng.standard_normal((1, 576))).astype(np.float32),
                "state": (0.1 * rng.standard_normal((2, 1, 128))).astype(np.float32)} for _ in range(3)]
    out, report = onnxslim_kit.optimize(path, "fuse", fixed_inputs={"sr": 16000}, calib=samples)
    assert report.after["nodes"] < 100 < report.before["nodes"]  # subgraphs counted (689 → 73 measured)
    assert out.ByteSize() < 0.6 * original.ByteSize()
    for sample in samples:
        want = run_ort(original, {**sample, "sr": np.array(16000, np.int64)})
        for a, b in zip(want, run_ort(out, sample)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
