"""Verifying weights stored as decoders (``cluster``'s ``codebook[labels]``): a lossy candidate's
session at level ``all`` runs them without ORT's constant folding (which would hold every folded
intermediate at session creation: issue 16's 2.75 GB decoder verified at 1.39× its size), with the
same numbers; small decoders stay folded (:func:`onnxslim_kit.runtime.weight_decoders`,
``onnxslim_kit/verify.py``'s ``_session`` and ``UNFOLDED_DECODERS``)."""

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit import verify
from onnxslim_kit.runtime import make_session, weight_decoders
from onnxslim_kit.verify import Verifier

DECODED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2, 8] x) => (float[2, 4] y) {
  idx = Cast <to = 6> (labels)
  w = Gather <axis = 0> (codebook, idx)
  y = MatMul (x, w)
}
"""

LOOKUP_OF_INPUT = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2, 8] x) => (float[2, 4] y) {
  w = Gather <axis = 0> (x, idx)
  y = MatMul (w, v)
}
"""


def decoded() -> onnx.ModelProto:
    proto = onnx.parser.parse_model(DECODED)
    rng = np.random.default_rng(0)
    proto.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "codebook"),
        numpy_helper.from_array(rng.integers(0, 4, (8, 4)).astype(np.uint8), "labels"),
    ])
    onnx.checker.check_model(proto, full_check=True)
    return proto


def lookup_of_input() -> onnx.ModelProto:
    proto = onnx.parser.parse_model(LOOKUP_OF_INPUT)
    proto.graph.initializer.extend([numpy_helper.from_array(np.array([1, 0], np.int64), "idx"),
                                    numpy_helper.from_array(np.ones((8, 4), np.float32), "v")])
    return proto


def test_weight_decoders_counts_the_bytes_lookups_of_constants_decode():
    assert weight_decoders(decoded().graph) == 4 * 4 + 8 * 4  # float codebook, uint8 labels
    assert weight_decoders(lookup_of_input().graph) == 0


def _profiled_ops(proto, fold: bool, tmp_path) -> tuple:
    session = make_session(proto, "all", arena=False, prepack=False, fold=fold, profile=str(tmp_path / f"p{fold}"))
    out = session.run(None, {"x": np.arange(16, dtype=np.float32).reshape(2, 8)})[0]
    ops = {e["args"].get("op_name") for e in json.load(open(session.end_profiling())) if e.get("cat") == "Node"}
    return out, ops


def test_without_folding_the_run_decodes_with_the_same_numbers(tmp_path):
    folded, folded_ops = _profiled_ops(decoded(), True, tmp_path)
    run, run_ops = _profiled_ops(decoded(), False, tmp_path)
    assert "Gather" not in folded_ops and "Gather" in run_ops
    np.testing.assert_array_equal(folded, run)


@pytest.mark.parametrize("build, lossless, above, fold", [
    (decoded, False, 48, False),  # lossy candidate at level "all", decoders of 48 bytes ≥ the bound: not folded
    (decoded, False, 49, True),  # decoders under the bound: folded, as users run them
    (decoded, True, 48, True),  # lossless candidate: level "disable", nothing folds anyway
    (lookup_of_input, False, 1, True),  # no decoder: as before
])
def test_verifier_folds_unless_weights_are_large_decoders(monkeypatch, build, lossless, above, fold):
    calls = []
    real = verify.make_session

    def spy(proto, opt_level="disable", **kw):
        calls.append((opt_level, kw.get("fold", True)))
        return real(proto, opt_level, **kw)

    monkeypatch.setattr(verify, "make_session", spy)
    monkeypatch.setattr(verify, "UNFOLDED_DECODERS", above)
    samples = [{"x": np.full((2, 8), float(i), np.float32)} for i in range(2)]
    checker = Verifier(build(), samples)
    check = checker.check(build(), lossless=lossless)
    assert check.status == "ok"
    assert calls[-1] == ("disable" if lossless else "all", fold)
    assert all(d["max_abs"] == 0 for d in check.outputs.values())


def test_the_bound_leaves_small_decoders_folded():
    assert weight_decoders(decoded().graph) < verify.UNFOLDED_DECODERS
