"""The verification peak is one model's session; a range observation holds no tensors (issue 16).

:class:`onnxslim_kit.verify.Verifier` runs the reference model once, keeps its outputs as
arrays and drops its session before any candidate's is built; a candidate given as a
:class:`~onnxslim_kit.model.Model` is run on the Model's own arrays (no second copy: ORT reads
them in place, :func:`onnxslim_kit.runtime.make_session`). Measured here with the process's
peak resident memory (``VmHWM``, reset through ``/proc/self/clear_refs``), anonymous and
file-backed pages alike, on a 64 MB weight.

:func:`onnxslim_kit.activations.iter_activations` with ``absmax=True`` returns max|x| per
observed tensor (fp16's range observation) from a ``ReduceMax(Abs(x))`` added per tensor,
instead of every observed tensor as an output held until the run ends.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit.model import Model, load_proto
from onnxslim_kit.runtime import give_back
from onnxslim_kit.verify import Verifier

N = 4096  # W: N×N float32 = 64 MB
WEIGHT_BYTES = N * N * 4
SLACK = 0.25 * WEIGHT_BYTES

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

CHAIN = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,{N}] x) => (float[1,{N}] y) {{
  h = MatMul (x, w)
  y = Add (h, b)
}}
"""


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    pytest.skip(f"no {key} in /proc/self/status")


def _settle() -> int:
    """Resident bytes now, garbage collected, the C heap trimmed, the peak reset to it."""
    gc.collect()
    give_back()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("cannot reset the peak RSS (/proc/self/clear_refs)")
    return _status("VmRSS")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The chain with its weights in an external-data file (as issue 16's models are)."""
    folder = tmp_path_factory.mktemp("chain")
    proto = onnx.parser.parse_model(CHAIN)
    rng = np.random.default_rng(0)
    proto.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((1, N)).astype(np.float32), "b"))
    proto.graph.initializer.append(numpy_helper.from_array(
        (rng.standard_normal((N, N)) / 64).astype(np.float32), "w"))
    onnx.save_model(proto, str(folder / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    path = folder / "m.onnx"
    # once before measuring: ORT's first session in a process loads its kernels' code pages and
    # its allocators for good (+16 MB measured; the same Verifier again: +0)
    Verifier(load_proto(path, lazy=True), SAMPLES).check(Model.from_proto(load_proto(path, lazy=True)), True)
    return path


SAMPLES = [{"x": np.random.default_rng(s).standard_normal((1, N)).astype(np.float32)} for s in range(2)]


def test_the_reference_session_is_gone_once_built(saved):
    """After the reference run only its outputs are held: the file pages ORT mapped go with it."""
    original = load_proto(saved, lazy=True)
    before = _settle()
    verifier = Verifier(original, SAMPLES)
    assert verifier.reference is not None
    assert _status("VmHWM") - before > 0.75 * WEIGHT_BYTES  # the session did read the weights
    assert _settle() - before < SLACK


def test_a_candidate_check_holds_one_model(saved):
    """A Model whose weight a pass replaced (in memory) beside one left on disk: the check's peak
    over the Model itself is the session's file pages of ``b`` and little else — not a second
    copy of ``w`` (ORT copied it before: +1×, the peak 2× the weights)."""
    original = load_proto(saved, lazy=True)
    verifier = Verifier(original, SAMPLES)
    model = Model.from_proto(load_proto(saved, lazy=True))
    w = model.graph.tensors()["w"]
    w.values = np.array(w.values) * np.float32(1)  # in memory now, same values: lossless
    before = _settle()
    check = verifier.check(model, lossless=True)
    assert check.status == "ok", check.summary()
    assert _status("VmHWM") - before < SLACK
    assert _settle() - before < SLACK


def test_a_check_of_a_loaded_model_maps_its_weights_once(saved):
    """Every weight left on disk: the session maps the file (one copy, file-backed) and drops it."""
    original = load_proto(saved, lazy=True)
    verifier = Verifier(original, SAMPLES)
    model = Model.from_proto(load_proto(saved, lazy=True))
    before = _settle()
    assert verifier.check(model, lossless=True).status == "ok"
    assert _status("VmHWM") - before < WEIGHT_BYTES + SLACK
    assert _settle() - before < SLACK


# --- iter_activations(absmax=True) ------------------------------------------------------------

OBSERVED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x, float[0] e) => (float[2, 3] y, float[0] e2, float16[2, 3] half) {
  a = Mul (x, k)
  taken = Neg (a)
  y = Relu (taken)
  e2 = Neg (e)
  half = Cast <to = 10> (a)
}
"""


def observed_model(opset: int = 17) -> onnx.ModelProto:
    """OBSERVED with ``taken`` renamed ``a::absmax`` (the parser reads no ``:`` in names): the
    name the observation of ``a`` would take first."""
    proto = onnx.parser.parse_model(OBSERVED.replace('"" : 17', f'"" : {opset}'))
    for node in proto.graph.node:
        node.input[:] = ["a::absmax" if n == "taken" else n for n in node.input]
        node.output[:] = ["a::absmax" if n == "taken" else n for n in node.output]
    return proto


@pytest.mark.parametrize("opset", [13, 17, 18])
def test_absmax_is_the_largest_magnitude_of_each_tensor(opset):
    """A graph input, intermediates (one already named ``a::absmax``), a graph output, a float16
    tensor, an empty one (0.0), a name asked twice: each max|x| of the tensor itself."""
    from onnxslim_kit.activations import iter_activations

    proto = observed_model(opset)
    proto.graph.initializer.append(numpy_helper.from_array(np.array([-2.0, 0.5, 3.0], np.float32), "k"))
    names = ["x", "a", "a::absmax", "y", "half", "e2", "e", "a"]
    samples = [{"x": np.array([[1.0, -4.0, 0.25], [-3.0, 2.0, -1.5]], np.float32), "e": np.zeros(0, np.float32)},
               {"x": np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -7.0]], np.float32), "e": np.zeros(0, np.float32)}]
    full = list(iter_activations(proto, names, samples))
    observed = list(iter_activations(proto, names, samples, absmax=True))
    for tensors, maxima in zip(full, observed):
        assert set(maxima) == set(names)
        for name in names:
            want = float(np.max(np.abs(tensors[name]))) if tensors[name].size else 0.0
            assert maxima[name] == want and type(maxima[name]) is float, name
    assert observed[1]["a"] == 21.0 and observed[0]["half"] == 6.0


@pytest.mark.parametrize("row, want", [
    ([np.nan, 1.0, 0.0], "nan"), ([1.0, np.nan, 0.0], "nan"), ([1.0, 0.0, np.nan], "nan"),  # ReduceMax alone: 1.0
    ([np.inf, 1.0, 0.0], np.inf), ([1.0, -np.inf, 0.0], np.inf), ([1.0, -5.0, 0.0], 5.0),
])
def test_absmax_reports_nan_wherever_it_is(row, want):
    from onnxslim_kit.activations import iter_activations

    proto = observed_model()
    proto.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "k"))
    sample = {"x": np.array([row, [0.0, 0.0, 0.0]], np.float32), "e": np.zeros(0, np.float32)}
    got = next(iter_activations(proto, ["a", "x"], [sample], absmax=True))
    for value in got.values():
        assert np.isnan(value) if want == "nan" else value == want


LAYERS = 8
WIDE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1024, 4096] x) => (float[1024, 4096] y) {
""" + "".join(f"  t{i + 1} = Sin (t{i})\n" for i in range(LAYERS)).replace("t0", "x") + f"  y = Neg (t{LAYERS})\n}}"


def test_absmax_observation_holds_no_tensors():
    """Eight observed 16 MB tensors: returned whole they are all alive when the run ends (and in
    the dict); observed by max|x| ORT frees each once read, so the peak is a few tensors."""
    from onnxslim_kit.activations import iter_activations

    proto = onnx.parser.parse_model(WIDE)
    names = [f"t{i}" for i in range(1, LAYERS + 1)]
    sample = [{"x": np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)}]
    tensor = 1024 * 4096 * 4

    def peak(absmax: bool) -> int:
        next(iter_activations(proto, names, sample, threads=1))  # ORT's one-time start-up
        before = _settle()
        got = next(iter_activations(proto, names, sample, threads=1, absmax=absmax))
        assert len(got) == LAYERS
        del got
        return _status("VmHWM") - before

    whole, maxima = peak(False), peak(True)
    assert whole > LAYERS * tensor
    assert maxima < 4 * tensor
