"""Bad input through the command line (issue 15): every case gives exit 2 with one line on
stderr (``error: …``), or works (exit 0); never a traceback, never exit 1, never a numpy
warning; the input files stay byte-identical and nothing partial is written (no output, no
report, no ``.slim-*`` temporary folder).

Each case builds its files under ``tmp_path`` and returns the argument list; ``WORKS`` marks
the cases that are valid (they must exit 0 and write the output).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest

from onnxslim_kit.cli import main

from conftest import IDENTITY_ADD, parse

WORKS = "works"


def files_in(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _model(tmp_path, text: str = IDENTITY_ADD, name: str = "m.onnx", check: bool = True):
    path = tmp_path / name
    proto = parse(text) if check else onnx.parser.parse_model(text)
    onnx.save(proto, path)
    return path


def _out(tmp_path):
    return str(tmp_path / "out.onnx")


def _base(tmp_path, *extra):
    return [str(_model(tmp_path)), "-o", _out(tmp_path), *map(str, extra)]


def _npz(tmp_path, name="c.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _ext_missing(tmp_path):
    proto = parse(IDENTITY_ADD)
    weight = proto.graph.initializer[0]
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight), weight.name))  # raw data
    path = tmp_path / "m.onnx"
    onnx.save(proto, path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    (tmp_path / "m.onnx.data").unlink()
    return [str(path), "-o", _out(tmp_path)]


def _truncated(tmp_path):
    path = _model(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return [str(path), "-o", _out(tmp_path)]


def _written(tmp_path, name: str, data: bytes):
    (tmp_path / name).write_bytes(data)
    return [str(tmp_path / name), "-o", _out(tmp_path)]


NO_OUTPUTS = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4] x) => () { y = Relu (x) }
"""

UNDEFINED_INPUT = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4] x) => (float[1,4] y) { y = Add (x, nowhere) }
"""

ORT_REJECTS = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4] x) => (float[1,4] y) <int64[4] b = {1, 2, 3, 4}> { y = Add (x, b) }
"""

CUSTOM_OP = """
<ir_version: 8, opset_import: ["" : 13, "com.example" : 1]>
g (float[1,4] x) => (float[1,4] y) { t = Relu (x)  y = com.example.Mystery (t) }
"""

NO_AI_ONNX = """
<ir_version: 8, opset_import: ["com.example" : 1]>
g (float[1,4] x) => (float[1,4] y) { y = com.example.Mystery (x) }
"""

DYNAMIC = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N,4] x) => (float[N,4] y) <float[4] b = {1.0, 2.0, 3.0, 4.0}> { y = Add (x, b) }
"""


def _recipe(tmp_path, content: str):
    (tmp_path / "r.json").write_text(content)
    return _base(tmp_path, "--recipe", tmp_path / "r.json")


CASES = {
    # the model file
    "missing file": lambda t: [str(t / "nope.onnx"), "-o", _out(t)],
    "a folder": lambda t: [str(t), "-o", _out(t)],
    "empty file": lambda t: _written(t, "e.onnx", b""),
    "truncated file": _truncated,
    "not an ONNX file": lambda t: _written(t, "x.onnx", bytes(range(256)) * 4),
    "a text file named .onnx": lambda t: _written(t, "x.onnx", b"hello, I am not a model\n"),
    "json named .onnx": lambda t: _written(t, "x.onnx", b'{"graph": {}}'),
    "missing external data": _ext_missing,
    "no graph outputs": lambda t: [str(_model(t, NO_OUTPUTS, check=False)), "-o", _out(t)],
    # an invalid original is copied through unchanged, with a note (the tool makes it no worse)
    "graph fails the checker": lambda t: [str(_model(t, UNDEFINED_INPUT, check=False)), "-o", _out(t), WORKS],
    "ORT cannot load it": lambda t: [str(_model(t, ORT_REJECTS, check=False)), "-o", _out(t), "--strict", WORKS],
    "custom-domain op (fuse)": lambda t: [str(_model(t, CUSTOM_OP, check=False)), "-o", _out(t), WORKS],
    "no ai.onnx opset": lambda t: [str(_model(t, NO_AI_ONNX, check=False)), "-o", _out(t)],
    "no model at all": lambda t: ["-o", _out(t)],
    # shapes and fixed inputs
    "--input-shape no colon": lambda t: _base(t, "--input-shape", "x=1,4"),
    "--input-shape not integers": lambda t: _base(t, "--input-shape", "x:1,a"),
    "--input-shape unknown name": lambda t: _base(t, "--input-shape", "nope:1,4"),
    "--input-shape wrong rank": lambda t: _base(t, "--input-shape", "x:1,4,4"),
    "--input-shape against a static dim": lambda t: _base(t, "--input-shape", "x:2,4"),
    "--input-shape negative": lambda t: [str(_model(t, DYNAMIC)), "-o", _out(t), "--input-shape", "x:-3,4"],
    "--input-shape zero": lambda t: [str(_model(t, DYNAMIC)), "-o", _out(t), "--input-shape", "x:0,4"],
    "--fix-input of an initializer": lambda t: _base(t, "--fix-input", "b=1,2,3,4"),
    "--fix-input unknown": lambda t: _base(t, "--fix-input", "nope=1"),
    "--fix-input no value": lambda t: _base(t, "--fix-input", "x="),
    "--fix-input wrong count": lambda t: _base(t, "--fix-input", "x=1,2"),
    "--fix-input not a number": lambda t: _base(t, "--fix-input", "x=a,b,c,d"),
    # passes and options
    "unknown pass": lambda t: _base(t, "--passes", "nosuchpass"),
    "unknown pass option": lambda t: _base(t, "--passes", "fuse(nosuch=1)"),
    "bad pass option value": lambda t: _base(t, "--passes", "prune(ratio=abc)"),
    "pass option out of range": lambda t: _base(t, "--passes", "prune(ratio=7)"),
    "unbalanced parens": lambda t: _base(t, "--passes", "prune(ratio=0.3"),
    "closing paren only": lambda t: _base(t, "--passes", "fuse)"),
    "empty pass list": lambda t: _base(t, "--passes", ",,"),
    "unknown CLI option": lambda t: _base(t, "--no-such-option"),
    "--num-samples not a number": lambda t: _base(t, "--num-samples", "many"),
    "--num-samples zero": lambda t: _base(t, "--num-samples", "0"),
    "--verify-samples negative": lambda t: _base(t, "--verify-samples", "-1"),
    "--rtol negative": lambda t: _base(t, "--rtol", "-1"),
    "--rtol nan": lambda t: _base(t, "--rtol", "nan"),
    "--seed not a number": lambda t: _base(t, "--seed", "x"),
    "unknown subcommand option": lambda t: ["bench", "--no-such-option"],
    "bench missing file": lambda t: ["bench", str(_model(t)), str(t / "nope.onnx"), "--runs", "1"],
    "bench --runs zero": lambda t: ["bench", str(_model(t)), "--runs", "0"],
    "fetch unknown model": lambda t: ["fetch", "no-such-model", "-o", _out(t)],
    "bench --report below a file": lambda t: (t / "f").write_text("x") and [
        "bench", str(_model(t)), "--runs", "1", "--no-memory", "--report", str(t / "f" / "r.json")],
    "fetch -o below a file": lambda t: (t / "f").write_text("x") and ["fetch", "ppocr_cls_v2", "-o", str(t / "f" / "o")],
    # data
    "--calib missing file": lambda t: _base(t, "--calib", t / "nope.npz"),
    "--calib not numpy": lambda t: (t / "c.npz").write_text("hello") and _base(t, "--calib", t / "c.npz"),
    "--calib empty folder": lambda t: (t / "cal").mkdir() or _base(t, "--calib", t / "cal"),
    "--calib wrong keys": lambda t: _base(t, "--calib", _npz(t, y=np.zeros((1, 4), np.float32))),
    "--calib wrong shape": lambda t: _base(t, "--calib", _npz(t, x=np.zeros((3, 5, 7), np.float32))),
    "--calib wrong dtype": lambda t: _base(t, "--calib", _npz(t, x=np.array([["a", "b", "c", "d"]]))),
    "--calib NaN": lambda t: _base(t, "--calib", _npz(t, x=np.full((1, 4), np.nan, np.float32))),
    "--calib object array": lambda t: _base(t, "--calib", t / "o.npy") if np.save(
        t / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True) is None else None,
    "--eval missing file": lambda t: _base(t, "--eval", t / "nope.npz"),
    "--eval wrong keys": lambda t: _base(t, "--eval", _npz(t, y=np.zeros((1, 4), np.float32))),
    "--eval NaN": lambda t: _base(t, "--eval", _npz(t, x=np.full((1, 4), np.nan, np.float32))),
    # output and report
    "-o equal to the input": lambda t: [str(_model(t)), "-o", str(t / "m.onnx")],
    "-o into a missing folder": lambda t: [str(_model(t)), "-o", str(t / "new" / "sub" / "out.onnx"), WORKS],
    "-o below a file": lambda t: (t / "f").write_text("x") and [str(_model(t)), "-o", str(t / "f" / "o.onnx")],
    "-o is a folder": lambda t: [str(_model(t)), "-o", str(t)],
    "--report below a file": lambda t: (t / "f").write_text("x") and _base(t, "--report", t / "f" / "r.json"),
    "--report is a folder": lambda t: _base(t, "--report", t),
    "--report equal to the input": lambda t: _base(t, "--report", t / "m.onnx"),
    "--report equal to -o": lambda t: _base(t, "--report", _out(t)),
    # recipe
    "--recipe missing file": lambda t: _base(t, "--recipe", t / "nope.json"),
    "--recipe not JSON": lambda t: _recipe(t, "this is { not json"),
    "--recipe a JSON list": lambda t: _recipe(t, "[1, 2, 3]"),
    "--recipe missing keys": lambda t: _recipe(t, json.dumps({"tool": {}})),
    "--recipe with --passes": lambda t: _recipe(t, json.dumps({"passes": []})) + ["--passes", "fuse"],
    # tolerances and exclusions
    "--atol unknown output": lambda t: _base(t, "--atol", "nope:1e-3"),
    "--atol no colon": lambda t: _base(t, "--atol", "1e-3"),
    "--atol negative": lambda t: _base(t, "--atol", "y:-1"),
    "--exclude matching nothing": lambda t: _base(t, "--passes", "fuse,int8", "--exclude", "op:Conv"),
    "--exclude bad regex": lambda t: _base(t, "--passes", "int8", "--exclude", "re:(unclosed"),
    "--exclude bad selector": lambda t: _base(t, "--passes", "int8", "--exclude", "first:Add:x"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(case, tmp_path, capsys):
    args = CASES[case](tmp_path)
    works = WORKS in args
    args = [a for a in args if a != WORKS]
    before = files_in(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(args + ([] if args[0] == "fetch" else ["-q"]))
    err = capsys.readouterr().err
    numpy_warnings = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert not numpy_warnings, [str(w.message) for w in numpy_warnings]
    assert "Traceback" not in err and "internal error" not in err, err
    after = files_in(tmp_path)
    for name, data in before.items():  # the inputs byte-identical (and none removed)
        assert after.get(name) == data, name
    assert not [p for p in tmp_path.rglob(".slim-*")], "temporary files left"
    if works:
        assert code == 0, err
        assert set(after) - set(before), "nothing written"
        return
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[onnxslim_kit]")]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert after == before, f"written: {sorted(set(after) - set(before))}"


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"verify_samples": -1}, {"rtol": float("nan")},
                                    {"rtol": -1.0}, {"input_shapes": {"x": [0, 4]}}])
def test_api_refuses_bad_settings(kwargs, tmp_path):
    """The same settings through ``onnxslim_kit.optimize``: a UserError naming the setting."""
    from onnxslim_kit import UserError, optimize

    with pytest.raises(UserError, match=next(iter(kwargs))):
        optimize(_model(tmp_path), **kwargs)
