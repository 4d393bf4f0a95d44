"""Sessions that verify or calibrate keep no pre-packed weight copies (issue 16).

ONNX Runtime packs every constant MatMul weight into a copy of its own at session load
(anonymous memory, held for the session's life). With ``prepack=False`` the session reads the
weight where it lies. Measured here on one 64 MB MatMul weight: the growth of the process's
anonymous resident memory (``RssAnon``) while a session is open, by the sessions the passes
use to calibrate, against a session with pre-packing on (what bench times).

A Model's in-memory weights (``arrays``) are read in place at level ``disable``: no spill file
mapped, no copy (anonymous and file-backed RSS counted), with or without weights left on disk;
at other levels (ORT's optimizers read an initializer's file, not a buffer given) they are spilled.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit.runtime import NO_PREPACK, give_back, make_session, run, session_options

N = 4096  # W: N×N float32 = 64 MB
WEIGHT_BYTES = N * N * 4

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

MATMUL = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,{N}] x) => (float[1,{N}] y) {{
  y = MatMul (x, w)
}}
"""


def _anon(kinds=("RssAnon",)) -> int:
    found = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key = line.split(":")[0]
            if key in kinds:
                found[key] = int(line.split()[1]) * 1024
    if len(found) < len(kinds):
        pytest.skip(f"no {', '.join(kinds)} in /proc/self/status")
    return sum(found.values())


def _resident() -> int:
    """Anonymous and file-backed resident bytes: a file ORT maps counts too."""
    return _anon(("RssAnon", "RssFile"))


@pytest.fixture(scope="module")
def proto():
    model = onnx.parser.parse_model(MATMUL)
    w = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    return model


SAMPLE = {"x": np.ones((1, N), np.float32)}


def _held(open_session, measure=_anon) -> int:
    """Anonymous bytes (or what ``measure`` counts) the process gains while ``open_session()``'s
    session is open and has run once (``open_session`` returns a handle that keeps it alive)."""
    gc.collect()
    give_back()
    before = measure()
    handle = open_session()
    held = measure() - before
    del handle
    gc.collect()
    give_back()
    return held


def _session(proto, prepack):
    session = make_session(proto, threads=1, prepack=prepack)
    run(session, SAMPLE)
    return session


def _iter_activations(proto):
    from onnxslim_kit.activations import iter_activations

    it = iter_activations(proto, ["y"], [SAMPLE, SAMPLE])
    next(it)
    return it


def _int8_calibration(model):
    from onnxslim_kit.passes.int8.fallback import activations

    it = activations(model, ["y"], [SAMPLE, SAMPLE])
    next(it)
    return it


def _loaded(proto):
    """``proto`` as a Model whose weight is an array already (as a pass reads it)."""
    import onnx_graphsurgeon as gs

    from onnxslim_kit.model import Model

    model = Model.from_proto(proto)
    for tensor in model.graph.tensors().values():
        if isinstance(tensor, gs.Constant):
            tensor.values = np.array(tensor.values)
    return model


def test_options_carry_the_setting():
    assert session_options(prepack=False).get_session_config_entry(NO_PREPACK) == "1"
    with pytest.raises(RuntimeError):  # default: ORT's own (pre-packing on), the key unset
        session_options().get_session_config_entry(NO_PREPACK)


def test_prepacking_holds_a_copy_of_the_weight(proto):
    """The measurement the tests below rely on: on, ORT holds ≈ the weight again; off, nothing."""
    assert _held(lambda: _session(proto, True)) > 0.75 * WEIGHT_BYTES
    assert _held(lambda: _session(proto, False)) < 0.25 * WEIGHT_BYTES


def test_activations_session_does_not_prepack(proto):
    """:func:`onnxslim_kit.activations.iter_activations`: data-driven passes' calibration."""
    assert _held(lambda: _iter_activations(proto)) < 0.25 * WEIGHT_BYTES


def test_int8_calibration_session_does_not_prepack(proto):
    """int8's calibration session reads the model's own arrays in place (no copy) and packs none."""
    model = _loaded(proto)
    assert _held(lambda: _int8_calibration(model)) < 0.25 * WEIGHT_BYTES


# --- a Model's in-memory weights (``arrays``): read in place at level disable ---------------

def _with_arrays(model, opt_level="disable"):
    proto, arrays = model.session_proto()
    assert set(arrays) == {"w"}
    session = make_session(proto, opt_level=opt_level, threads=1, arena=False, arrays=arrays, prepack=False)
    run(session, SAMPLE)
    return session


def _expected(proto):
    return SAMPLE["x"] @ numpy_helper.to_array(proto.graph.initializer[0])


def test_arrays_are_read_in_place(proto):
    """No weight left on disk: the arrays were written to a spill file ORT mapped (+1× the weight
    once run; 480 MB decoder: +467 MB); handed over with ``add_initializer`` ORT runs on them."""
    model = _loaded(proto)
    assert _held(lambda: _with_arrays(model), _resident) < 0.25 * WEIGHT_BYTES
    np.testing.assert_allclose(run(_with_arrays(model), SAMPLE)["y"], _expected(proto), rtol=1e-4, atol=1e-3)


MIXED = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,{N}] x) => (float[1,{N}] y) {{
  h = MatMul (x, w)
  y = Add (h, b)
}}
"""


def test_arrays_beside_weights_on_disk_are_read_in_place(tmp_path, proto):
    """Some weights left on disk (their folder is ORT's) and ``w`` changed in memory: ORT copied
    the arrays (``add_external_initializers``, +1×); now both lie in one folder above both."""
    from onnxslim_kit.model import Model, load_proto

    mixed = onnx.parser.parse_model(MIXED)
    mixed.graph.initializer.append(numpy_helper.from_array(np.ones((1, N), np.float32), "b"))
    mixed.graph.initializer.append(numpy_helper.from_array(np.zeros((N, N), np.float32), "w"))
    onnx.save_model(mixed, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    model = Model.from_proto(load_proto(tmp_path / "m.onnx", lazy=True))
    w = numpy_helper.to_array(proto.graph.initializer[0])
    model.graph.tensors()["w"].values = w  # as a pass leaves it; b stays on disk
    expected = SAMPLE["x"] @ w + 1
    assert _held(lambda: _with_arrays(model), _resident) < 0.25 * WEIGHT_BYTES
    np.testing.assert_allclose(run(_with_arrays(model), SAMPLE)["y"], expected, rtol=1e-4, atol=1e-3)
    # ORT's optimizers would read a stand-in: at other levels the arrays are spilled, same values
    np.testing.assert_allclose(run(_with_arrays(model, "all"), SAMPLE)["y"], expected, rtol=1e-4, atol=1e-3)


FOLDED = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,{N}] x) => (float[1,{N}] y) {{
  t = Transpose <perm = [1, 0]> (w)
  y = MatMul (x, t)
}}
"""


@pytest.mark.parametrize("opt_level", ["disable", "basic", "all"])
def test_arrays_give_the_right_values_at_every_level(opt_level):
    """At ``all`` ORT folds Transpose(w) — from the file a stub names, not from an initializer
    given in place (a sparse stand-in folded to zeros): the arrays must not be given in place there."""
    folded = onnx.parser.parse_model(FOLDED)
    w = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
    folded.graph.initializer.append(numpy_helper.from_array(w, "w"))
    session = _with_arrays(_loaded(folded), opt_level)
    np.testing.assert_allclose(run(session, SAMPLE)["y"], SAMPLE["x"] @ w.T, rtol=1e-4, atol=1e-3)
