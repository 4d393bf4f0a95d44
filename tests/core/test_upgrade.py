"""Old-opset models upgraded on load when the upgrade is lossless (issue 15 item 8)."""

from __future__ import annotations

import glob
import os
import time

import numpy as np
import onnx
import pytest
from conftest import parse, run_ort
from onnx import numpy_helper

from onnxslim_kit import optimize
from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import Model, load_proto

CONV_RELU_POOL = """
<ir_version: 3, opset_import: ["" : OPSET]>
g (float[1,2,6,6] x) => (float[1,3,3,3] y) {
  w = Constant <value = float[3,2,1,1] {1.0, -1.0, 0.5, 2.0, -0.25, 0.75}> ()
  c = Conv (x, w)
  r = ACT (c)
  y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r)
}
"""

# Add-6 (with the legacy broadcast attribute) has no ONNX Runtime kernel: the upgrade cannot be checked
ADD_BROADCAST = """
<ir_version: 3, opset_import: ["" : 6]>
g (float[2,3] x, float[3] b) => (float[2,3] y) {
  y = Add <broadcast = 1> (x, b)
}
"""


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)}


def _model(opset: int) -> onnx.ModelProto:
    # ONNX Runtime has no Relu-1 kernel (consumed_inputs); Identity-1 it runs
    act = "Relu" if opset >= 6 else "Identity"
    return onnx.parser.parse_model(CONV_RELU_POOL.replace("OPSET", str(opset)).replace("ACT", act))


def _opset(proto) -> int:
    return next(i.version for i in proto.opset_import if i.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("opset", [1, 6])
def test_old_opset_upgraded_on_load(tmp_path, opset):
    original = _model(opset)
    path = tmp_path / "old.onnx"
    path.write_bytes(original.SerializeToString())
    proto = load_proto(path)
    assert _opset(proto) == 9 and proto.ir_version >= 4
    onnx.checker.check_model(proto, full_check=True)
    np.testing.assert_array_equal(run_ort(proto, _feeds())[0], run_ort(original, _feeds())[0])
    model = Model.from_proto(proto)
    assert any(f"opset {opset} upgraded to 9" in note for note in model.load_notes), model.load_notes
    exported = model.to_proto()
    assert all(p.key != "onnxslim_kit.load_note" for p in exported.metadata_props)


@pytest.mark.parametrize("opset", [1, 6])
def test_old_opset_through_fuse_and_compact(tmp_path, capsys, opset):
    original = _model(opset)
    path, out = tmp_path / "old.onnx", tmp_path / "out.onnx"
    path.write_bytes(original.SerializeToString())
    code = main([str(path), "--passes", "fuse,compact", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"opset {opset} upgraded to 9" in captured.out + captured.err
    assert path.read_bytes() == original.SerializeToString()
    result = onnx.load(out)
    onnx.checker.check_model(result, full_check=True)
    np.testing.assert_allclose(run_ort(result, _feeds())[0], run_ort(original, _feeds())[0], rtol=1e-5, atol=1e-6)


def test_unverifiable_upgrade_is_one_line(tmp_path, capsys):
    path = tmp_path / "add6.onnx"
    path.write_bytes(onnx.parser.parse_model(ADD_BROADCAST).SerializeToString())
    before = path.read_bytes()
    with pytest.raises(UserError, match="ONNX Runtime cannot run the original"):
        load_proto(path)
    code = main([str(path), "--passes", "fuse", "-o", str(tmp_path / "out.onnx"), "-q"])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "opset 6" in lines[0] and "Traceback" not in err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["add6.onnx"]


def test_upgrade_keeps_the_input_proto():
    from onnxslim_kit.upgrade import upgrade

    original = _model(6)
    before = original.SerializeToString()
    upgraded = upgrade(original, 6, "m.onnx")
    assert original.SerializeToString() == before and _opset(upgraded) == 9


# --- onnx's own old-opset exports ---------------------------------------------------------------

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _wheel_cases():
    return sorted(glob.glob(os.path.join(DATA, "pytorch-converted", "*", "model.onnx"))
                  + glob.glob(os.path.join(DATA, "pytorch-operator", "*", "model.onnx")))


@pytest.mark.realmodel
def test_wheel_pytorch_models_through_fuse_and_compact(tmp_path):
    """Every pytorch-converted / pytorch-operator model of the installed onnx wheel: fuse,compact
    exit 0 with the test's expected outputs, or one line (exit 2) where the upgrade of an
    opset-6 model cannot be verified because ONNX Runtime cannot run the original."""
    start, done, refused = time.perf_counter(), [], []
    for path in _wheel_cases():
        folder = os.path.dirname(path)
        data = os.path.join(folder, "test_data_set_0")
        inputs = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(data, "input_*.pb")))]
        expected = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(data, "output_*.pb")))]
        original = onnx.load(path)
        names = [i.name for i in original.graph.input if i.name not in {t.name for t in original.graph.initializer}]
        feeds = dict(zip(names, inputs))
        try:
            result, report = optimize(path, "fuse,compact", calib=[feeds])
        except UserError as exc:
            assert "ONNX Runtime cannot run the original" in str(exc) and "\n" not in str(exc), (path, str(exc))
            refused.append(os.path.basename(folder))
            continue
        assert not any(p.rolled_back for p in report.passes), path
        out_names = [o.name for o in result.graph.output]
        got = dict(zip(out_names, run_ort(result, {n: feeds[n] for n in names if n in
                                                   {i.name for i in result.graph.input}})))
        for name, want in zip([o.name for o in original.graph.output], expected):
            np.testing.assert_allclose(got[name], want, rtol=1e-3, atol=1e-5, equal_nan=True, err_msg=path)
        done.append(os.path.basename(folder))
    assert len(done) >= 75, (len(done), refused)
    assert time.perf_counter() - start < 120
