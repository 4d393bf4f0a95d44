"""The cleanup and constant rules of ``fuse`` (``passes/fuse/cleanup.py``, ``passes/fuse/const_fold.py``).

Every positive case asserts the rule's rewrite count under its own label, the op counts of
the ops the case is about, ``check_model(full_check=True)``, the pipeline's verification
status, and ONNX Runtime equality (rtol = atol = 1e-5) with the original on random inputs.
Must-not-fire cases assert the reason in ``skipped`` and unchanged ops. The fold rules
(BN / affine) run too: cases avoid Conv / Gemm / MatMul / BatchNormalization.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import assert_same_outputs, nodes_counting_prelu_once, random_feeds, run_ort

import onnxslim_kit
from onnxslim_kit.model import Model
from onnxslim_kit.passes.fuse import const_fold as _const_fold
INT_MAX = 9223372036854775807


def model(body: str, inputs: str, outputs: str, opset: int = 13, ir: int = 8) -> onnx.ModelProto:
    text = f'<ir_version: {ir}, opset_import: ["" : {opset}]>\ng ({inputs}) => ({outputs}) {{\n{body}\n}}'
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def ops(proto: onnx.ModelProto, graph=None) -> Counter:
    graph = proto.graph if graph is None else graph
    return Counter(n.op_type for n in graph.node)


def fuse(proto: onnx.ModelProto, passes: str = "fuse", feeds=None, **kwargs):
    """Run ``fuse``; check validity and (when anything changed) equality with the original."""
    if feeds is not None:
        kwargs.setdefault("calib", [feeds])
    out, report = onnxslim_kit.optimize(proto, passes=passes, **kwargs)
    entry = report.passes[0]
    onnx.checker.check_model(out, full_check=True)
    if entry.modified:
        assert entry.verification["status"] == "ok", entry.verification
        assert not entry.rolled_back
        feeds = feeds or random_feeds(proto)
        assert_same_outputs(proto, out, feeds, rtol=1e-5, atol=1e-5)
    assert [o.name for o in out.graph.output] == [o.name for o in proto.graph.output]
    return out, entry


# --- cleanup: removals --------------------------------------------------------------------------

REMOVALS = [
    # (id, opset, inputs, body, outputs, label, op that disappears)
    ("identity", 13, "float[2,3] x", "i = Identity(x)\n y = Relu(i)", "float[2,3] y", "identity removed", "Identity"),
    ("dropout-opset9-ratio-attr", 9, "float[2,3] x", "d = Dropout<ratio=0.3>(x)\n y = Relu(d)", "float[2,3] y",
     "dropout removed", "Dropout"),
    ("dropout-opset12-ratio-input", 12, "float[2,3] x",
     "r = Constant<value=float {0.5}>()\n d = Dropout(x, r)\n y = Relu(d)", "float[2,3] y", "dropout removed", "Dropout"),
    ("dropout-opset13-training-false-mask-unused", 13, "float[2,3] x",
     "r = Constant<value=float {0.5}>()\n t = Constant<value=bool {0}>()\n d, m = Dropout(x, r, t)\n y = Relu(d)",
     "float[2,3] y", "dropout removed", "Dropout"),
    ("reshape-opset9", 9, "float[2,3] x", "s = Constant<value=int64[2] {2, 3}>()\n r = Reshape(x, s)\n y = Relu(r)",
     "float[2,3] y", "no-op reshape removed", "Reshape"),
    ("reshape-zero-minus-one-opset13", 13, "float[2,3,4] x",
     "s = Constant<value=int64[3] {0, -1, 4}>()\n r = Reshape(x, s)\n y = Relu(r)", "float[2,3,4] y",
     "no-op reshape removed", "Reshape"),
    ("reshape-allowzero-opset17", 17, "float[2,3] x",
     "s = Constant<value=int64[2] {2, 3}>()\n r = Reshape<allowzero=1>(x, s)\n y = Relu(r)", "float[2,3] y",
     "no-op reshape removed", "Reshape"),
    ("reshape-dynamic-but-provable", 13, "float[N,4] x",
     "s = Constant<value=int64[2] {-1, 4}>()\n r = Reshape(x, s)\n y = Relu(r)", "float[N,4] y",
     "no-op reshape removed", "Reshape"),
    ("transpose-identity-perm", 13, "float[2,3,4] x", "t = Transpose<perm=[0,1,2]>(x)\n y = Relu(t)", "float[2,3,4] y",
     "no-op transpose removed", "Transpose"),
    ("cast-same-type-opset9", 9, "float[2,3] x", "c = Cast<to=1>(x)\n y = Relu(c)", "float[2,3] y",
     "no-op cast removed", "Cast"),
    ("cast-same-type-opset19", 19, "int64[2,3] x", "c = Cast<to=7, saturate=1>(x)\n y = Neg(c)", "int64[2,3] y",
     "no-op cast removed", "Cast"),
    ("castlike-same-type", 15, "float[2,3] x, float[1] z", "c = CastLike(x, z)\n y = Relu(c)", "float[2,3] y",
     "no-op cast removed", "CastLike"),
    ("pad-opset9-attr", 9, "float[2,3] x", "p = Pad<pads=[0,0,0,0], mode=\"constant\">(x)\n y = Relu(p)", "float[2,3] y",
     "no-op pad removed", "Pad"),
    ("pad-opset11-input", 11, "float[2,3] x",
     "q = Constant<value=int64[4] {0,0,0,0}>()\n p = Pad<mode=\"reflect\">(x, q)\n y = Relu(p)", "float[2,3] y",
     "no-op pad removed", "Pad"),
    ("pad-opset18-axes", 18, "float[2,3] x",
     "q = Constant<value=int64[2] {0,0}>()\n v = Constant<value=float {1.0}>()\n a = Constant<value=int64[1] {1}>()\n"
     " p = Pad(x, q, v, a)\n y = Relu(p)", "float[2,3] y", "no-op pad removed", "Pad"),
    ("slice-opset9-attrs", 9, "float[N,3] x",
     f"s = Slice<starts=[0], ends=[{INT_MAX}], axes=[0]>(x)\n y = Relu(s)", "float[N,3] y", "no-op slice removed", "Slice"),
    ("slice-opset10-ends-dim", 10, "float[2,3] x",
     "a = Constant<value=int64[2] {0,0}>()\n b = Constant<value=int64[2] {2,3}>()\n s = Slice(x, a, b)\n y = Relu(s)",
     "float[2,3] y", "no-op slice removed", "Slice"),
    ("slice-opset13-axes-steps", 13, "float[2,3] x",
     "a = Constant<value=int64[1] {-5}>()\n b = Constant<value=int64[1] {100}>()\n c = Constant<value=int64[1] {-1}>()\n"
     " d = Constant<value=int64[1] {1}>()\n s = Slice(x, a, b, c, d)\n y = Relu(s)", "float[2,3] y",
     "no-op slice removed", "Slice"),
    ("expand-same-shape", 13, "float[N,3] x",
     "s = Constant<value=int64[2] {1, 3}>()\n e = Expand(x, s)\n y = Relu(e)", "float[N,3] y", "no-op expand removed", "Expand"),
    ("concat-one-input", 13, "float[2,3] x", "c = Concat<axis=1>(x)\n y = Relu(c)", "float[2,3] y",
     "single-input concat removed", "Concat"),
    ("squeeze-no-axes-opset11", 11, "float[2,3] x", "s = Squeeze(x)\n y = Relu(s)", "float[2,3] y",
     "no-op squeeze removed", "Squeeze"),
    ("squeeze-no-axes-opset13", 13, "float[2,3] x", "s = Squeeze(x)\n y = Relu(s)", "float[2,3] y",
     "no-op squeeze removed", "Squeeze"),
    ("flatten-rank2", 13, "float[N,3] x", "f = Flatten<axis=1>(x)\n y = Relu(f)", "float[N,3] y",
     "no-op flatten removed", "Flatten"),
    ("flatten-static", 13, "float[1,6] x", "f = Flatten<axis=0>(x)\n y = Relu(f)", "float[1,6] y",
     "no-op flatten removed", "Flatten"),
    ("mul-one", 13, "float[2,3] x", "o = Constant<value=float[3] {1,1,1}>()\n m = Mul(x, o)\n y = Relu(m)",
     "float[2,3] y", "x*1 / x+0 removed", "Mul"),
    ("one-mul", 13, "float[N,3] x", "o = Constant<value=float[1,1] {1}>()\n m = Mul(o, x)\n y = Relu(m)",
     "float[N,3] y", "x*1 / x+0 removed", "Mul"),
    ("add-zero-scalar", 13, "float[N,3] x", "o = Constant<value=float {0}>()\n m = Add(x, o)\n y = Relu(m)",
     "float[N,3] y", "x*1 / x+0 removed", "Add"),
    ("sub-zero-int", 13, "int64[2,3] x", "o = Constant<value=int64[2,3] {0,0,0,0,0,0}>()\n m = Sub(x, o)\n y = Neg(m)",
     "int64[2,3] y", "x*1 / x+0 removed", "Sub"),
    ("div-one", 13, "float[2,3] x", "o = Constant<value=float[1] {1}>()\n m = Div(x, o)\n y = Relu(m)",
     "float[2,3] y", "x*1 / x+0 removed", "Div"),
]


@pytest.mark.parametrize("case", REMOVALS, ids=[c[0] for c in REMOVALS])
def test_removal(case):
    _, opset, inputs, body, outputs, label, op = case
    proto = model(body, inputs, outputs, opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites.get(label) == 1, entry.rewrites
    assert ops(out)[op] == ops(proto)[op] - 1 == 0
    assert ops(out)["Relu"] + ops(out)["Neg"] == 1


SQUEEZE_PAIRS = [
    ("unsqueeze-squeeze-opset11", 11, "u = Unsqueeze<axes=[0, 2]>(x)\n s = Squeeze<axes=[2, 0]>(u)"),
    ("unsqueeze-squeeze-opset13-negative", 13,
     "a = Constant<value=int64[1] {-1}>()\n u = Unsqueeze(x, a)\n b = Constant<value=int64[1] {2}>()\n s = Squeeze(u, b)"),
    ("squeeze-unsqueeze-opset13", 13,
     "a = Constant<value=int64[1] {1}>()\n s0 = Squeeze(x, a)\n s = Unsqueeze(s0, a)", "float[2,1,3]"),
    ("squeeze-unsqueeze-opset9", 9, "s0 = Squeeze<axes=[1]>(x)\n s = Unsqueeze<axes=[1]>(s0)", "float[2,1,3]"),
]


@pytest.mark.parametrize("case", SQUEEZE_PAIRS, ids=[c[0] for c in SQUEEZE_PAIRS])
def test_squeeze_unsqueeze_pairs(case):
    _, opset, body, *shape = case
    shape = shape[0] if shape else "float[2,3]"
    proto = model(body + "\n y = Relu(s)", f"{shape} x", f"{shape} y", opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites.get("squeeze/unsqueeze pair removed", 0) >= 1
    assert ops(out)["Squeeze"] == ops(out)["Unsqueeze"] == 0


def test_identity_feeding_graph_output_keeps_its_name():
    proto = model("r = Relu(x)\n y = Identity(r)", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert entry.rewrites["identity removed"] == 1
    assert ops(out) == Counter({"Relu": 1})
    assert out.graph.node[0].output[0] == "y"


@pytest.mark.parametrize("opset", [9, 13, 17])
def test_identity_between_graph_input_and_output_stays(opset):
    proto = model("y = Identity(x)\n z = Relu(x)", "float[2,3] x", "float[2,3] y, float[2,3] z", opset=opset)
    out, entry = fuse(proto)
    assert "identity removed" not in entry.rewrites
    assert any(reason.startswith("identity: graph output cannot be renamed") for reason in entry.skipped)
    assert ops(out)["Identity"] == 1


def test_rules_apply_inside_if_subgraph():
    proto = model(
        "y = If(c) <then_branch = t () => (float[2,3] ty) { r = Relu(x)\n i = Identity(r)\n ty = Transpose<perm=[0,1]>(i) },"
        " else_branch = e () => (float[2,3] ey) { s = Constant<value=int64[2] {2, 3}>()\n n = Neg(x)\n ey = Reshape(n, s) }>",
        "float[2,3] x, bool c", "float[2,3] y")
    then_before = ops(proto, proto.graph.node[0].attribute[0].g)
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    # (a scalar bool input is passed explicitly: the generated feed gives a NumPy scalar ORT rejects)
    out, entry = fuse(proto, feeds={"x": x, "c": np.array(True)}, calib=[{"x": x, "c": np.array(c)} for c in (True, False)])
    for cond in (True, False):
        assert_same_outputs(proto, out, {"x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32),
                                         "c": np.array(cond)})
    assert entry.rewrites["identity removed"] == 1
    assert entry.rewrites["no-op transpose removed"] == 1
    assert entry.rewrites["no-op reshape removed"] == 1
    branches = {a.name: a.g for a in out.graph.node[0].attribute}
    assert then_before == Counter({"Relu": 1, "Identity": 1, "Transpose": 1})
    assert ops(out, branches["then_branch"]) == Counter({"Relu": 1})
    assert ops(out, branches["else_branch"]) == Counter({"Neg": 1})
    assert [o.name for o in branches["then_branch"].output] == ["ty"]
    assert [o.name for o in branches["else_branch"].output] == ["ey"]


def test_branch_output_read_from_outer_scope_stays():
    proto = model("y = If(c) <then_branch = t () => (float[2,3] ty) { ty = Identity(x) },"
                  " else_branch = e () => (float[2,3] ey) { ey = Neg(x) }>", "float[2,3] x, bool c", "float[2,3] y")
    x = np.ones((2, 3), np.float32)
    out, entry = fuse(proto, feeds={"x": x, "c": np.array(True)}, calib=[{"x": x, "c": np.array(c)} for c in (True, False)])
    assert not entry.modified
    assert any(reason.startswith("identity: graph output cannot be renamed") for reason in entry.skipped)


def test_rules_apply_inside_loop_body():
    proto = model(
        "n = Constant<value=int64 {3}>()\n c = Constant<value=bool {1}>()\n"
        "y = Loop(n, c, x) <body = b (int64 i, bool ci, float[2,3] v) => (bool co, float[2,3] vo) {"
        " co = Identity(ci)\n t = Transpose<perm=[0,1]>(v)\n one = Constant<value=float {1}>()\n vo = Add(t, one) }>",
        "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert entry.rewrites["no-op transpose removed"] == 1
    body = out.graph.node[0].attribute[0].g
    assert ops(out, body) == Counter({"Identity": 1, "Add": 1})  # co = Identity(ci): input to output, kept
    assert [o.name for o in body.output] == ["co", "vo"]


def test_second_fuse_run_finds_nothing_left():
    proto = model("i = Identity(x)\n a = Transpose<perm=[1,0]>(i)\n b = Transpose<perm=[1,0]>(a)\n"
                  " s = Constant<value=int64[2] {3, 2}>()\n r = Reshape(b, s)\n y = Relu(r)", "float[3,2] x", "float[3,2] y")
    out, report = onnxslim_kit.optimize(proto, passes="fuse,fuse")
    first, second = report.passes
    assert first.modified and not second.modified
    assert ops(out) == Counter({"Relu": 1})


# --- cleanup: must not fire ---------------------------------------------------------------------

NOT_FIRING = [
    ("reshape-runtime-target", 13, "float[N,4] x, int64[2] s", "r = Reshape(x, s)\n y = Relu(r)", "float[M,K] y",
     "reshape: target shape not constant", "Reshape"),
    ("reshape-dynamic-input", 13, "float[N,4] x", "s = Constant<value=int64[2] {2, -1}>()\n r = Reshape(x, s)\n y = Relu(r)",
     "float[2,M] y", "reshape: input shape not static", "Reshape"),
    ("dropout-training", 13, "float[2,3] x",
     "r = Constant<value=float {0.0}>()\n t = Constant<value=bool {1}>()\n d = Dropout(x, r, t)\n y = Relu(d)",
     "float[2,3] y", "dropout: training mode", "Dropout"),
    ("dropout-training-runtime", 13, "float[2,3] x, bool t",
     "r = Constant<value=float {0.0}>()\n d = Dropout(x, r, t)\n y = Relu(d)",
     "float[2,3] y", "dropout: training_mode is not a constant", "Dropout"),
    ("dropout-mask-used-opset9", 9, "float[2,3] x", "d, m = Dropout(x)\n y = Relu(d)", "float[2,3] y, float[2,3] m",
     "dropout: mask output is used", "Dropout"),
    ("dropout-mask-used-opset13", 13, "float[2,3] x", "d, m = Dropout(x)\n y = Relu(d)", "float[2,3] y, bool[2,3] m",
     "dropout: mask output is used", "Dropout"),
    ("slice-dynamic-dim", 13, "float[N,3] x",
     "a = Constant<value=int64[1] {0}>()\n b = Constant<value=int64[1] {4}>()\n c = Constant<value=int64[1] {0}>()\n"
     " s = Slice(x, a, b, c)\n y = Relu(s)", "float[M,3] y", "slice: input shape not static", "Slice"),
    ("expand-dynamic", 13, "float[N,3] x",
     "s = Constant<value=int64[2] {2, 3}>()\n e = Expand(x, s)\n y = Relu(e)", "float[2,3] y",
     "expand: input shape not static", "Expand"),
    ("mul-one-broadcast-unknown", 13, "float[N,3] x",
     "o = Constant<value=float[2,3] {1,1,1,1,1,1}>()\n m = Mul(x, o)\n y = Relu(m)", "float[2,3] y",
     "mul: input shape not static (broadcast unknown)", "Mul"),
    ("reshape-chain-zero-in-second", 13, "float[2,3,4] x",
     "a = Constant<value=int64[2] {6, 4}>()\n r = Reshape(x, a)\n b = Constant<value=int64[3] {0, 2, -1}>()\n"
     " r2 = Reshape(r, b)\n y = Relu(r2)", "float[6,2,2] y",
     "reshape∘reshape: target has 0 (copies an intermediate dim)", "Reshape"),
]


@pytest.mark.parametrize("case", NOT_FIRING, ids=[c[0] for c in NOT_FIRING])
def test_not_firing(case):
    name, opset, inputs, body, outputs, reason, op = case
    proto = model(body, inputs, outputs, opset=opset)
    feeds = None
    if name == "reshape-runtime-target":  # random data is no valid shape
        feeds = {"x": np.ones((3, 4), np.float32), "s": np.array([2, 6], np.int64)}
    out, entry = fuse(proto, feeds=feeds)
    assert entry.skipped.get(reason) == 1, entry.skipped
    assert ops(out)[op] == ops(proto)[op]


def test_add_zero_that_broadcasts_is_kept():
    proto = model("o = Constant<value=float[2,3] {0,0,0,0,0,0}>()\n m = Add(x, o)\n y = Relu(m)",
                  "float[1,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert ops(out)["Add"] == 1 and not entry.modified


# --- cleanup: merges ----------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [9, 13])
def test_transpose_pair_composed(opset):
    proto = model("a = Transpose<perm=[1,0,2]>(x)\n b = Transpose<perm=[0,2,1]>(a)\n y = Relu(b)",
                  "float[2,3,4] x", "float[3,4,2] y", opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites["transpose∘transpose merged"] == 1
    assert ops(out) == Counter({"Transpose": 1, "Relu": 1})
    perm = [a for a in out.graph.node[0].attribute if a.name == "perm"][0].ints
    assert list(perm) == [1, 2, 0]


def test_transpose_pair_identity_removes_both_even_into_graph_output():
    proto = model("r = Relu(x)\n a = Transpose<perm=[1,0]>(r)\n y = Transpose<perm=[1,0]>(a)", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert entry.rewrites["transpose∘transpose merged"] == 1
    assert ops(out) == Counter({"Relu": 1})


def test_transpose_pair_with_shared_middle_is_skipped():
    proto = model("a = Transpose<perm=[1,0,2]>(x)\n b = Transpose<perm=[0,2,1]>(a)\n y = Relu(b)\n z = Relu(a)",
                  "float[2,3,4] x", "float[3,4,2] y, float[3,2,4] z")
    out, entry = fuse(proto)
    assert entry.skipped["transpose∘transpose: first transpose has other readers"] == 1
    assert ops(out)["Transpose"] == 2


@pytest.mark.parametrize("opset,first", [(9, "r = Reshape(x, a)"), (13, "r = Reshape(x, a)"),
                                         (17, "r = Reshape<allowzero=0>(x, a)"), (13, "r = Flatten<axis=1>(x)")])
def test_reshape_chain_merged(opset, first):
    proto = model(f"a = Constant<value=int64[2] {{6, 4}}>()\n {first}\n b = Constant<value=int64[2] {{4, -1}}>()\n"
                  " r2 = Reshape(r, b)\n y = Relu(r2)", "float[2,3,4] x", "float[4,6] y", opset=opset)
    if "Flatten" in first:
        proto = model("r = Flatten<axis=1>(x)\n b = Constant<value=int64[2] {4, -1}>()\n r2 = Reshape(r, b)\n y = Relu(r2)",
                      "float[2,3,4] x", "float[4,6] y", opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites["reshape∘reshape merged"] == 1
    assert ops(out)["Reshape"] == 1 and ops(out)["Flatten"] == 0


def test_reshape_chain_allowzero_second_merged():
    proto = model("a = Constant<value=int64[2] {6, 4}>()\n r = Reshape(x, a)\n b = Constant<value=int64[3] {24, 0, 1}>()\n"
                  " r2 = Reshape<allowzero=1>(r, b)\n y = Relu(r2)", "float[0,3,4] x", "float[24,0,1] y", opset=17)
    out, _ = onnxslim_kit.optimize(proto, passes="fuse", verify=False)
    assert ops(out)["Reshape"] == 1


def test_reshape_chain_intermediate_read_elsewhere_is_skipped():
    proto = model("a = Constant<value=int64[2] {6, 4}>()\n r = Reshape(x, a)\n b = Constant<value=int64[2] {4, 6}>()\n"
                  " r2 = Reshape(r, b)\n y = Relu(r2)\n z = Relu(r)", "float[2,3,4] x", "float[4,6] y, float[6,4] z")
    out, entry = fuse(proto)
    assert entry.skipped["reshape∘reshape: intermediate tensor has other readers"] == 1
    assert ops(out)["Reshape"] == 2


# --- constant folding -----------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [9, 13, 17])
def test_constant_chain_folded(opset):
    unsq = ("u = Unsqueeze<axes=[0]>(s)" if opset < 13 else
            "ax = Constant<value=int64[1] {0}>()\n u = Unsqueeze(s, ax)")
    proto = model("a = Constant<value=float[3] {1, 2, 3}>()\n b = Constant<value=float[3] {4, 5, 6}>()\n"
                  f" m = Mul(a, b)\n s = Sqrt(m)\n {unsq}\n y = Add(x, u)", "float[2,3] x", "float[2,3] y", opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites["constant folded"] == 3
    assert ops(out) == Counter({"Add": 1})
    (init,) = out.graph.initializer
    np.testing.assert_allclose(onnx.numpy_helper.to_array(init), np.sqrt([[4.0, 10.0, 18.0]]), rtol=1e-6)


def test_folded_scalar_stays_scalar():
    proto = model("a = Constant<value=int64[1] {2}>()\n z = Constant<value=int64[1] {0}>()\n s = Squeeze(a, z)\n"
                  " c = Cast<to=1>(s)\n y = Mul(x, c)", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert ops(out) == Counter({"Mul": 1})
    assert [list(t.dims) for t in out.graph.initializer] == [[]]


def test_fold_into_graph_output():
    proto = model("a = Constant<value=float[2] {1, 4}>()\n z = Sqrt(a)\n y = Relu(x)", "float[2] x", "float[2] y, float[2] z")
    out, entry = fuse(proto)
    assert entry.rewrites["constant folded"] == 1
    assert ops(out) == Counter({"Relu": 1})
    assert [o.name for o in out.graph.output] == ["y", "z"]


def test_fold_inside_if_uses_outer_constant():
    proto = model(
        "k = Constant<value=float[3] {1, 4, 9}>()\n"
        "y = If(c) <then_branch = t () => (float[3] ty) { s = Sqrt(k)\n ty = Add(x, s) },"
        " else_branch = e () => (float[3] ey) { ey = Sub(x, k) }>", "float[3] x, bool c", "float[3] y")
    x = np.ones(3, np.float32)
    out, entry = fuse(proto, feeds={"x": x, "c": np.array(True)}, calib=[{"x": x, "c": np.array(c)} for c in (True, False)])
    for cond in (True, False):
        assert_same_outputs(proto, out, {"x": np.ones(3, np.float32), "c": np.array(cond)})
    assert entry.rewrites["constant folded"] == 1
    then = [a.g for a in out.graph.node[0].attribute if a.name == "then_branch"][0]
    assert ops(out, then) == Counter({"Add": 1})


@pytest.mark.parametrize("opset,cond,kept,gone", [(11, "{1}", "Relu", "Neg"), (13, "{0}", "Neg", "Relu")])
def test_if_with_constant_condition_inlined(opset, cond, kept, gone):
    proto = model(f"c = Constant<value=bool {cond}>()\n"
                  "r = If(c) <then_branch = t () => (float[2,3] ty) { ty = Relu(x) },"
                  " else_branch = e () => (float[2,3] ey) { ey = Neg(x) }>\n y = Add(r, x)",
                  "float[2,3] x", "float[2,3] y", opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites["If with constant condition inlined"] == 1
    assert ops(out) == Counter({kept: 1, "Add": 1})


def test_if_with_folded_condition_feeding_graph_output_inlined():
    proto = model("a = Constant<value=int64 {2}>()\n b = Constant<value=int64 {2}>()\n c = Equal(a, b)\n"
                  "y = If(c) <then_branch = t () => (float[2,3] ty) { k = Constant<value=float {2}>()\n ty = Mul(x, k) },"
                  " else_branch = e () => (float[2,3] ey) { ey = Neg(x) }>", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert entry.rewrites["constant folded"] == 1
    assert entry.rewrites["If with constant condition inlined"] == 1
    assert ops(out) == Counter({"Mul": 1})
    assert out.graph.node[0].output[0] == "y"


def test_if_inlined_into_graph_output_keeps_a_node_that_carries_the_name():
    proto = model("c = Constant<value=bool {1}>()\n"
                  "y = If(c) <then_branch = t () => (float[2,3] ty) { ty = Identity(x) },"
                  " else_branch = e () => (float[2,3] ey) { ey = Neg(x) }>", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert entry.rewrites["If with constant condition inlined"] == 1
    assert ops(out) == Counter({"Identity": 1})  # y = Identity(x): a graph input cannot be renamed


def test_if_whose_branch_returns_a_constant_into_a_graph_output_kept():
    proto = model("c = Equal(n, n)\n"
                  "y = If(c) <then_branch = t () => (float[2] ty) { ty = Constant<value=float[2] {1, 2}>() },"
                  " else_branch = e () => (float[2] ey) { ey = Neg(x) }>", "float[2] x, int64 n", "float[2] y")
    proto.graph.node[0].input[:] = ["k", "k"]
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(3, np.int64), "k"))
    out, entry = fuse(proto, feeds={"x": np.ones(2, np.float32), "n": np.array(1, np.int64)})
    assert entry.skipped["if inlining: graph output cannot take its name from the branch"] == 1
    assert ops(out)["If"] == 1


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike", "Bernoulli"])
def test_non_deterministic_op_not_folded(op):
    proto = model(f"a = Constant<value=float[2,3] {{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}}>()\n r = {op}(a)\n y = Mul(x, r)",
                  "float[2,3] x", "float[2,3] y", opset=15)
    out, entry = onnxslim_kit.optimize(proto, passes="fuse")
    entry = entry.passes[0]
    assert entry.skipped["constant folding: non-deterministic op"] == 1
    assert ops(out)[op] == 1 and not entry.modified


def test_non_deterministic_ops_not_merged():
    proto = model("a = Constant<value=float[2,3] {0,0,0,0,0,0}>()\n r1 = RandomUniformLike(x)\n r2 = RandomUniformLike(x)\n"
                  " y = Sub(r1, r2)", "float[2,3] x", "float[2,3] y")
    out, report = onnxslim_kit.optimize(proto, passes="fuse")
    entry = report.passes[0]
    assert entry.skipped["cse: non-deterministic op"] == 1
    assert ops(out)["RandomUniformLike"] == 2


def test_oversized_fold_skipped():
    proto = model("s = Constant<value=int64[1] {1000}>()\n c = ConstantOfShape<value=float[1] {2}>(s)\n"
                  " r = Sqrt(c)\n y = Add(x, r)", "float[1000] x", "float[1000] y")
    out, entry = fuse(proto, passes="fuse(fold_size_limit=100)")
    assert entry.skipped["constant folding: result larger than limit"] == 1
    assert ops(out)["ConstantOfShape"] == 1 and ops(out)["Sqrt"] == 1
    out, entry = fuse(proto, passes="fuse(fold_size_limit=4000)")
    assert entry.rewrites["constant folded"] == 2 and ops(out) == Counter({"Add": 1})


@pytest.mark.parametrize("body,op", [
    ("s = Constant<value=int64[1] {10000}>()\n c = ConstantOfShape<value=float[1] {2}>(s)", "ConstantOfShape"),
    ("a = Constant<value=float[1] {2}>()\n s = Constant<value=int64[1] {10000}>()\n c = Expand(a, s)", "Expand"),
])
def test_fold_that_would_grow_the_model_skipped(body, op):
    proto = model(f"{body}\n y = Add(x, c)", "float[10000] x", "float[10000] y")
    out, entry = fuse(proto)
    assert entry.skipped["constant folding: result much larger than its inputs"] == 1
    assert ops(out)[op] == 1


def test_dequantize_linear_of_constant_weight_kept():
    proto = model("w = Constant<value=int8[4] {1, -2, 3, -4}>()\n sc = Constant<value=float {0.5}>()\n"
                  " zp = Constant<value=int8 {0}>()\n d = DequantizeLinear(w, sc, zp)\n y = Mul(x, d)",
                  "float[4] x", "float[4] y")
    out, entry = fuse(proto)
    assert entry.skipped["constant folding: DequantizeLinear keeps quantized weights"] == 1
    assert ops(out)["DequantizeLinear"] == 1


def test_shape_and_size_of_static_tensor_folded():
    proto = model("r = Relu(x)\n s = Shape(r)\n n = Size(r)\n f = Cast<to=1>(s)\n g = Cast<to=1>(n)\n"
                  " y = Add(f, g)", "float[2,3] x", "float[2] y")
    out, entry = fuse(proto)
    assert entry.rewrites["Shape/Size folded"] == 2
    y = run_ort(out, {"x": np.zeros((2, 3), np.float32)})[0]
    np.testing.assert_array_equal(y, [8.0, 9.0])
    assert ops(out) == Counter()


@pytest.mark.parametrize("opset", [9, 13, 15])
def test_shape_gather_of_known_dim_folded(opset):
    shape = "s = Shape<start=1>(x)\n i = Constant<value=int64 {0}>()" if opset >= 15 else \
            "s = Shape(x)\n i = Constant<value=int64 {1}>()"
    proto = model(f"{shape}\n d = Gather<axis=0>(s, i)\n f = Cast<to=1>(d)\n y = Mul(x, f)",
                  "float[N,3] x", "float[N,3] y", opset=opset)
    feeds = {"x": np.ones((5, 3), np.float32)}
    out, entry = fuse(proto, feeds=feeds)
    assert entry.rewrites["Shape/Size folded"] == 1
    assert ops(out) == Counter({"Mul": 1})


RESHAPE_TARGETS = [
    # (id, opset, how the batch dim is taken from x, expected target)
    ("slice-of-shape", 13, "s = Shape(x)\n a = Constant<value=int64[1] {0}>()\n b = Constant<value=int64[1] {1}>()\n"
     " d = Slice(s, a, b)", [0, -1]),
    ("gather-unsqueeze-opset13", 13, "s = Shape(x)\n i = Constant<value=int64 {0}>()\n g = Gather(s, i)\n"
     " ax = Constant<value=int64[1] {0}>()\n d = Unsqueeze(g, ax)", [0, -1]),
    ("gather-unsqueeze-opset11", 11, "s = Shape(x)\n i = Constant<value=int64 {0}>()\n g = Gather(s, i)\n"
     " d = Unsqueeze<axes=[0]>(g)", [0, -1]),
    ("shape-start-end-opset15", 15, "d = Shape<start=0, end=1>(x)", [0, -1]),
]


@pytest.mark.parametrize("case", RESHAPE_TARGETS, ids=[c[0] for c in RESHAPE_TARGETS])
def test_reshape_target_from_own_dims_made_constant(case):
    _, opset, batch, expected = case
    proto = model(f"{batch}\n m = Constant<value=int64[1] {{-1}}>()\n t = Concat<axis=0>(d, m)\n"
                  " r = Reshape(x, t)\n y = Relu(r)", "float[N,4,1,1] x", "float[N,4] y", opset=opset)
    out, entry = fuse(proto, feeds={"x": np.random.default_rng(0).standard_normal((3, 4, 1, 1)).astype(np.float32)})
    assert entry.rewrites["reshape target made constant"] == 1
    assert ops(out) == Counter({"Reshape": 1, "Relu": 1})
    (shape,) = [onnx.numpy_helper.to_array(t) for t in out.graph.initializer]
    assert shape.tolist() == expected


@pytest.mark.parametrize("case", [
    ("dim of another tensor", "float[N,4,1,1] x, float[N] z", "d = Shape(z)", 13, "Reshape"),
    ("dim at another position", "float[N,M,1,1] x", "s = Shape(x)\n i = Constant<value=int64[1] {1}>()\n"
     " d = Gather(s, i)", 13, "Reshape"),
    ("allowzero=1", "float[N,4,1,1] x", "d = Shape<start=0, end=1>(x)", 15, "Reshape<allowzero=1>"),
], ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_reshape_target_not_made_constant(case):
    _, inputs, batch, opset, reshape = case
    proto = model(f"{batch}\n m = Constant<value=int64[1] {{-1}}>()\n t = Concat<axis=0>(d, m)\n"
                  f" r = {reshape}(x, t)\n y = Relu(r)", inputs, "float[A,B] y", opset=opset)
    out, entry = onnxslim_kit.optimize(proto, passes="fuse", verify=False)
    assert "reshape target made constant" not in entry.passes[0].rewrites
    assert ops(out)["Concat"] == 1


def test_shape_of_dynamic_dim_kept():
    proto = model("s = Shape(x)\n i = Constant<value=int64 {0}>()\n d = Gather<axis=0>(s, i)\n f = Cast<to=1>(d)\n"
                  " y = Mul(x, f)", "float[N,3] x", "float[N,3] y")
    out, entry = fuse(proto)
    assert entry.skipped["shape folding: input shape not static"] == 1
    assert ops(out)["Shape"] == 1


def test_evaluation_engines_agree():
    m = Model.from_proto(model("a = Constant<value=float[4] {1, 2, 3, 4}>()\n b = Constant<value=float[2,2] {1,0,0,1}>()\n"
                               " s = Constant<value=int64[2] {2, 2}>()\n r = Reshape(a, s)\n y = MatMul(r, b)",
                               "", "float[2,2] y"))
    reshape = [n for n in m.graph.nodes if n.op == "Reshape"][0]
    values = [np.asarray(t.values) for t in reshape.inputs]
    via_ort = _const_fold.evaluate(reshape, 13, values, engines=("ort",))
    via_ref = _const_fold.evaluate(reshape, 13, values, engines=("reference",))
    np.testing.assert_array_equal(via_ort[0], via_ref[0])
    with pytest.raises(_const_fold.FoldError):
        _const_fold.evaluate(reshape, 13, [values[0], np.array([3, 3], np.int64)])


# --- duplicate constants, CSE ---------------------------------------------------------------------

def test_duplicate_constants_and_common_subexpressions_merged():
    proto = model("a = Constant<value=float[3] {1, 2, 3}>()\n b = Constant<value=float[3] {1, 2, 3}>()\n"
                  " p = Add(x, a)\n q = Add(x, b)\n rp = Relu(p)\n rq = Relu(q)\n y = Mul(rp, rq)",
                  "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert entry.rewrites["duplicate constant merged"] == 1
    assert entry.rewrites["common subexpression merged"] == 2
    assert ops(out) == Counter({"Add": 1, "Relu": 1, "Mul": 1})
    assert len(out.graph.initializer) == 1


def test_cse_off():
    proto = model("a = Constant<value=float[3] {1, 2, 3}>()\n b = Constant<value=float[3] {1, 2, 3}>()\n"
                  " p = Add(x, a)\n q = Add(x, b)\n y = Mul(p, q)", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto, passes="fuse(cse=false)")
    assert "duplicate constant merged" not in entry.rewrites and "common subexpression merged" not in entry.rewrites
    assert ops(out)["Add"] == 2


def test_constants_differing_in_type_or_shape_not_merged():
    proto = model("a = Constant<value=float[2] {1, 2}>()\n b = Constant<value=float[2,1] {1, 2}>()\n"
                  " c = Constant<value=int32[2] {1, 2}>()\n p = Add(x, a)\n q = Add(x, b)\n ci = Cast<to=1>(xi)\n"
                  " r = Add(xi, c)\n rf = Cast<to=1>(r)\n y = Sum(p, q, rf)", "float[2] x, int32[2] xi", "float[2,2] y")
    out, entry = fuse(proto)
    assert "duplicate constant merged" not in entry.rewrites
    assert len(out.graph.initializer) == 3


def test_cse_keeps_the_node_feeding_a_graph_output():
    proto = model("r1 = Relu(x)\n y = Relu(x)\n z = Neg(r1)", "float[2,3] x", "float[2,3] y, float[2,3] z")
    out, entry = fuse(proto)
    assert entry.rewrites["common subexpression merged"] == 1
    assert ops(out) == Counter({"Relu": 1, "Neg": 1})
    relu = [n for n in out.graph.node if n.op_type == "Relu"][0]
    assert relu.output[0] == "y"


def test_cse_both_graph_outputs_skipped():
    proto = model("y = Relu(x)\n z = Relu(x)", "float[2,3] x", "float[2,3] y, float[2,3] z")
    out, entry = fuse(proto)
    assert entry.skipped["cse: both results are graph outputs"] == 1
    assert ops(out)["Relu"] == 2


def test_cse_distinguishes_attributes():
    proto = model("a = LeakyRelu<alpha=0.1>(x)\n b = LeakyRelu<alpha=0.2>(x)\n y = Add(a, b)", "float[2,3] x", "float[2,3] y")
    out, entry = fuse(proto)
    assert ops(out)["LeakyRelu"] == 2


# --- real models ----------------------------------------------------------------------------------

def _silero_calib():
    rng = np.random.default_rng(0)
    return [{"input": (0.1 * rng.standard_normal((batch, 512))).astype(np.float32),
             "state": (0.1 * rng.standard_normal((2, batch, 128))).astype(np.float32),
             "sr": np.array(16000, np.int64)} for batch in (1, 2, 1, 3)]


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["silero_vad", "mtcnn_pnet"])
def test_fuse_on_real_model(name):
    from onnxslim_kit.zoo import fetch

    path = fetch(name)
    kwargs = {"calib": _silero_calib()} if name == "silero_vad" else {"input_shapes": {"input_1": [1, 24, 24, 3]}}
    out, report = onnxslim_kit.optimize(path, passes="fuse", **kwargs)
    entry = report.passes[0]
    assert not entry.rolled_back
    assert entry.verification is None or entry.verification["status"] == "ok", entry.verification
    assert nodes_counting_prelu_once(out) <= report.before["nodes"]
    onnx.checker.check_model(out, full_check=True)
    if name == "silero_vad":
        assert entry.verification["status"] == "ok"
        assert report.after["nodes"] < report.before["nodes"] // 2
        assert entry.rewrites["constant folded"] > 0 and entry.rewrites["identity removed"] > 0


# --- Unsqueeze ∘ Unsqueeze -------------------------------------------------------------------

@pytest.mark.parametrize("opset,a,b,want", [
    (13, [1], [2], [1, 2]),
    (13, [0], [0], [0, 1]),
    (13, [0], [1], [0, 1]),
    (13, [2], [0], [0, 3]),
    (13, [-1], [-3], [1, 3]),
    (11, [1], [2], [1, 2]),
    (11, [0, 2], [1], [0, 1, 3]),
])
def test_unsqueeze_pair_merged(opset, a, b, want):
    if opset >= 13:
        body = (f"ua = Constant <value = int64[{len(a)}] {{{', '.join(map(str, a))}}}> ()\n"
                f"ub = Constant <value = int64[{len(b)}] {{{', '.join(map(str, b))}}}> ()\n"
                "m = Unsqueeze(x, ua)\n u = Unsqueeze(m, ub)\n y = Relu(u)")
    else:
        body = f"m = Unsqueeze<axes={a}>(x)\n u = Unsqueeze<axes={b}>(m)\n y = Relu(u)"
    rank = 2 + len(a) + len(b)
    proto = model(body, "float[2,3] x", f"float[{','.join(['?'] * rank)}] y", opset=opset)
    out, entry = fuse(proto)
    assert entry.rewrites["unsqueeze∘unsqueeze merged"] == 1
    assert ops(out)["Unsqueeze"] == 1
    node = [n for n in out.graph.node if n.op_type == "Unsqueeze"][0]
    if opset >= 13:
        axes = [onnx.numpy_helper.to_array(t) for t in out.graph.initializer if t.name == node.input[1]][0]
    else:
        axes = [a for a in node.attribute if a.name == "axes"][0].ints
    assert list(axes) == want


def test_unsqueeze_pair_with_shared_middle_is_kept():
    body = ("m = Unsqueeze<axes=[0]>(x)\n u = Unsqueeze<axes=[0]>(m)\n y = Relu(u)\n z = Relu(m)")
    proto = model(body, "float[2,3] x", "float[1,1,2,3] y, float[1,2,3] z", opset=11)
    out, entry = fuse(proto)
    assert entry.skipped["unsqueeze∘unsqueeze: intermediate tensor has other readers"] == 1
    assert ops(out)["Unsqueeze"] == 2
