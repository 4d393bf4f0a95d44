"""Lossy passes on a model saved with external data hold a bounded number of weight bytes (issue 16).

A chain of ``LAYERS`` MatMuls (weights [K, K] float32, left on disk) goes through ``dynamic``,
``fp16`` and ``int4`` (RTN, with its mixed-precision step and fidelity stop) in one process
under :mod:`tracemalloc`, which sees every numpy array the pipeline allocates (ONNX Runtime's
own memory it does not see). The traced peak must stay within

    new weights of the output  +  SPARE × the largest float weight

— a whole-model float copy (``LAYERS`` weights at once: the int4 emulation's dequantized
weights held as arrays did that) exceeds it. The input's ``.onnx`` and ``.data`` stay
byte-identical. The scratch maps of the int4 emulation are checked directly too.
"""

from __future__ import annotations

import hashlib
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxslim_kit
from onnxslim_kit.streaming import ScratchArrays

LAYERS, K = 16, 512
WEIGHT_BYTES = K * K * 4
SPARE = 4
# bytes per float weight byte of what a pass must hold: the output's new weights (uint8 codes +
# scales; float16; int4 codes, scales and zero points, a few layers 8-bit) — int4 also keeps
# every layer's int4 result (≈ 0.17) until the mixed-precision choice is made. int4: every
# layer's loss measured (measured=16) and a target it cannot meet, so the fidelity stop judges
# the emulation with none and with all the chosen layers at 8 bits.
PASSES = {
    "dynamic": ("dynamic", 0.25),
    "fp16": ("fp16(samples=2)", 0.5),
    "int4": ("int4(method=rtn,block_size=32,max_ratio=0.2,measured=16,target=cos:0.9999999,samples=4)", 0.4),
}


def _chain(path) -> None:
    body = []
    for i in range(LAYERS):
        src = "x" if i == 0 else f"h{i - 1}"
        out = "y" if i == LAYERS - 1 else f"h{i}"
        body.append(f"m{i} = MatMul ({src}, w{i})")
        body.append(f"{out} = Tanh (m{i})")
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,8,{K}] x) => (float[1,8,{K}] y) {{ {chr(10).join(body)} }}""")
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(
        numpy_helper.from_array((rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32), f"w{i}")
        for i in range(LAYERS))
    onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    path = tmp_path_factory.mktemp("chain") / "chain.onnx"
    _chain(path)
    return path


@pytest.mark.parametrize("name", sorted(PASSES))
def test_pass_holds_a_bounded_number_of_weight_bytes(chain, name):
    spec, new_share = PASSES[name]
    data = chain.parent / (chain.name + ".data")
    before = _digest(chain), _digest(data)
    onnxslim_kit.optimize(str(chain), spec, num_samples=8, seed=0)  # imports and caches: not the pass's
    tracemalloc.start()
    try:
        proto, report = onnxslim_kit.optimize(str(chain), spec, num_samples=8, seed=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    entry = report.passes[-1]
    assert entry.modified and entry.verification["status"] in ("ok", "drift")
    bound = new_share * LAYERS * WEIGHT_BYTES + SPARE * WEIGHT_BYTES
    assert LAYERS * WEIGHT_BYTES > bound  # a whole-model float copy would not fit
    assert peak <= bound, f"{name}: traced peak {peak} bytes > {bound:.0f}"
    assert (_digest(chain), _digest(data)) == before


def test_int4_emulation_feeds_file_maps(chain):
    """The mixed-precision emulation's dequantized weights are scratch-file maps, not heap."""
    from onnxslim_kit.model import Model, load_proto
    from onnxslim_kit.fidelity import Fidelity, Target
    from onnxslim_kit.passes.int4.judged import Emulation, emulated
    from onnxslim_kit.passes.int4.promote import ScratchSeen
    from onnxslim_kit.passes.int4.rounds import quantize_all
    from onnxslim_kit.passes.int4.target import collect_targets
    from onnxslim_kit.pipeline import PassResult

    proto = load_proto(chain, lazy=True)
    model = Model.from_proto(proto)
    targets = collect_targets(model, PassResult())
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 8, K)).astype(np.float32)} for _ in range(2)]
    opts = {"method": "rtn", "block_size": 32, "symmetric": False, "search": False, "threads": 1}
    seen = ScratchSeen(ScratchArrays(), set(emulated(targets)))  # the copies made while quantizing
    quantize_all(model, targets, opts, None, PassResult(), visit=seen.visit)
    fid = Fidelity.build(proto, Target.parse("cos:0.99"), samples, "samples")
    tracemalloc.start()
    try:
        emulation = Emulation(model, targets, seen.int4, seen.scratch, fid, "nbits")
        verdicts = [emulation.judge([]), emulation.judge([targets[0].weight.name])]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert all(isinstance(v, np.memmap) for v in emulation.int4.values())
        assert len(emulation.int4) == LAYERS
        assert peak <= SPARE * WEIGHT_BYTES, peak
        # one layer at 8 bits instead of 4 can only bring the outputs closer to the float model's
        assert verdicts[1].worst("cosine") >= verdicts[0].worst("cosine") - 1e-6
    finally:
        emulation.close()
        seen.scratch.close()


def test_scratch_arrays_round_trip(tmp_path):
    scratch = ScratchArrays(tmp_path)
    values = [np.arange(7, dtype=np.float32), np.ones((3, 5), np.float16), np.zeros((0, 4), np.float32)]
    maps = [scratch.put(v) for v in values]
    scratch.release()
    try:
        for value, mapped in zip(values, maps):
            assert mapped.dtype == value.dtype and mapped.shape == value.shape
            np.testing.assert_array_equal(mapped, value)
        assert isinstance(maps[0], np.memmap) and not maps[0].flags.writeable
        assert not list(tmp_path.iterdir())  # unlinked: nothing left in the folder
    finally:
        scratch.close()


FP16_CHAIN = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2,64] x) => (float[2,64] y) {
  c0 = Cast <to = 1> (w0)
  c1 = Cast <to = 1> (w1)
  h = MatMul (x, c0)
  t = Tanh (h)
  y = MatMul (t, c1)
}"""


def _fp16_chain() -> onnx.ModelProto:
    """Two float16 weights read through Casts listed first (as onnx-graphsurgeon's toposort does)."""
    model = onnx.parser.parse_model(FP16_CHAIN)
    rng = np.random.default_rng(2)
    model.graph.initializer.extend(
        numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float16), name) for name in ("w0", "w1"))
    return model


def test_defer_sourceless_puts_each_weight_cast_before_its_reader():
    from onnxslim_kit.runtime import defer_sourceless

    model = _fp16_chain()
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    assert defer_sourceless(moved.graph) == 2
    outputs = [n.output[0] for n in moved.graph.node]
    assert outputs == ["c0", "h", "t", "c1", "y"]
    onnx.checker.check_model(moved, full_check=True)
    x = {"x": np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)}
    import onnxruntime as ort

    runs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
            for m in (model, moved)]
    np.testing.assert_array_equal(*runs)


def test_session_without_prepacking_gives_the_same_values_at_level_all():
    """No pre-packing, no float32 copies of float16 weights, priority order: the same outputs
    as ORT's defaults (float16 → float32 is exact; the order changes no kernel)."""
    from onnxslim_kit.runtime import make_session, run

    model = _fp16_chain()
    x = {"x": np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)}
    plain = make_session(model, "all", threads=1)
    lean = make_session(model, "all", threads=1, prepack=False)
    np.testing.assert_array_equal(run(plain, x)["y"], run(lean, x)["y"])
