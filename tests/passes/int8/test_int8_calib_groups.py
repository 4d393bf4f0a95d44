"""The int8 pass's calibration and bias-correction runs cut into groups of at most
``CALIB_RUN_BYTES`` of activations (:mod:`onnxslim_kit.passes.int8.calib_groups`): the same
numbers as one run, less held at once."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_ort
from onnx import numpy_helper

from onnxslim_kit.model import Model
from onnxslim_kit.passes.int8 import calib_groups, correct
from onnxslim_kit.passes.int8.calib_groups import calibration_groups, tensor_bytes

from test_int8 import conv_chain, quantize


def values(model) -> list:
    return sorted(numpy_helper.to_array(t).tobytes() for t in model.graph.initializer)


def test_groups_keep_graph_order_and_the_budget(monkeypatch):
    model = Model.from_proto(conv_chain())
    sample = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    names = ["y", "x", "r1", "c1", "r2"]
    sizes = tensor_bytes(model, names, sample)
    assert sizes["c1"] == 4 * 8 * 16 * 16 and sizes["x"] == 4 * 3 * 16 * 16
    assert calibration_groups(model, names, sample) == [names]  # all fit: one run, as before
    monkeypatch.setattr(calib_groups, "CALIB_RUN_BYTES", 2 * sizes["c1"])
    groups = calibration_groups(model, names, sample)
    assert [n for g in groups for n in g] == ["x", "c1", "r1", "r2", "y"]  # graph order
    assert all(sum(sizes[n] for n in g) <= 2 * sizes["c1"] for g in groups) and len(groups) == 3


@pytest.mark.parametrize("options", ["target=none", "target=cos:0.99"])
def test_one_tensor_a_run_gives_the_same_numbers(monkeypatch, options):
    model = conv_chain()
    whole, rep = quantize(model, options)
    monkeypatch.setattr(calib_groups, "CALIB_RUN_BYTES", 1)  # every tensor, every twin pair, a run of its own
    monkeypatch.setattr(correct, "CALIB_RUN_BYTES", 1)
    cut, cut_rep = quantize(model, options)
    assert values(cut) == values(whole) and rep.metrics["layers_int8"] == cut_rep.metrics["layers_int8"]
    x = {"x": np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert np.array_equal(run_ort(cut, x)[0], run_ort(whole, x)[0])


def _skip_and_split():
    """A graph input read at the end (skip), a Split whose outputs fall in different groups."""
    import onnx

    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] y) {
        c1 = Conv (x, w1)
        r1 = Relu (c1)
        s0, s1 = Split <axis = 1> (r1)
        a = Add (s0, s1)
        m = Mul (a, a)
        y = Concat <axis = 1> (m, a, x)
    }"""
    model = onnx.parser.parse_model(text)
    w1 = np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w1, "w1"))
    return Model.from_proto(model)


def test_segments_give_every_group_the_values_of_one_whole_run():
    from onnxslim_kit.passes.int8.fallback import activations

    model = _skip_and_split()
    groups = [["x", "c1"], ["r1", "s0"], ["s1", "a"], ["m", "y"]]
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    whole = list(activations(model, [n for g in groups for n in g], samples))
    got = list(calib_groups.group_activations(model, groups, samples, threads=1))
    assert len(got) == len(samples) * len(groups)
    for i, acts in enumerate(got):  # sample by sample, each group in order
        sample, group = divmod(i, len(groups))
        assert list(acts) == groups[group]
        for name in groups[group]:
            assert np.array_equal(acts[name], whole[sample][name])


def test_segments_run_each_node_once_and_carry_what_later_ones_read():
    model = _skip_and_split()
    segments = calib_groups._segments(model, [["x", "c1"], ["r1", "s0"], ["s1", "a"], ["m", "y"]])
    assert [s.inputs for s in segments] == [["x"], ["c1"], ["s0", "s1"], ["a", "x"]]
    assert [s.outputs for s in segments] == [["c1"], ["r1", "s0", "s1"], ["a"], ["m", "y"]]  # s1: the Split's
    assert "x" not in segments[0].done and "x" in segments[3].done  # the skip: carried to the end
