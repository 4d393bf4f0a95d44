"""Suffix runs of ``int4``'s sensitivity (:mod:`onnxslim_kit.passes.int4.suffix`): a candidate
runs only the nodes its weight reaches, and its losses equal a whole-model run's bit for bit —
on equal and on different sample lengths, with the cut budget spent or not, and through the
pass (the same 8-bit layers, the same output bytes)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import test_fp16 as fp16_tests
from test_int4 import int4

from onnxslim_kit.passes.int4 import mixed
from onnxslim_kit.passes.int4 import suffix

RNG = np.random.default_rng(16)
D, F = 16, 1536  # K = F over 1024: a bias fused into Gemm rounds differently from MatMul + Add


def _block(i: int, x: str) -> str:
    return f"""
    n{i} = LayerNormalization({x}, g{i}, b{i})
    q{i} = MatMul(n{i}, Wq{i})
    k{i} = MatMul(n{i}, Wk{i})
    v{i} = MatMul(n{i}, Wv{i})
    kt{i} = Transpose<perm = [0, 2, 1]>(k{i})
    s{i} = MatMul(q{i}, kt{i})
    p{i} = Softmax<axis = -1>(s{i})
    c{i} = MatMul(p{i}, v{i})
    o{i} = MatMul(c{i}, Wo{i})
    r{i} = Add({x}, o{i})
    m{i} = LayerNormalization(r{i}, g{i}, b{i})
    f{i} = MatMul(m{i}, Wf{i})
    a{i} = Relu(f{i})
    e{i} = MatMul(a{i}, We{i})
    eb{i} = Add(e{i}, c{i}b)
    h{i} = Add(r{i}, eb{i})"""


def decoder(length: str = "8", batch: str = "1") -> onnx.ModelProto:
    """Two pre-LN blocks between an input and an output projection; a second output ``z`` made
    after the first block (the later candidates' suffixes do not make it)."""
    body = "h = MatMul(x, Win)" + _block(0, "h") + _block(1, "h0") + "\ny = MatMul(h1, Wout)\nz = Relu(r0)"
    inits = {"Win": RNG.standard_normal((8, D)), "Wout": RNG.standard_normal((D, 4))}
    for i in range(2):
        inits.update({f"g{i}": 1 + 0.1 * RNG.standard_normal(D), f"b{i}": 0.1 * RNG.standard_normal(D)})
        inits.update({f"W{p}{i}": RNG.standard_normal((D, D)) / 4 for p in "qkvo"})
        inits.update({f"Wf{i}": RNG.standard_normal((D, F)) / 4, f"We{i}": RNG.standard_normal((F, D)) / 4})
        inits[f"c{i}b"] = 0.1 * RNG.standard_normal(D)  # MatMul + bias (K = F): a Gemm where the shapes are static
    inits = {k: np.asarray(v, np.float32) for k, v in inits.items()}
    model = fp16_tests.build(body, f"float[{batch}, {length}, 8] x", inits, outputs="float y, float z", opset=17)
    for node in model.graph.node:
        node.name = node.output[0]
    return model


def weights(model: onnx.ModelProto) -> list:
    readers = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    return [t.name for t in model.graph.initializer if t.name in readers]


def changed(model: onnx.ModelProto, names: list) -> dict:
    """{name: callable giving the weight with a fixed perturbation}, as the pass gives its int4 copies."""
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(3)
    noise = {n: (0.05 * rng.standard_normal(arrays[n].shape)).astype(np.float32) for n in names}
    return {n: (lambda n=n: arrays[n] + noise[n]) for n in names}


def samples(lengths: list) -> list:
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal((1, t, 8)).astype(np.float32)} for t in lengths]


def losses(model, names, data, suffixes: bool) -> tuple:
    s = mixed.Sensitivity(model, names, data, suffixes=suffixes)
    try:
        return s.losses(changed(model, names)), set(s.suffixed), dict(s.parts)
    finally:
        s.close()


def test_downstream_and_cut_of_a_weight():
    graph = decoder().graph
    index = {o: i for i, n in enumerate(graph.node) for o in n.output}
    part = suffix.downstream(graph, "Wk1")
    assert part[0] == index["k1"] and index["y"] in part and index["z"] not in part
    assert index["q1"] not in part and index["v1"] not in part  # siblings are not downstream
    assert suffix.cut(graph, part) == sorted(["n1", "q1", "v1", "h0"])
    assert suffix.downstream(graph, "Win") == list(range(len(graph.node)))


@pytest.mark.parametrize("length, lengths", [("8", [8, 8, 8]), ("T", [8, 8, 8]), ("T", [5, 7, 6])])
def test_suffix_losses_equal_whole_model_losses_exactly(length, lengths):
    """Static and symbolic lengths: the suffix's cut inputs know what the whole model knows."""
    model = decoder(length)
    names = weights(model)
    data = samples(lengths)
    whole, none, _ = losses(model, names, data, suffixes=False)
    part, cuts, parts = losses(model, names, data, suffixes=True)
    assert not none
    assert set(cuts) == set(names) - {"Win"}  # the first layer reaches every node: whole runs
    assert len(parts["Wout"]) == 1 and len(parts["Wq1"]) < len(parts["Wq0"]) < len(model.graph.node)
    assert part == whole  # bit for bit, not approximately
    assert all(v > 0 for v in whole.values())


def test_cut_budget_falls_back_to_whole_runs(monkeypatch):
    model = decoder()
    names = weights(model)
    data = samples([8, 8])
    whole, _, _ = losses(model, names, data, suffixes=False)
    monkeypatch.setattr(mixed, "CUT_BYTES", 0)
    part, cuts, _ = losses(model, names, data, suffixes=True)
    assert cuts == set() and part == whole
    one = 1 * 8 * D * 4 * len(data)  # one [1, 8, D] float tensor on every sample
    monkeypatch.setattr(mixed, "CUT_BYTES", one)
    part, cuts, _ = losses(model, names, data, suffixes=True)
    assert set(cuts) == {"Wout"} and part == whole  # its cut is h1 alone


def test_admit_counts_a_shared_cut_tensor_once():
    parts = {"a": [5], "b": [4, 5], "c": [1, 2, 3, 4, 5]}
    cuts = {"a": ["t"], "b": ["t", "u"], "c": ["w"]}
    sizes = {"t": 10, "u": 10, "w": 10}
    assert suffix.admit(parts, cuts, sizes, 20) == ["a", "b"]
    assert suffix.admit(parts, cuts, sizes, 30) == ["a", "b", "c"]
    assert suffix.admit(parts, cuts, sizes, 9) == []


def test_input_types_keep_the_static_dims_of_the_whole_model():
    model = decoder("T")
    static = suffix.static_types(model, ["h0", "k1"])
    assert [d.dim_param or d.dim_value for d in static["h0"].type.tensor_type.shape.dim] == [1, "T", D]
    eight = [np.zeros((1, 8, D), np.float32)] * 2
    info = suffix.input_types({"h0": eight, "u": eight}, static)
    dims = [d.dim_param or d.dim_value for d in info["h0"].type.tensor_type.shape.dim]
    assert dims == [1, "T", D]  # the samples agree on 8, the whole model does not know it
    assert all(d.dim_param for d in info["u"].type.tensor_type.shape.dim)  # not inferred: all symbolic
    assert info["h0"].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_models_with_subgraphs_run_whole():
    branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["a"], ["t"])], "b", [],
                                    [onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)])
    node = onnx.helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    graph = onnx.helper.make_graph([node], "g", [], [])
    assert suffix.has_subgraphs(graph) and not suffix.has_subgraphs(decoder().graph)
    assert mixed._suffix_parts(graph, ["a"]) == {}


def test_pass_output_is_the_same_with_and_without_suffixes(monkeypatch):
    """On by default; switched off, the same 8-bit layers and output bytes."""
    model = decoder()
    options = "method=rtn,block_size=16,max_ratio=0.25,target=none,measured=20"
    assert mixed.SUFFIX_RUNS  # the pass's default (mixed.py)
    with_suffixes, report = int4(model, options)
    monkeypatch.setattr(mixed, "SUFFIX_RUNS", False)
    without, report_whole = int4(model, options)
    assert 0 < len(report.metrics["int8_layers"]) < report.metrics["mixed_candidates"]
    assert report.metrics["int8_layers"] == report_whole.metrics["int8_layers"]
    # every candidate (Win, K = 8, is none) leaves out a node: all ran as suffixes
    assert report.metrics["mixed_suffix_runs"] == report.metrics["mixed_candidates"] == 13
    assert report_whole.metrics["mixed_suffix_runs"] == 0
    assert with_suffixes.SerializeToString() == without.SerializeToString()


def test_calls_take_their_own_cut_tensors_and_drop_them():
    """The representatives, then the shortlist: each call's suffixes are fed their own cut tensors."""
    model = decoder("T")
    names = weights(model)
    data = samples([6, 8])
    whole, _, _ = losses(model, names, data, suffixes=False)
    s = mixed.Sensitivity(model, names, data, suffixes=True)
    try:
        values = changed(model, names)
        first = s.losses({n: values[n] for n in names[:5]})
        assert s.held == [] and s.cuts == {}  # dropped after the call
        second = s.losses({n: values[n] for n in names[5:]})
        assert {**first, **second} == whole and s.suffixed == set(names) - {"Win"}
    finally:
        s.close()


def test_cut_tensors_are_outputs_of_one_call_only(monkeypatch):
    """The session that runs whole models returns the outputs alone; a call's reference run asks a
    session of its own for that call's cut tensors (a session returning every candidate's cut
    tensors held them all at once in each of its runs: the 1.29× → 1.32× peak of issue 16's decoder)."""
    model = decoder("T")
    names = weights(model)
    data = samples([6, 8])
    asked = []
    made = mixed.make_session

    def spy(proto, *args, extra_outputs=None, **kwargs):
        asked.append(sorted(extra_outputs or []))
        return made(proto, *args, extra_outputs=extra_outputs, **kwargs)

    monkeypatch.setattr(mixed, "make_session", spy)
    s = mixed.Sensitivity(model, names, data, suffixes=True)
    try:
        assert [o.name for o in s.session.get_outputs()] == ["y", "z"]
        values = changed(model, names)
        s.losses({n: values[n] for n in names[-2:]})
        cuts = sorted({t for n in names[-2:] for t in s.all_cuts[n]} - {"y", "z"})
        assert cuts and cuts in asked and all(set(a) <= set(cuts) for a in asked)
    finally:
        s.close()
