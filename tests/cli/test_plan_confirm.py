"""``plan``: a latency choice other than ``fuse`` is confirmed in a second run; candidates that
compute the same thing are one candidate."""

import numpy as np
import pytest
import onnx
from onnx import numpy_helper

from onnxslim_kit.plan.candidates import Candidate, content_sha256
from onnxslim_kit.plan.confirm import KEEP, confirm, line
from onnxslim_kit.plan.timing_cache import TimingCache, sha256_bytes

MACHINE = {"provider": "CPUExecutionProvider", "threads": 1, "onnxruntime": "x", "cpu": "test"}


class Executor:
    """Times nothing: returns the ratios it is given, and counts its benchmarks."""

    def __init__(self, fuse_ratio, ratio):
        self.ratios, self.calls = (fuse_ratio, ratio), 0

    def bench(self, model, protos, names, samples, machine, timing):
        self.calls += 1
        assert len(protos) == 2 and names[0] == "fuse"
        return [{"latency_ratio_vs_first": 1.0}] + [{"latency_ratio_vs_first": r} for r in self.ratios]


def _candidate(pipeline):
    return Candidate(pipeline, proto=object(), sha256=f"sha-{pipeline}", size_bytes=10, met=True, used=0.0)


def _confirm(executor, cache, chosen, fuse, reference="orig"):
    return confirm("m.onnx", chosen, fuse, [], MACHINE, cache, reference, {"runs": 3}, executor)


def test_a_choice_the_second_run_confirms_is_kept_and_cached():
    fuse, fp16, cache = _candidate("fuse"), _candidate("fuse,fp16"), TimingCache()
    executor = Executor(fuse_ratio=0.90, ratio=0.80)
    record = _confirm(executor, cache, fp16, fuse)
    assert record["kept"] and not record["cached"] and abs(record["ratio_vs_fuse"] - 0.80 / 0.90) < 1e-12
    again = _confirm(executor, cache, fp16, fuse)
    assert executor.calls == 1 and again["cached"] and again["kept"]
    assert "kept" in line(record) and "fuse,fp16" in line(record)


def test_a_choice_the_second_run_does_not_confirm_goes_back_to_fuse():
    fuse, fp16 = _candidate("fuse"), _candidate("fuse,fp16")
    record = _confirm(Executor(fuse_ratio=0.90, ratio=0.90 * KEEP * 1.01), TimingCache(), fp16, fuse)
    assert not record["kept"] and "fuse chosen" in line(record)


def test_nothing_is_confirmed_for_fuse_and_another_fuse_or_original_is_timed_again():
    fuse, fp16, cache = _candidate("fuse"), _candidate("fuse,fp16"), TimingCache()
    executor = Executor(fuse_ratio=0.90, ratio=0.80)
    assert _confirm(executor, cache, fuse, fuse) is None and executor.calls == 0
    _confirm(executor, cache, fp16, fuse)
    other_fuse = _candidate("fuse")
    other_fuse.sha256 = "sha-another-fuse"
    _confirm(executor, cache, fp16, other_fuse)
    _confirm(executor, cache, fp16, other_fuse, reference="another original")
    assert executor.calls == 3


def test_a_failed_second_run_is_not_a_confirmation():
    class Failing(Executor):
        def bench(self, *args):
            return [{}, {"latency_ratio_vs_first": 0.9}, {"error": "session failed", "latency_ratio_vs_first": None}]

    record = _confirm(Failing(0.9, 0.8), TimingCache(), _candidate("fuse,fp16"), _candidate("fuse"))
    assert record == {"pipeline": "fuse,fp16", "error": "session failed", "kept": False, "instead": "fuse"}


class ChainExecutor:
    """Returns the given second-run ratios, one per model after the original."""

    def __init__(self, ratios):
        self.ratios, self.names = ratios, []

    def bench(self, model, protos, names, samples, machine, timing):
        self.names.append(list(names))
        assert len(protos) == len(self.ratios)
        return [{"latency_ratio_vs_first": 1.0}] + [{"latency_ratio_vs_first": r} for r in self.ratios]


def _timed(pipeline, ratio, size=10):
    candidate = _candidate(pipeline)
    candidate.timing, candidate.size_bytes = {"ratio": ratio}, size
    return candidate


def test_near_candidates_are_timed_again_and_decided_on_both_runs():
    fuse = _timed("fuse", 0.99)
    prune, both, fp16 = _timed("fuse,prune", 0.495, 100), _timed("fuse,prune,int8", 0.486, 101), _timed("fuse,fp16", 0.98)
    executor = ChainExecutor([0.99, 0.517, 0.496])  # the second run: int8 after prune 4 % faster
    record = confirm("m.onnx", prune, fuse, [], MACHINE, TimingCache(), "orig", {"runs": 3}, executor,
                     [fuse, fp16, prune, both])
    assert executor.names == [["fuse", "fuse,prune", "fuse,prune,int8"]]  # fuse,fp16 is not near
    assert not record["kept"] and record["instead"] == "fuse,prune,int8"
    assert record["pooled"]["fuse,prune,int8"] == pytest.approx((0.486 * 0.496) ** 0.5)
    assert "fuse,prune,int8 faster over both runs" in line(record)
    executor = ChainExecutor([0.99, 0.490, 0.496])  # over both runs within 1 %: the smaller file
    record = confirm("m.onnx", prune, fuse, [], MACHINE, TimingCache(), "orig", {}, executor, [fuse, prune, both])
    assert record["kept"] and record["instead"] == "fuse,prune"


def test_a_cached_confirmation_needs_the_same_contenders():
    fuse, prune, both = _timed("fuse", 0.99), _timed("fuse,prune", 0.50), _timed("fuse,prune,int8", 0.60)
    cache = TimingCache()
    first = confirm("m.onnx", prune, fuse, [], MACHINE, cache, "orig", {}, ChainExecutor([0.99, 0.5]), [fuse, prune, both])
    assert first["kept"] and not first["cached"]  # fuse,prune,int8 is 20 % slower: not a contender
    near = _timed("fuse,prune,int8", 0.51)
    executor = ChainExecutor([0.99, 0.5, 0.52])
    again = confirm("m.onnx", prune, fuse, [], MACHINE, cache, "orig", {}, executor, [fuse, prune, near])
    assert not again["cached"] and executor.names  # another set of contenders: timed again
    assert confirm("m.onnx", prune, fuse, [], MACHINE, cache, "orig", {}, executor, [fuse, prune, near])["cached"]


def _weights_model(values, raw: bool) -> onnx.ModelProto:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 2] x) => (float[1, 2] y) { y = MatMul (x, w) }""")
    tensor = numpy_helper.from_array(np.asarray(values, np.float32).reshape(2, 2), "w")
    if not raw:
        tensor = onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [2, 2], list(map(float, values)))
    model.graph.initializer.append(tensor)
    return model


def test_the_same_numbers_in_another_encoding_are_the_same_candidate():
    raw, listed = _weights_model([1, 2, 3, 4], raw=True), _weights_model([1, 2, 3, 4], raw=False)
    assert raw.SerializeToString() != listed.SerializeToString()
    def content(model):
        return content_sha256(model, sha256_bytes(model.SerializeToString()))

    assert content(raw) == content(listed) == sha256_bytes(raw.SerializeToString())
    assert content(_weights_model([1, 2, 3, 5], raw=False)) != content(listed)


def test_plan_goes_back_to_fuse_when_the_second_run_overturns_the_first(tmp_path, monkeypatch):
    from onnxslim_kit.plan import local, plan
    from onnxslim_kit.plan.report import table, to_dict

    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 64] x) => (float[1, 64] y) { y = MatMul (x, w) }""")
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w"))
    path, calib = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(model, path)
    np.savez(calib, x=rng.standard_normal((8, 1, 64)).astype(np.float32))
    runs = iter([[0.90, 0.80], [0.90, 0.95]])  # the first run: dynamic faster; the second: slower than fuse

    def fake_bench(self, model, protos, names, samples, machine, timing):
        return [{"latency_ratio_vs_first": 1.0, "latency_ms": {"median": 1.0}}] + [
            {"latency_ratio_vs_first": r, "latency_ratio_spread": [r, r], "latency_ms": {"median": r}}
            for r in next(runs)]

    monkeypatch.setattr(local.LocalExecutor, "bench", fake_bench)
    result = plan(path, calib=calib, pipelines=["fuse", "fuse,dynamic"], runs=2, warmup=0)
    assert [c.usable for c in result.candidates] == [True, True], [c.to_dict() for c in result.candidates]
    assert result.chosen.pipeline == "fuse" and not result.confirmation["kept"]
    assert result.confirmation["pipeline"] == "fuse,dynamic" and to_dict(result)["confirmation"] == result.confirmation
    assert "fuse chosen" in table(result)
