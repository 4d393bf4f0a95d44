"""``fuse`` on float16 graphs (issue 15): a fold whose float16 rounding would move an output
past the lossless bound is skipped with its reason, and the other folds survive
(:mod:`onnxslim_kit.passes.fuse.fp16_guard`).

The regressions are the fuzzer's float16 findings (``benchmarks/fuzz_lossless.py --graphs 2600
--seed 1|2``, as ONNX text): each was rolled back by verification or, with verification off,
moved an output past the bound. Each must now pass both ways: with verification on ``fuse`` is
not rolled back, with it off the outputs stay within ``1e-6 + 4·eps16·max|a|`` per output on
several random inputs — and the fold that caused it is the one skipped, by its reason.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from fuzz_graphs import check_lossless, check_valid, session
from onnx import numpy_helper

import onnxslim_kit
from onnxslim_kit.passes.fuse import fp16_guard

REASON = fp16_guard.REASON
BOUND = 4 * 2.0 ** -10  # the verifier's relative bound on float16 outputs (4 float16 steps)

FINDINGS = {
    # rollback with passes 'fuse' (fuzz_lossless.py --seed 1, graph 244)
    "s1_244": """
<ir_version: 9, opset_import: ["" : 20]>
fuzz (float16[1,3,3] x) => (float16[1,2,1] div26, float16[1,3,3] batc21)
<float16[2,3,3] c1 = {0,0,0,0,0,0,0,0,0,14771,15403,15436,47475,15104,14421,15412,47394,15822},
 float16[2,3,1] c4 = {0,0,0,14465,15035,47345},
 float16[1,3,1] c7 = {0,0,0},
 float16[1] c8 = {14531},
 float16[3] c11 = {14486,15431,14389},
 float16[3] c12 = {14486,15431,14389},
 float16[3] c13 = {15423,15470,15031},
 float16[3] c18 = {48044,15693,15087},
 float16[3] c19 = {14767,47823,48195},
 float16[3] c20 = {15864,14768,15718},
 float16[1,2,1] c25 = {48447,15205}>
{
[n3] conv2 = Conv <group: int = 1, kernel_shape: ints = [3], pads: ints = [0, 0], strides: ints = [2]> (x, c1)
[n6] conv5 = Conv <group: int = 1, kernel_shape: ints = [1], pads: ints = [0, 0], strides: ints = [2]> (x, c4)
[n10] conv9 = Conv <group: int = 1, kernel_shape: ints = [1], pads: ints = [1, 1], strides: ints = [2]> (x, c7, c8)
[n15] batc14 = BatchNormalization <epsilon: float = 1e-05> (x, c11, c12, c12, c13)
[n17] cast16 = Cast <to: int = 10> (conv9)
[n22] batc21 = BatchNormalization <epsilon: float = 1e-05> (batc14, c12, c18, c19, c20)
[n24] relu23 = Relu (cast16)
[n27] div26 = Div (conv2, c25)
}
""",
    # rollback with passes 'fuse' (fuzz_lossless.py --seed 1, graph 277)
    "s1_277": """
<ir_version: 8, opset_import: ["" : 18]>
fuzz (float16[2,3,4] x) => (float16[2,3,4] relu19, float16[2,3,4] leak6, float16[2,3,8] conc8)
<float16[3] c10 = {47548,15090,47108},
 float16[3] c11 = {48631,48422,47352},
 float16[3] c12 = {15787,15061,15653},
 float16[3] c15 = {48631,48422,47352},
 float16[3] c16 = {14636,15403,15459}>
{
[n3] cons2 = Constant <value: tensor = float16[1,1,1] v1 {14665}> ()
[n5] mul4 = Mul (x, cons2)
[n7] leak6 = LeakyRelu <alpha: float = 0.1> (mul4)
[n9] conc8 = Concat <axis: int = 2> (x, x)
[n14] batc13 = BatchNormalization <epsilon: float = 0.001> (leak6, c10, c11, c11, c12)
[n18] batc17 = BatchNormalization <epsilon: float = 1e-05> (x, c15, c11, c15, c16)
[n20] relu19 = Relu (batc17)
}
""",
    # mismatch with passes 'fuse,compact' (fuzz_lossless.py --seed 1, graph 968)
    "s1_968": """
<ir_version: 9, opset_import: ["" : 20]>
fuzz (float16[2,1] x) => (float16[2,1] clip16, float16[2,1] batc7)
<float16[1] c4 = {47917},
 float16[1] c5 = {15828},
 float16[1] c6 = {15461},
 float16 c11 = {48595},
 float16 c12 = {15456},
 float16 c15 = {45816}>
{
[n3] cons2 = Constant <value: tensor = float16[1] v1 {47816}> ()
[n8] batc7 = BatchNormalization <epsilon: float = 0.001> (x, cons2, c4, c5, c6)
[n10] relu9 = Relu (batc7)
[n14] clip13 = Clip (relu9, c11, c12)
[n17] clip16 = Clip (clip13, c15)
}
""",
    # mismatch with passes 'fuse' (fuzz_lossless.py --seed 1, graph 970)
    "s1_970": """
<ir_version: 9, opset_import: ["" : 20]>
fuzz (float16[2,1] x) => (float16[2,1] relu13, float16[2,1] batc7, float16[2,1] relu9)
<float16[1] c4 =  {47917}, float16[1] c5 =  {15828}, float16[1] c6 =  {15461}>
{
[n3] cons2 = Constant <value: tensor = float16[1] v1 {47816}> ()
[n8] batc7 = BatchNormalization <epsilon: float = 0.001> (x, cons2, c4, c5, c6)
[n10] relu9 = Relu (batc7)
[n12] relu11 = Relu (relu9)
[n14] relu13 = Relu (relu11)
}
""",
    # rollback with passes 'fuse' (fuzz_lossless.py --seed 1, graph 1171)
    "s1_1171": """
<ir_version: 8, opset_import: ["" : 17]>
fuzz (float16[1,5] x) => (float16[1,1] mul36, float16[1,10] conc1, float16[1,1] relu14)
<float16 c6 = {15684},
 float16[5,1] c9 = {48610,15461,47538,48326,14659},
 float16[6,10] c16 = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,15809,48615,47453,15863,15804,48117,15862,15416,15018,15818},
 float16 c17 = {47274},
 float16[6] c20 = {48515,48464,47292,14389,48188,47423},
 float16[6,1] c32 = {47540,15694,14698,14714,47603,48563},
 float16 c35 = {15431}>
{
[n2] conc1 = Concat <axis: int = 1> (x, x)
[n5] cons4 = Constant <value: tensor = float16[5,5] v3 {0,0,0,0,0,0,0,0,0,0,48441,48590,48387,15033,15589,48613,48580,47416,15243,48172,0,0,0,0,0}> ()
[n8] gemm7 = Gemm <transB: int = 1> (x, cons4, c6)
[n11] matm10 = MatMul (gemm7, c9)
[n13] clip12 = Clip (matm10)
[n15] relu14 = Relu (matm10)
[n19] gemm18 = Gemm <transB: int = 1> (conc1, c16, c17)
[n23] cons22 = Constant <value: tensor = float16[6] v21 {15246,15794,47929,15573,15795,48193}> ()
[n26] cons25 = Constant <value: tensor = float16[6] v24 {15375,15723,14779,15680,48434,15224}> ()
[n29] cons28 = Constant <value: tensor = float16[6] v27 {14932,14620,15382,15350,15761,15838}> ()
[n31] batc30 = BatchNormalization <epsilon: float = 1e-05> (gemm18, c20, cons22, cons25, cons28)
[n34] matm33 = MatMul (batc30, c32)
[n37] mul36 = Mul (matm33, c35)
}
""",
    # rollback with passes 'fuse,compact' (fuzz_lossless.py --seed 1, graph 1172)
    "s1_1172": """
<ir_version: 8, opset_import: ["" : 17]>
fuzz (float16[1,5] x) => (float16[1,1] mul34, float16[1,10] conc1, float16[1,1] relu14)
<float16 c6 = {15684},
 float16[5,1] c9 = {48610,15461,47538,48326,14659},
 float16[6,10] c16 = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,15809,48615,47453,15863,15804,48117,15862,15416,15018,15818},
 float16 c17 = {47274},
 float16[6] c20 = {48515,48464,47292,14389,48188,47423},
 float16[6] c24 = {15375,15723,14779,15680,48434,15224},
 float16[6,1] c30 = {47540,15694,14698,14714,47603,48563},
 float16 c33 = {15431}>
{
[n2] conc1 = Concat <axis: int = 1> (x, x)
[n5] cons4 = Constant <value: tensor = float16[5,5] v3 {0,0,0,0,0,0,0,0,0,0,48441,48590,48387,15033,15589,48613,48580,47416,15243,48172,0,0,0,0,0}> ()
[n8] gemm7 = Gemm <transB: int = 1> (x, cons4, c6)
[n11] matm10 = MatMul (gemm7, c9)
[n13] clip12 = Clip (matm10)
[n15] relu14 = Relu (matm10)
[n19] gemm18 = Gemm <transB: int = 1> (conc1, c16, c17)
[n23] cons22 = Constant <value: tensor = float16[6] v21 {15246,15794,47929,15573,15795,48193}> ()
[n27] cons26 = Constant <value: tensor = float16[6] v25 {14932,14620,15382,15350,15761,15838}> ()
[n29] batc28 = BatchNormalization <epsilon: float = 1e-05> (gemm18, c20, cons22, c24, cons26)
[n32] matm31 = MatMul (batc28, c30)
[n35] mul34 = Mul (matm31, c33)
}
""",
    # rollback with passes 'fuse,compact' (fuzz_lossless.py --seed 1, graph 1661)
    "s1_1661": """
<ir_version: 8, opset_import: ["" : 16]>
fuzz (float16[1,3] x) => (float16[1,1] prel53, float16[2,3] conc1, float16[2,3] resh14, float16[1,1] matm43)
<int64 i5 = {0},
 int64[1] i8 = {0},
 int64[1] i11 = {-1},
 float16[3] c19 = {48093,48162,15607},
 float16[3] c22 = {48093,48162,15607},
 float16[3] c23 = {48093,48162,15607},
 float16[3] c24 = {15510,47973,47374},
 float16[3] c25 = {14362,15555,15773},
 float16[3,3] c28 = {0,0,0,0,0,0,0,0,0},
 float16[1,3] c29 = {15721,48333,47971},
 float16[3,3] c32 = {0,0,0,14513,14399,15395,47722,48071,14857},
 float16 c33 = {15208},
 float16[3] c36 = {47587,47396,15121},
 float16[3] c37 = {47439,47777,15549},
 float16[3] c38 = {15075,48288,14673},
 float16[3] c39 = {14362,15555,15773},
 float16[3,1] c42 = {47340,15497,15716},
 float16[1] c45 = {48045},
 float16[1] c49 = {15183},
 float16[1] c52 = {47256}>
{
[n2] conc1 = Concat <axis: int = 0> (x, x)
[n4] shap3 = Shape (conc1)
[n7] gath6 = Gather <axis: int = 0> (shap3, i5)
[n10] unsq9 = Unsqueeze (gath6, i8)
[n13] conc12 = Concat <axis: int = 0> (unsq9, i11)
[n15] resh14 = Reshape (conc1, conc12)
[n18] cons17 = Constant <value: tensor = float16[3,3] v16 {47580,15594,15518,0,0,0,15034,47936,48517}> ()
[n21] gemm20 = Gemm <alpha: float = 0.5, beta: float = 2, transB: int = 1> (x, cons17, c19)
[n27] batc26 = BatchNormalization <epsilon: float = 0.001> (gemm20, c22, c23, c24, c25)
[n31] gemm30 = Gemm <alpha: float = 1, beta: float = 1, transB: int = 1> (batc26, c28, c29)
[n35] gemm34 = Gemm <alpha: float = 0.5, beta: float = 1, transB: int = 1> (x, c32, c33)
[n41] batc40 = BatchNormalization <epsilon: float = 1e-05> (gemm34, c36, c37, c38, c39)
[n44] matm43 = MatMul (batc40, c42)
[n48] cons47 = Constant <value: tensor = float16[1] v46 {47256}> ()
[n51] batc50 = BatchNormalization <epsilon: float = 1e-05> (matm43, c45, cons47, c45, c49)
[n54] prel53 = PRelu (batc50, c52)
}
""",
    # rollback with passes 'fuse,compact' (fuzz_lossless.py --seed 1, graph 1952)
    "s1_1952": """
<ir_version: 9, opset_import: ["" : 20]>
fuzz (float16[1,1,1] x) => (float16[1,1] resh25, float16[1,1,1] batc7, float16[1,1,1] tran9)
<float16[1] c3 = {48556},
 float16[1] c4 = {48556},
 float16[1] c5 = {15832},
 float16[1] c6 = {14599},
 float16[1] c11 = {48368},
 int64 i16 = {0},
 int64[1] i19 = {0},
 int64[1] i22 = {-1}>
{
[n2] tran1 = Transpose <perm: ints = [2, 0, 1]> (x)
[n8] batc7 = BatchNormalization <epsilon: float = 0.001> (x, c3, c4, c5, c6)
[n10] tran9 = Transpose <perm: ints = [1, 0, 2]> (tran1)
[n13] prel12 = PRelu (tran9, c11)
[n15] shap14 = Shape (x)
[n18] gath17 = Gather <axis: int = 0> (shap14, i16)
[n21] unsq20 = Unsqueeze (gath17, i19)
[n24] conc23 = Concat <axis: int = 0> (unsq20, i22)
[n26] resh25 = Reshape (x, conc23)
}
""",
    # rollback with passes 'fuse' (fuzz_lossless.py --seed 1, graph 1954)
    "s1_1954": """
<ir_version: 9, opset_import: ["" : 20]>
fuzz (float16[1,1,1] x) => (float16[1,1] resh25, float16[1,1,1] batc7, float16[1,1,1] tran9)
<float16[1] c3 = {48556},
 float16[1] c4 = {48556},
 float16[1] c5 = {15832},
 float16[1] c6 = {14599},
 float16[1] c11 = {48368},
 int64 i16 = {0},
 int64[1] i19 = {0},
 int64[1] i22 = {-1}>
{
[n2] tran1 = Transpose <perm: ints = [1, 0, 2]> (x)
[n8] batc7 = BatchNormalization <epsilon: float = 0.001> (x, c3, c4, c5, c6)
[n10] tran9 = Transpose <perm: ints = [1, 0, 2]> (tran1)
[n13] prel12 = PRelu (tran9, c11)
[n15] shap14 = Shape (x)
[n18] gath17 = Gather <axis: int = 0> (shap14, i16)
[n21] unsq20 = Unsqueeze (gath17, i19)
[n24] conc23 = Concat <axis: int = 0> (unsq20, i22)
[n26] resh25 = Reshape (x, conc23)
}
""",
    # rollback with passes 'fuse' (fuzz_lossless.py --seed 2, graph 1456)
    "s2_1456": """
<ir_version: 8, opset_import: ["" : 17]>
fuzz (float16[1,5,1] x) => (float16[1,1] mul21, float16[1,5] resh12)
<int64 i3 = {0},
 int64[1] i6 = {0},
 int64[1] i9 = {-1},
 float16[5,5] c14 = {15500,47657,47188,14370,15681,15783,48237,15595,15405,15806,15683,14342,15726,47173,15595,47464,15732,15402,14950,15202,47162,47359,48303,48279,15478},
 float16[5,1] c17 = {15804,15069,48201,14995,48225},
 float16 c20 = {48528}>
{
[n2] shap1 = Shape (x)
[n5] gath4 = Gather <axis: int = 0> (shap1, i3)
[n8] unsq7 = Unsqueeze (gath4, i6)
[n11] conc10 = Concat <axis: int = 0> (unsq7, i9)
[n13] resh12 = Reshape (x, conc10)
[n16] gemm15 = Gemm <transB: int = 0> (resh12, c14)
[n19] gemm18 = Gemm <transB: int = 0> (resh12, c17)
[n22] mul21 = Mul (c20, gemm18)
}
""",
}


def fuse(model, verify=True, passes="fuse"):
    logging.disable(logging.WARNING)
    try:
        out, report = onnxslim_kit.optimize(model, passes=passes, verify=verify)
    finally:
        logging.disable(logging.NOTSET)
    return out, report.passes[0]


def feeds(model, seeds=range(6)) -> list:
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        out.append({vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(
            onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)) for vi in model.graph.input})
    return out


def worst_excess(original, result, inputs) -> float:
    """The largest ``max|a−b| / (1e-6 + BOUND·max|a|)`` over outputs and inputs (≤ 1: within)."""
    names = [o.name for o in original.graph.output]
    a_run, b_run = session(original), session(result)
    worst = 0.0
    for feed in inputs:
        for a, b in zip(a_run.run(names, feed), b_run.run(names, feed)):
            a, b = a.astype(np.float64), b.astype(np.float64)
            worst = max(worst, float(np.abs(a - b).max()) / (1e-6 + BOUND * float(np.abs(a).max())))
    return worst


def skipped_for_rounding(entry) -> int:
    return sum(n for reason, n in entry.skipped.items() if reason.endswith(REASON))


# --- the fuzzer's findings ---------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_finding_is_fixed(name):
    model = onnx.parser.parse_model(FINDINGS[name])
    reference = check_valid(model)
    for passes in ("fuse", "fuse,compact"):
        assert check_lossless(model, passes, reference) == []  # the fuzzer's own property, both ways
    _, entry = fuse(model, verify=True)
    assert not entry.rolled_back, entry.verification
    assert skipped_for_rounding(entry) >= 1, entry.skipped  # the fold that moved it, skipped by its reason
    result, entry = fuse(model, verify=False)  # --no-verify: nothing to roll back, so the pass itself must hold
    onnx.checker.check_model(result, full_check=True)
    assert worst_excess(model, result, feeds(model)) <= 1.0


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_finding_folds_in_float32(name):
    """The same graphs in float32 fold as before: the guard is for float16 rounding only."""
    text = FINDINGS[name].replace("float16", "float").replace("to: int = 10", "to: int = 1")
    model = onnx.parser.parse_model(_as_float32_values(text))
    _, entry = fuse(model, verify=True)
    assert not entry.rolled_back
    assert skipped_for_rounding(entry) == 0
    folds = sum(n for label, n in entry.rewrites.items() if label.startswith(("bn→", "affine→")))
    assert folds >= 1, entry.rewrites


def _as_float32_values(text: str) -> str:
    """Float16 bit patterns (``{47917, …}`` of a float tensor) as the float32 values they hold."""
    import re

    def values(match):
        bits = np.array([int(v) for v in match.group(2).split(",")], np.uint16).view(np.float16)
        return match.group(1) + "{" + ",".join(repr(float(v)) for v in bits) + "}"

    return re.sub(r"(float(?:\[[0-9,]*\])? [A-Za-z0-9_]+ = \s*)\{([0-9,]+)\}", values, text)


# --- the fold itself: float64, rounded once -----------------------------------------------

def _init(model, name) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def _two_heads(dtype: str) -> onnx.ModelProto:
    """A Conv → BN of 6 channels × 36 elements (output ``a``) beside a Gemm → BN of one element
    (output ``b``); both read the same input."""
    rng = np.random.default_rng(3)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    values = {"W": rng.normal(0, 0.5, (6, 4, 3, 3)), "B": rng.normal(0, 0.5, 6),
              "G": rng.normal(0, 0.5, (1, 16)), **{k + "1": v for k, v in _bn(rng, 6).items()},
              **{k + "2": v for k, v in _bn(rng, 1).items()}}
    model = onnx.parser.parse_model(f"""
<ir_version: 8, opset_import: ["" : 13]>
heads ({dtype}[1,4,8,8] x) => ({dtype}[1,6,6,6] a, {dtype}[1,1] b) {{
  z = Conv(x, W, B)
  a = BatchNormalization(z, g1, beta1, mean1, var1)
  p = GlobalAveragePool(x)
  f = Flatten(p)
  f16 = Concat <axis = 1> (f, f, f, f)
  h = Gemm <transB = 1> (f16, G)
  b = BatchNormalization(h, g2, beta2, mean2, var2)
}}""")
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np_dtype), k) for k, v in values.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def _bn(rng, c: int) -> dict:
    return {"g": rng.uniform(0.5, 1.5, c), "beta": rng.normal(0, 0.3, c), "mean": rng.normal(0, 0.3, c),
            "var": rng.uniform(0.5, 1.5, c)}


def test_float16_fold_is_rounded_once_from_float64():
    """Option (a) of the issue: ``W' = round16(W·s)``, ``b' = round16((b − μ)·s + β)`` with ``W·s``
    in float64 from the float16 parameters — bit for bit."""
    model = _two_heads("float16")
    result, entry = fuse(model)
    assert entry.rewrites.get("bn→conv") == 1 and not entry.rolled_back
    conv = next(n for n in result.graph.node if n.op_type == "Conv")
    got_w, got_b = _init(result, conv.input[1]), _init(result, conv.input[2])
    p = {k: _init(model, k).astype(np.float64) for k in ("W", "B", "g1", "beta1", "mean1", "var1")}
    s = p["g1"] / np.sqrt(p["var1"] + 1e-5)
    want_w = (p["W"] * s[:, None, None, None]).astype(np.float16)
    want_b = ((p["B"] - p["mean1"]) * s + p["beta1"]).astype(np.float16)
    assert got_w.dtype == np.float16 and np.array_equal(got_w.view(np.uint16), want_w.view(np.uint16))
    assert np.array_equal(got_b.view(np.uint16), want_b.view(np.uint16))


def test_a_risky_float16_fold_is_skipped_and_the_others_survive():
    model = _two_heads("float16")
    for verify in (True, False):
        result, entry = fuse(model, verify=verify)
        assert not entry.rolled_back
        assert entry.rewrites.get("bn→conv") == 1  # 36 elements a channel: folded
        assert entry.skipped.get("bn: " + REASON) == 1  # the one-element head: kept as it was
        assert [n.op_type for n in result.graph.node].count("BatchNormalization") == 1
        assert worst_excess(model, result, feeds(model)) <= 1.0


def test_the_same_heads_in_float32_both_fold():
    _, entry = fuse(_two_heads("float"))
    assert entry.rewrites.get("bn→conv") == 1 and entry.rewrites.get("bn→gemm") == 1
    assert skipped_for_rounding(entry) == 0


@pytest.mark.parametrize("shape, folded", [("[1,8,16,16]", True), ("[2,1]", False)])
def test_bn_to_mul_add_in_float16(shape, folded):
    """BN with nothing to fold into becomes Mul + Add where the output is large enough for the
    extra rounding of ``x·s`` to stay within the bound; a tiny one stays a BN."""
    c = int(shape.strip("[]").split(",")[1])
    rng = np.random.default_rng(5)
    model = onnx.parser.parse_model(f"""
<ir_version: 8, opset_import: ["" : 13]>
bn (float16{shape} x) => (float16{shape} y) {{
  y = BatchNormalization(x, g, beta, mean, var)
}}""")
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float16), k) for k, v in _bn(rng, c).items())
    for verify in (True, False):
        result, entry = fuse(model, verify=verify)
        assert not entry.rolled_back
        assert entry.rewrites.get("bn→mul+add", 0) == (1 if folded else 0)
        assert entry.skipped.get("bn: " + REASON, 0) == (0 if folded else 1)
        assert worst_excess(model, result, feeds(model)) <= 1.0


# --- the estimate ----------------------------------------------------------------------------

def test_no_rounding_error_never_fails():
    assert fp16_guard.failure_probability([0.0], [1.0], [0.0], 1) == 0.0


def test_one_element_fails_often_many_elements_never():
    """``ε = u·σ``: one element is near 0 often enough to fail the rule — P(|ε·g'| > τ·|g|) =
    (2/π)·atan(ε/τ) for the fold's error alone, a little more with the final rounding
    (``(u/√3)·|y|`` at most adds ``u/√3`` to ε) — while the maximum of a thousand never is."""
    u, tau = fp16_guard.UNIT, fp16_guard.TAU
    one = fp16_guard.failure_probability([0.0], [1.0], [u], 1)
    assert one > fp16_guard.MAX_FAILURE
    assert 2 / np.pi * np.arctan(u / tau) - 0.02 <= one <= 2 / np.pi * np.arctan((u + u / np.sqrt(3)) / tau) + 0.02
    assert fp16_guard.failure_probability(np.zeros(16), np.ones(16), np.full(16, u), 64) == 0.0


def test_a_shifted_channel_fails_on_its_tail():
    """Mean 2.5σ below 0: a Relu after it keeps a few small values, judged at their own scale."""
    u = fp16_guard.UNIT
    assert fp16_guard.failure_probability([-2.5], [1.0], [2.5 * u], 64) > fp16_guard.MAX_FAILURE
    assert fp16_guard.failure_probability([0.0], [1.0], [2.5 * u], 64) <= fp16_guard.MAX_FAILURE


def test_a_small_output_downstream_counts():
    u = fp16_guard.UNIT
    assert fp16_guard.check(np.zeros(8), np.ones(8), np.full(8, u), 64) is None
    assert fp16_guard.check(np.zeros(8), np.ones(8), np.full(8, u), 64, reach=1).reason == REASON


def test_unknown_and_empty_dimensions():
    """A dimension of -1 (declared by some exporters: PP-OCR's classifier), a symbolic or an
    unknown one counts as 1; an empty output has nothing to judge."""
    assert fp16_guard.elements_per_channel([1, 6, 4, 4], 6) == 16
    assert fp16_guard.elements_per_channel([-1, 6, 4, 4], 6) == 16  # batch 1
    assert fp16_guard.elements_per_channel(["batch", 6, None, 4], 6) == 4
    assert fp16_guard.elements_per_channel([0, 6], 6) == 1
    assert fp16_guard.elements_per_channel(None, 6) == 1
    model = _two_heads("float16")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_value = -1
    _, entry = fuse(model, verify=False)  # was: ValueError "negative dimensions are not allowed"
    assert entry.rewrites.get("bn→conv") == 1


def test_a_fold_that_overflows_float16_is_skipped():
    """``W·s`` past 65504 would be an inf weight."""
    model = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 13]>
big (float16[1,4,8,8] x) => (float16[1,2,8,8] y) {
  z = Conv(x, W)
  y = Mul(z, k)
}""")
    model.graph.initializer.extend([
        numpy_helper.from_array(np.full((2, 4, 1, 1), 300.0, np.float16), "W"),
        numpy_helper.from_array(np.full((1, 2, 1, 1), 300.0, np.float16), "k")])
    assert fp16_guard.check([0.0], [1.0], [np.inf], 64).reason == REASON
    result, entry = fuse(model, verify=False)
    assert entry.skipped.get("affine: " + REASON) == 1
    assert all(np.isfinite(numpy_helper.to_array(t)).all() for t in result.graph.initializer)
