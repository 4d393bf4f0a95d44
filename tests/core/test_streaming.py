"""Models whose weights live in external data are streamed: weights stay on disk, read on demand,
written tensor by tensor — with exactly the result of the in-memory path."""

import hashlib
import sys

import numpy as np
import onnx
import pytest
from onnx.external_data_helper import _get_all_tensors, uses_external_data

from onnxslim_kit import optimize
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import Model, load_proto, model_size_bytes, save_proto
from onnxslim_kit.runtime import make_session, run
from onnxslim_kit.streaming import MappedValues, has_anchored, is_anchored

CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 64] x) => (float[2, 32] y) {
  h0 = MatMul (x, W0)
  h1 = Gemm <transB = 1> (h0, W1, B1)
  s = Mul (h1, S)
  h2 = MatMul (s, W2)
  y = Relu (h2)
}
"""


def chain_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    proto = onnx.parser.parse_model(CHAIN)
    weights = {"W0": rng.standard_normal((64, 128)), "W1": rng.standard_normal((96, 128)),
               "B1": rng.standard_normal(96), "S": np.full(96, 0.5), "W2": rng.standard_normal((96, 32))}
    for name, value in weights.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32), name))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def save_external(proto, path):
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    return path


def digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def tensors(path) -> dict:
    proto = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t) for t in _get_all_tensors(proto)}


@pytest.mark.parametrize("passes", ["fuse", "int4", "int4(method=gptq)", "fuse,int4(format=qdq)"])
def test_streamed_run_equals_in_memory_run_bitwise(tmp_path, passes):
    src = tmp_path / "src"
    src.mkdir()
    path = save_external(chain_model(), src / "m.onnx")
    before = digest(src)
    streamed, report_s = optimize(path, passes)  # weights stay on disk
    assert has_anchored(streamed) or "int4" in passes  # unchanged weights are still references
    in_memory, report_m = optimize(onnx.load(str(path)), passes)  # weights loaded into the proto
    assert not has_anchored(in_memory)
    out_s = save_proto(streamed, tmp_path / "s" / "o.onnx")
    out_m = save_proto(in_memory, tmp_path / "m" / "o.onnx", external_data=True)
    assert digest(src) == before  # the input model and its data file untouched
    a, b = onnx.load(str(out_s), load_external_data=False), onnx.load(str(out_m), load_external_data=False)
    assert [(n.op_type, list(n.input), list(n.output)) for n in a.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in b.graph.node]
    ta, tb = tensors(out_s), tensors(out_m)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and np.array_equal(ta[name], tb[name]), name
    assert [p.verification for p in report_s.passes] == [p.verification for p in report_m.passes]
    assert report_s.passes[-1].modified
    assert report_s.after["bytes"] == pytest.approx(report_m.after["bytes"], rel=0.02)  # external bytes counted


def test_lazy_load_keeps_weights_on_disk(tmp_path):
    path = save_external(chain_model(), tmp_path / "m.onnx")
    proto = load_proto(path, lazy=True)
    assert all(is_anchored(t) for t in proto.graph.initializer)
    assert proto.ByteSize() < 2000 < model_size_bytes(proto)  # the bytes are counted, not held
    model = Model.from_proto(proto)
    w0 = next(t for t in model.graph.tensors().values() if t.name == "W0")
    assert isinstance(w0._values, MappedValues)
    values = w0.values  # read on demand: a read-only map of the file
    assert isinstance(values, np.memmap) and not values.flags.writeable
    np.testing.assert_array_equal(values, onnx.numpy_helper.to_array(chain_model().graph.initializer[0]))
    exported = model.to_proto()  # an unchanged weight goes back out as a reference
    assert all(is_anchored(t) for t in exported.graph.initializer)
    assert exported.ByteSize() < 2000


def test_session_maps_anchored_weights_and_matches(tmp_path):
    path = save_external(chain_model(), tmp_path / "m.onnx")
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    lazy = run(make_session(load_proto(path, lazy=True)), x)
    full = run(make_session(load_proto(path)), x)
    np.testing.assert_array_equal(lazy["y"], full["y"])


def test_changed_weight_is_written_not_referenced(tmp_path):
    path = save_external(chain_model(), tmp_path / "m.onnx")
    model = Model.from_proto(load_proto(path, lazy=True))
    s = next(t for t in model.graph.tensors().values() if t.name == "S")
    s.values = np.asarray(s.values) * 2  # a new array: no longer the file's bytes
    proto = model.to_proto()
    by_name = {t.name: t for t in proto.graph.initializer}
    assert not uses_external_data(by_name["S"]) and is_anchored(by_name["W0"])
    out = save_proto(proto, tmp_path / "o" / "o.onnx")
    got = tensors(out)
    np.testing.assert_array_equal(got["S"], np.full(96, 1.0, np.float32))
    np.testing.assert_array_equal(got["W0"], onnx.numpy_helper.to_array(chain_model().graph.initializer[0]))


@pytest.mark.parametrize("damage", ["missing", "truncated", "escapes"])
def test_bad_external_data_is_a_user_error(tmp_path, damage):
    path = save_external(chain_model(), tmp_path / "m.onnx")
    data = tmp_path / "m.onnx.data"
    if damage == "missing":
        data.unlink()
    elif damage == "truncated":
        data.write_bytes(data.read_bytes()[:1000])
    else:
        proto = onnx.load(str(path), load_external_data=False)
        for t in proto.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = "../m.onnx.data"
        onnx.save_model(proto, str(path))
    with pytest.raises(UserError, match="external data"):
        load_proto(path, lazy=True)


def test_original_passes_the_checker_when_lazy(tmp_path):
    path = save_external(chain_model(), tmp_path / "m.onnx")
    _, report = optimize(path, "fuse")
    assert report.original_check is None


@pytest.mark.parametrize("lazy", [False, True])
def test_checker_sees_through_the_weightless_view(tmp_path, lazy):
    from onnxslim_kit.verify import checker_error

    path = save_external(chain_model(), tmp_path / "m.onnx")
    proto = load_proto(path, lazy=lazy)
    assert checker_error(proto) is None
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    w0 = next(t for t in bad.graph.initializer if t.name == "W0")
    w0.data_type = onnx.TensorProto.DOUBLE  # a large weight of the wrong type: strict shape inference fails
    if not lazy:
        w0.raw_data = np.zeros((64, 128)).tobytes()
    assert "B has inconsistent type tensor(double)" in (checker_error(bad) or "")
    del bad.graph.node[0].output[:]  # structure errors too
    assert checker_error(bad) is not None


def test_piecewise_serialization_is_byte_identical(tmp_path):
    import io

    from onnxslim_kit.streaming import proto_size, write_serialized

    proto = chain_model()
    proto.metadata_props.add(key="k", value="v")
    proto.graph.initializer.append(onnx.helper.make_tensor("typed", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]))
    proto.graph.initializer[0].doc_string = "after raw_data"
    proto.graph.value_info.append(onnx.helper.make_tensor_value_info("h0", onnx.TensorProto.FLOAT, [2, 128]))
    for model in (proto, parse_tiny()):
        buf = io.BytesIO()
        write_serialized(model, buf)
        assert buf.getvalue() == model.SerializeToString()
        assert proto_size(model) == model.ByteSize()


def parse_tiny():
    return onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 13]>\ng (float[2] x) => (float[2] y) { y = Relu (x) }')


def test_session_of_an_in_memory_proto_matches_a_serialized_one(monkeypatch):
    import onnxruntime as ort

    from onnxslim_kit import runtime

    proto = chain_model()
    x = {"x": np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)}
    want = ort.InferenceSession(proto.SerializeToString(), runtime.session_options(),
                                providers=["CPUExecutionProvider"]).run(None, x)[0]
    given = []
    real = runtime.ort.InferenceSession
    monkeypatch.setattr(runtime.ort, "InferenceSession", lambda m, *a, **k: given.append(m) or real(m, *a, **k))
    got = run(make_session(proto), x)["y"]
    np.testing.assert_array_equal(got, want)
    assert len(given[0]) < 2000 < proto.ByteSize()  # the weights went through a mapped file


# --- bytes of a constant in pieces (fuse's duplicate-constant check) ---------------------------

DUPLICATES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 64] x) => (float[2, 64] y) {
  a = MatMul (x, W0)
  b = MatMul (x, W1)
  c = MatMul (x, W2)
  s = Add (a, b)
  y = Add (s, c)
}
"""


def duplicates_model() -> onnx.ModelProto:
    """W1 equals W0; W2 differs from them in its last byte only (a piece past the first)."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((64, 64)).astype(np.float32)
    w2 = w0.copy()
    w2.view(np.uint8).reshape(-1)[-1] ^= 1
    proto = onnx.parser.parse_model(DUPLICATES)
    for name, value in (("W0", w0), ("W1", w0.copy()), ("W2", w2)):
        proto.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    return proto


def joined(values, chunk) -> bytes:
    from onnxslim_kit.streaming import value_chunks

    pieces = [bytes(p) for p in value_chunks(values, chunk)]
    assert all(len(p) == chunk for p in pieces[:-1])  # the same cuts whatever the source
    assert len(pieces[-1]) <= chunk
    return b"".join(pieces)


@pytest.mark.parametrize("chunk", [1000, 4096, 1 << 20])
def test_value_chunks_are_the_bytes_of_every_kind_of_values(tmp_path, chunk):
    """A weight left on disk (lazy or its map), an array, lazy values in memory: the same bytes,
    in the same pieces; nothing loaded into the constant."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    proto = duplicates_model()
    want = onnx.numpy_helper.to_array(proto.graph.initializer[0]).tobytes()
    in_memory = Model.from_proto(proto).graph.tensors()["W0"]
    assert type(in_memory._values) is LazyValues
    assert joined(in_memory._values, chunk) == want
    assert type(in_memory._values) is LazyValues  # not loaded
    assert joined(np.array(in_memory.values), chunk) == want
    assert joined(np.asfortranarray(in_memory.values), chunk) == want  # C order whatever the layout
    lazy = Model.from_proto(load_proto(save_external(proto, tmp_path / "m.onnx"), lazy=True)).graph.tensors()["W0"]
    assert isinstance(lazy._values, MappedValues)
    assert joined(lazy._values, chunk) == want
    assert isinstance(lazy._values, MappedValues)
    lazy.values  # now a map of the file: read from the file all the same
    assert joined(lazy._values, chunk) == want
    assert joined(np.zeros(0, np.float32), chunk) == b""


def test_value_chunks_refuse_what_they_cannot_read_as_it_is():
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from onnxslim_kit.streaming import value_chunks

    assert value_chunks(np.array(["a", "b"], dtype=object)) is None
    bf16 = onnx.helper.make_tensor("t", onnx.TensorProto.BFLOAT16, [2], [1.0, 2.0])
    assert value_chunks(LazyValues(bf16)) is None  # loading would cast it to float32


@pytest.mark.parametrize("external", [False, True])
def test_duplicate_merge_reads_weights_without_loading_them(tmp_path, external, monkeypatch):
    """fuse's rule 5 (:mod:`onnxslim_kit.passes.fuse.merges`): W1 merged into W0, W2 (one byte
    apart) kept; every constant still lazy afterwards — weights on disk never mapped into the
    process (the check used to keep every weight's pages resident: +0.95× the model)."""
    from onnxslim_kit.pass_base import PassResult
    from onnxslim_kit.passes._common.match import RuleRun
    from onnxslim_kit.passes.fuse import merges

    monkeypatch.setattr("onnxslim_kit.streaming.READ_CHUNK", 1000)  # several pieces per weight
    proto = duplicates_model()
    if external:
        proto = load_proto(save_external(proto, tmp_path / "m.onnx"), lazy=True)
    model = Model.from_proto(proto)
    kinds = {name: type(t._values) for name, t in model.graph.tensors().items() if name.startswith("W")}
    run_ = RuleRun(model, PassResult())
    assert merges.merge_duplicate_constants(model.graph, run_) == 1
    read = [n.inputs[1].name for n in model.graph.nodes if n.op == "MatMul"]
    assert read == ["W0", "W0", "W2"]
    assert {name: type(model.graph.tensors()[name]._values) for name in ("W0", "W2")} == \
        {name: kinds[name] for name in ("W0", "W2")}
    assert merges.merge_duplicate_constants(model.graph, run_) == 0  # digests cached, nothing left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_release_pages_drops_a_read_weight_from_the_process(tmp_path):
    """A 32 MB weight left on disk, read whole: +32 MB file-backed RSS; released: gone, and the
    values read again the same. Arrays and writable maps are left alone (a copy-on-write page
    dropped would lose its change)."""
    from onnxslim_kit.streaming import release_pages

    def file_rss() -> int:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssFile:"))

    n = 8 << 20
    np.arange(n + 1024, dtype=np.float32).tofile(tmp_path / "w.bin")
    weight = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="r", offset=4096, shape=(n,))
    before = file_rss()
    total = float(weight.sum(dtype=np.float64))
    assert file_rss() - before > 0.75 * weight.nbytes
    assert release_pages(weight)
    assert file_rss() - before < 0.25 * weight.nbytes
    assert float(weight.sum(dtype=np.float64)) == total == float(np.arange(1024, n + 1024, dtype=np.float64).sum())
    assert not release_pages(np.ones(4))
    writable = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="c", shape=(16,))
    writable[0] = -1.0
    assert not release_pages(writable) and writable[0] == -1.0
