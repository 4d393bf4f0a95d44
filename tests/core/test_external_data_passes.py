"""Every registered pass on a model saved with external data (issue 16).

The input's weights stay on disk (:mod:`onnxslim_kit.streaming`: anchored tensors with
absolute locations, which ONNX Runtime refuses); every session a pass makes must still load
it. Each pass runs through the command line twice — alone, on the weights as they are on disk,
and after ``fuse`` (the issue's ``--passes fuse,PASS``) — and must exit 0, write a model ONNX
Runtime runs, leave the input's ``.onnx`` and ``.data`` byte-identical and put nothing beside
them. A few sessions are checked directly too: the calibration / profiling sessions of int8 and
prune and :func:`onnxslim_kit.runtime.map_anchored`'s subgraph case.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxslim_kit.cli import main
from onnxslim_kit.model import Model, load_proto
from onnxslim_kit.registry import available_passes
from onnxslim_kit.runtime import EXTERNAL_FOLDER, map_anchored
from onnxslim_kit.streaming import has_anchored

# three Conv+BN+Relu, MatMul+Add, Gemm; the Gemm's weight is Transpose(constant), which fuse
# folds (constant folding reads a weight left on disk)
GRAPH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,16,16] x) => (float[1,10] y) {
  c0 = Conv <pads = [1,1,1,1]> (x, cw0, cb0)
  n0 = BatchNormalization (c0, g0, b0, m0, v0)
  r0 = Relu (n0)
  c1 = Conv <pads = [1,1,1,1]> (r0, cw1, cb1)
  n1 = BatchNormalization (c1, g1, b1, m1, v1)
  r1 = Relu (n1)
  c2 = Conv <pads = [1,1,1,1]> (r1, cw2, cb2)
  n2 = BatchNormalization (c2, g2, b2, m2, v2)
  r2 = Relu (n2)
  p = GlobalAveragePool (r2)
  f = Flatten (p)
  mm = MatMul (f, mw)
  ad = Add (mm, ma)
  ar = Relu (ad)
  gw = Transpose <perm = [1, 0]> (gwt)
  y = Gemm <transB = 1> (ar, gw, gb)
}
"""
CHANNELS = (3, 32, 32, 32)
OPTIONS = {  # small settings: the pass does its work, on 4 samples, in a second or two
    "prune": "prune(ratio=0.3,multiple=1,min_channels=4,cost=latency,samples=4)",
    "int8": "int8(calib_samples=4,eval_samples=2)",
    "dynamic": "dynamic(min_weights=16)",
    "fp16": "fp16(samples=2)",
    "int4": "int4(block_size=16,samples=4)",  # K = 32 ≥ MIN_K and a multiple of the block
    "svd": "svd(force=true,rank=8,measure=false)",
    "cluster": "cluster(k=8)",
}
PASSES = ("fuse", "compact", "prune", "int8", "dynamic", "fp16", "int4", "svd", "cluster")


def _weights(rng) -> list:
    arrays = {}
    for i, (cin, cout) in enumerate(zip(CHANNELS, CHANNELS[1:])):
        arrays[f"cw{i}"] = rng.standard_normal((cout, cin, 3, 3)) * (2 / (9 * cin)) ** 0.5
        arrays[f"cb{i}"] = rng.standard_normal(cout) * 0.1
        arrays[f"g{i}"] = 1 + 0.1 * rng.standard_normal(cout)
        arrays[f"b{i}"] = 0.1 * rng.standard_normal(cout)
        arrays[f"m{i}"] = 0.1 * rng.standard_normal(cout)
        arrays[f"v{i}"] = 1 + 0.1 * rng.random(cout)
    arrays["mw"] = rng.standard_normal((32, 64)) * 0.2
    arrays["ma"] = rng.standard_normal(64) * 0.1
    arrays["gwt"] = rng.standard_normal((64, 10)) * 0.2
    arrays["gb"] = rng.standard_normal(10) * 0.1
    return [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The model, saved with every tensor in ``model.data`` (the conv weights are > 1 KB)."""
    proto = onnx.parser.parse_model(GRAPH)
    proto.graph.initializer.extend(_weights(np.random.default_rng(0)))
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path_factory.mktemp("external") / "model.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.data", size_threshold=0)
    return path


def _state(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _runs(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    return y


def test_every_registered_pass_is_covered():
    built_in = {name for name, cls in available_passes().items()
                if cls.__module__.startswith("onnxslim_kit.passes.")}  # not the test passes other tests register
    assert built_in == set(PASSES)


def test_the_input_keeps_its_weights_on_disk(source):
    assert {p.name for p in source.parent.iterdir()} == {"model.onnx", "model.data"}
    proto = load_proto(source, lazy=True)
    assert has_anchored(proto)
    assert min(4 * int(np.prod(t.dims)) for t in proto.graph.initializer if t.name.startswith("cw")) > 1024


@pytest.mark.parametrize("chain", ["alone", "after_fuse"])
@pytest.mark.parametrize("name", PASSES)
def test_pass_on_external_data(source, tmp_path, name, chain):
    before = _state(source.parent)
    passes = OPTIONS.get(name, name) if chain == "alone" else f"fuse,{OPTIONS.get(name, name)}"
    out = tmp_path / "out.onnx"
    code = main([str(source), "--passes", passes, "-o", str(out), "--num-samples", "4", "--verify-samples", "2", "-q"])
    assert code == 0
    y = _runs(out)
    assert y.shape == (1, 10) and np.all(np.isfinite(y))
    assert _state(source.parent) == before  # same files, same bytes: nothing written beside the input


def test_calibration_sessions_read_weights_left_on_disk(source):
    """int8's calibration session (:class:`SharedWeights`: a folder of its own) and the
    activations every data-driven pass reads, on the model as loaded (all anchored)."""
    from onnxslim_kit.activations import iter_activations
    from onnxslim_kit.passes.int8.fallback import activations

    model = Model.from_proto(load_proto(source, lazy=True))  # as the command line loads it
    proto = model.to_proto()
    assert has_anchored(proto)
    sample = {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(["y"], sample)[0]
    for got in (next(activations(model, ["r1", "y"], [sample])), next(iter_activations(proto, ["r1", "y"], [sample]))):
        np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-6)
        assert got["r1"].shape == (1, 32, 16, 16)


def test_latency_profile_reads_weights_left_on_disk(source):
    from onnxslim_kit.passes.prune.latency import node_times

    proto = Model.from_proto(load_proto(source, lazy=True)).to_proto()
    names = [n.name for n in proto.graph.node]
    times = node_times(proto, {"x": np.zeros((1, 3, 16, 16), np.float32)}, runs=2)
    assert len(times) == len(names) and sum(times) > 0
    assert [n.name for n in proto.graph.node] == names  # the proto is given back as it was


IF_GRAPH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,16] x, bool c) => (float[1,16] y) {
  h = MatMul (x, w)
  y = If (c) <then_branch = t () => (float[1,16] yt) { yt = MatMul (h, wt) },
              else_branch = e () => (float[1,16] ye) { ye = Identity (h) }>
}
"""


def test_map_anchored_gives_main_weights_as_maps_and_embeds_the_rest(tmp_path, rng):
    proto = onnx.parser.parse_model(IF_GRAPH)
    proto.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w"))
    then = proto.graph.node[1].attribute[0].g
    then.initializer.append(numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "wt"))
    onnx.checker.check_model(proto, full_check=True)
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "model.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, location="model.data", size_threshold=0)
    lazy = load_proto(path, lazy=True)
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "stand-in.bin").write_bytes(b"")
    mapped = map_anchored(lazy, "stand-in.bin")
    assert set(mapped) == {"w"} and isinstance(mapped["w"][0], np.memmap)  # the file's pages, not a copy
    assert not has_anchored(lazy)
    so = ort.SessionOptions()
    so.add_session_config_entry(EXTERNAL_FOLDER, str(folder))
    for name, (_, value) in mapped.items():
        so.add_initializer(name, value)
    session = ort.InferenceSession(lazy.SerializeToString(), so, providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 16)).astype(np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c)}
        np.testing.assert_array_equal(session.run(None, feed)[0], reference.run(None, feed)[0])
