"""Issue 15, item 1: a Gemm whose weight and bias are one tensor, folded with a per-column
Mul / Div / Add or a BatchNormalization.

``Gemm(x, W, W)`` — written so, or made so by the duplicate-constant merge from two equal
constants, or by MatMul + Add → Gemm from ``Add(MatMul(x, W), W)`` — reads ``W`` twice. A
scale fold must give ``B' = W·s`` and ``C' = W·s + t`` (not ``W·s²``: writing the new weight
into the shared array in place changed the bias it then read). Each case runs the pipeline
with verification off (so nothing can roll a wrong rewrite back) and on, and compares with
ONNX Runtime against the original; the fold itself must have happened, and an unrelated fold
of the same pass (a Conv + Mul branch) must be kept.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import assert_same_outputs, parse, random_feeds

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

W13 = "{0.5, -1.0, 2.0}"
W33 = "{0.5, -1.0, 2.0, 1.5, 0.25, -0.75, 3.0, -2.0, 1.0}"
BN = ("<float[3] g = {1.5, 0.5, 2.0}, float[3] bb = {0.1, -0.2, 0.3}, float[3] mu = {0.4, 0.0, -0.5},"
      " float[3] var = {1.0, 2.0, 0.5}>")
CONV_BRANCH = ("<float[2,1,1,1] cw = {1.5, -0.5}, float[1,2,1,1] cs = {3.0, 0.5}>",
               "c0 = Conv (z, cw)\n  c = Mul (c0, cs)")

# (name, first input shape, initializers, Gemm-producing body, the op after it, its init)
CASES = {
    "gemm_ww_mul": ("[2,1]", f"float[1,3] w = {W13}", "h = Gemm (x, w, w)", "y = Mul (h, k)",
                    "float[3] k = {2.0, 3.0, 4.0}"),
    "gemm_ww_div": ("[2,1]", f"float[1,3] w = {W13}", "h = Gemm (x, w, w)", "y = Div (h, k)",
                    "float[3] k = {2.0, 4.0, 0.5}"),
    "gemm_ww_mul_square_transb": ("[3,3]", f"float[3,3] w = {W33}",
                                  "h = Gemm <transB = 1, beta = 0.5> (x, w, w)", "y = Mul (h, k)",
                                  "float[1,3] k = {2.0, 3.0, 4.0}"),
    "gemm_ww_bn": ("[2,1]", f"float[1,3] w = {W13}", "h = Gemm (x, w, w)",
                   "y = BatchNormalization (h, g, bb, mu, var)", None),
    "gemm_equal_constants_mul": ("[2,1]", f"float[1,3] w = {W13}, float[1,3] w2 = {W13}",
                                 "h = Gemm (x, w, w2)", "y = Mul (k, h)", "float[3] k = {2.0, 3.0, 4.0}"),
    "matmul_add_w_mul": ("[2,1]", f"float[1,3] w = {W13}", "m = MatMul (x, w)\n  h = Add (m, w)",
                         "y = Mul (h, k)", "float[1,3] k = {2.0, 3.0, 4.0}"),
}


def case_model(name: str) -> onnx.ModelProto:
    shape, inits, body, after, after_init = CASES[name]
    extra = [inits] + ([after_init] if after_init else [])
    if "BatchNormalization" in after:
        extra.append(BN[1:-1])
    extra.append(CONV_BRANCH[0][1:-1])
    rows = shape.strip("[]").split(",")[0]
    return parse(f"""
<ir_version: 8, opset_import: ["" : 13]>
g (float{shape} x, float[1,1,2,2] z) => (float[{rows},3] y, float[1,2,2,2] c) <{', '.join(extra)}> {{
  {body}
  {after}
  {CONV_BRANCH[1]}
}}
""")


def run_fuse(model: onnx.ModelProto, verify: bool):
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    out, report = run_pipeline(model, parse_pass_list("fuse"), feed, verify=verify, verify_samples=2)
    return out, report.passes[0]


def op_types(model: onnx.ModelProto) -> list:
    return sorted(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("verify", [False, True], ids=["no-verify", "verify"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_weight_and_bias_fold_exactly(name, verify):
    model = case_model(name)
    out, entry = run_fuse(model, verify)
    onnx.checker.check_model(out, full_check=True)
    assert not entry.rolled_back, entry.verification
    if verify:
        assert entry.verification["status"] == "ok", entry.verification
    # the Gemm fold and the unrelated Conv fold both happened: one Gemm, one Conv, nothing else
    assert op_types(out) == ["Conv", "Gemm"], op_types(out)
    for seed in (1, 2, 3):
        assert_same_outputs(model, out, random_feeds(model, seed=seed), rtol=1e-5, atol=1e-5)


def test_shared_weight_values():
    """``Gemm(x, W, W)·k``: B' = W·k and C' = W·k exactly (float32), the original W untouched."""
    from onnx import numpy_helper

    model = case_model("gemm_ww_mul")
    original = model.SerializeToString()
    out, _ = run_fuse(model, verify=False)
    assert model.SerializeToString() == original
    gemm = next(n for n in out.graph.node if n.op_type == "Gemm")
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    expected = np.array([[0.5, -1.0, 2.0]], np.float32) * np.array([2.0, 3.0, 4.0], np.float32)
    np.testing.assert_array_equal(inits[gemm.input[1]], expected)
    np.testing.assert_array_equal(inits[gemm.input[2]], expected)
