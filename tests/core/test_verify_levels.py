"""Which ONNX Runtime graph a candidate is judged on (:mod:`onnxslim_kit.verify`): the original
and a lossless candidate with ORT's optimisations off, a lossy candidate as users run it
(``all``: an int8 model by the integer kernels ORT fuses it into)."""

import numpy as np
import onnx
from onnx import numpy_helper

from onnxslim_kit import verify
from onnxslim_kit.verify import Verifier

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2, 8] x) => (float[2, 4] y) {
  y = MatMul (x, w)
}
"""


def model() -> onnx.ModelProto:
    proto = onnx.parser.parse_model(MODEL)
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((8, 4), np.float32), "w"))
    return proto


def test_lossy_candidates_run_with_ort_optimisations_on(monkeypatch):
    levels = []
    real = verify.make_session

    def spy(proto, opt_level="disable", **kw):
        levels.append(opt_level)
        return real(proto, opt_level, **kw)

    monkeypatch.setattr(verify, "make_session", spy)
    samples = [{"x": np.full((2, 8), float(i), np.float32)} for i in range(2)]
    checker = Verifier(model(), samples)
    assert levels == ["disable"]
    assert checker.check(model(), lossless=True).status == "ok" and levels[-1] == "disable"
    assert checker.check(model(), lossless=False).status == "ok" and levels[-1] == "all"
