"""A custom-domain op ONNX Runtime cannot run (issue 15 item 3): every pass works or says why.

``fuse``, ``compact`` and ``dynamic`` work without ORT. ``prune``, ``int8`` and ``fp16`` need
ORT to observe the model (shapes, activation ranges, drift): the pipeline turns ORT's refusal
of the model into a counted skip of that pass (model unchanged, exit 0), never an internal
error (exit 1); a pass whose ORT error is about a model ORT *can* run stays an internal error.
"""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import parse
from onnx import numpy_helper

import onnxslim_kit
from onnxslim_kit.errors import PassError
from onnxslim_kit.pipeline import Pass, PassResult, register_pass

CUSTOM = """
<ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
  c = Conv <pads=[1,1,1,1]> (x, w, b)
  r = Relu (c)
  f = com.example.Foo (r)
  y = Conv (f, w2, b2)
}
"""


def custom_model() -> onnx.ModelProto:
    model = onnx.parser.parse_model(CUSTOM)
    rng = np.random.default_rng(0)
    for name, shape in (("w", (4, 3, 3, 3)), ("b", (4,)), ("w2", (4, 4, 1, 1)), ("b2", (4,))):
        model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    return model


@pytest.mark.parametrize("passes", ["prune", "int8", "fp16", "fuse,int8,compact"])
def test_pass_needing_ort_is_skipped_with_the_reason(passes):
    model = custom_model()
    before = model.SerializeToString()
    out, report = onnxslim_kit.optimize(model, passes)
    assert model.SerializeToString() == before  # the input is never modified
    needing = [p for p in report.passes if p.name in ("prune", "int8", "fp16")]
    assert needing
    for entry in needing:
        assert not entry.modified and not entry.rolled_back
        reasons = " ".join(entry.skipped)
        assert "ONNX Runtime cannot run the model" in reasons and "com.example:Foo" in reasons, entry.skipped
    assert [n.op_type for n in out.graph.node].count("Foo") == 1
    onnx.checker.check_model(out)


def test_cli_exit_0_and_one_warning(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(custom_model(), path)
    proc = subprocess.run([sys.executable, "-m", "onnxslim_kit", str(path), "--passes", "int8", "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "ONNX Runtime cannot run the model" in proc.stdout + proc.stderr
    assert out.exists()


@register_pass
class _OrtBug(Pass):
    """Test pass: asks ORT to run a model it breaks itself (a bug in the pass, not the model)."""

    name = "test_ort_bug"
    lossless = True

    def run(self, model, ctx):
        from onnxslim_kit.runtime import make_session

        proto = model.to_proto()
        proto.graph.node[0].op_type = "NoSuchOp"
        make_session(proto)
        return PassResult()


def test_ort_error_on_a_model_ort_runs_stays_an_internal_error():
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) { y = Relu (x) }
    """)
    with pytest.raises(PassError, match="internal error in pass 'test_ort_bug'"):
        onnxslim_kit.optimize(model, "test_ort_bug")
