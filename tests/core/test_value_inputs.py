"""Inputs that are not float/int tensors (issue 15's last refusals): sequences, optionals and
maps through the feed (generated, from Python, from ``.npz``: ``NAME/0``, ``NAME/1`` …), string
inputs (generated words; ``U`` / ``S`` arrays as ORT's object arrays), and NaN as a legitimate
input value (``allow_nan`` / ``--allow-nan``: lossless passes verified with NaN positions
compared as equal; refused by default and for lossy passes)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import parse, run_ort

import onnxslim_kit
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import compare, within_tolerance
from onnxslim_kit.value_types import SEQUENCE_LENGTH

# a sequence input read by SequenceAt and ConcatFromSequence; the Identity is what fuse removes
SEQ = parse("""
<ir_version: 8, opset_import: ["" : 16]>
g (seq(float[N,3]) s, float[1,3] b) => (float[M,3] cat, float[1,3] first) {
  i = Constant <value = int64 {1}> ()
  t = SequenceAt (s, i)
  r = Relu (t)
  first = Add (r, b)
  c = ConcatFromSequence <axis = 0> (s)
  cat = Identity (c)
}
""")

STRINGS = parse("""
<ir_version: 8, opset_import: ["" : 13, "ai.onnx.ml" : 2]>
g (string[N] s) => (int64[N] y, string[N] same) {
  y = ai.onnx.ml.LabelEncoder <keys_strings = ["cat", "dog", "owl"], values_int64s = [1, 2, 3],
                               default_int64 = -1> (s)
  t = Identity (s)
  same = Identity (t)
}
""")

OPTIONAL = parse("""
<ir_version: 8, opset_import: ["" : 16]>
g (optional(seq(float[2])) o) => (bool has) {
  has = OptionalHasElement (o)
}
""")

MAP = parse("""
<ir_version: 8, opset_import: ["" : 13, "ai.onnx.ml" : 3]>
g (map(string, float) m) => (float[1,3] y) {
  v = ai.onnx.ml.DictVectorizer <string_vocabulary = ["a", "b", "c"]> (m)
  y = Identity (v)
}
""")

# NaN is data here: IsNaN reads it, the two Muls fold into one (fuse modifies, so it is verified)
NAN = parse("""
<ir_version: 8, opset_import: ["" : 13]>
g (float[6] x) => (bool[6] missing, float[6] y) <float[1] two = {2.0}, float[1] half = {0.5}> {
  missing = IsNaN (x)
  a = Mul (x, two)
  y = Mul (a, half)
}
""")


def _verified(report) -> list:
    return [(p.name, (p.verification or {}).get("status")) for p in report.passes if p.modified]


# --- sequences, optionals, maps ---------------------------------------------------------------


def test_sequence_input_spec_and_generated_data():
    s, b = input_specs(SEQ)
    assert s.wrappers == ("sequence",) and s.dtype == np.float32 and s.shape == ("N", 3) and not b.wrappers
    one = CalibrationFeed([s, b], None, num_samples=2, seed=3).take(2)
    again = CalibrationFeed([s, b], None, num_samples=2, seed=3).take(2)
    assert isinstance(one[0]["s"], list) and len(one[0]["s"]) == SEQUENCE_LENGTH
    assert all(e.shape == (1, 3) and e.dtype == np.float32 for e in one[0]["s"])
    np.testing.assert_array_equal(one[1]["s"][1], again[1]["s"][1])  # deterministic
    shaped = CalibrationFeed([s, b], None, {"s": [4, 3]}, num_samples=1).take(1)[0]
    assert [e.shape for e in shaped["s"]] == [(4, 3)] * SEQUENCE_LENGTH


@pytest.mark.parametrize("passes", ["fuse", "fuse,compact"])
def test_sequence_input_through_fuse_and_compact(passes):
    rng = np.random.default_rng(0)
    given = [{"s": [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 5, 1)],
              "b": rng.standard_normal((1, 3)).astype(np.float32)}]
    for calib in (None, given):  # generated data, then the caller's (elements of several lengths)
        result, report = onnxslim_kit.optimize(SEQ, passes, calib=calib)
        assert report.ok and ("fuse", "ok") in _verified(report), report.table()
        onnx.checker.check_model(result, full_check=True)
        assert len(result.graph.node) < len(SEQ.graph.node)
        for got, want in zip(run_ort(result, given[0]), run_ort(SEQ, given[0])):
            np.testing.assert_array_equal(got, want)


def test_sequence_from_npz_keys(tmp_path, capsys):
    rng = np.random.default_rng(1)
    elements = [rng.standard_normal((n, 3)).astype(np.float32) for n in (3, 2)]
    np.savez(tmp_path / "c.npz", **{"s/0": elements[0], "s/1": elements[1]}, b=np.ones((1, 3), np.float32))
    (sample,) = CalibrationFeed(input_specs(SEQ), tmp_path / "c.npz")
    assert len(sample["s"]) == 2
    np.testing.assert_array_equal(sample["s"][1], elements[1])
    onnx.save(SEQ, tmp_path / "m.onnx")
    code = main([str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"), "-o", str(tmp_path / "o.onnx"), "-q"])
    assert code == 0, capsys.readouterr().err
    np.savez(tmp_path / "none.npz", b=np.ones((1, 3), np.float32))
    with pytest.raises(UserError, match=r"none.npz: missing inputs s"):
        CalibrationFeed(input_specs(SEQ), tmp_path / "none.npz")


@pytest.mark.parametrize("value, message", [
    (np.zeros((2, 1, 3), np.float32), r"input 's' is a sequence: give a list of arrays, not ndarray"),
    ([np.zeros((1, 3), np.float32), np.zeros(3, np.float32)], r"input 's' element 1 has rank 1, the model expects 2"),
    ([np.zeros((1, 4), np.float32)], r"input 's' element 0 dimension 1 is 4, the model expects 3"),
    ([np.array([[0, np.nan, 1]], np.float32)], r"input 's' element 0 \(float32\) has 1 NaN of 3 values"),
])
def test_bad_sequence_values_are_one_line_errors(value, message):
    with pytest.raises(UserError, match=message) as info:
        CalibrationFeed(input_specs(SEQ), [{"s": value, "b": np.zeros((1, 3), np.float32)}])
    assert "\n" not in str(info.value)


def test_optional_input_absent_present_and_generated():
    (spec,) = input_specs(OPTIONAL)
    assert spec.wrappers == ("optional", "sequence")
    feed = CalibrationFeed([spec], [{"o": None}, {"o": [np.ones(2, np.float32)]}])
    absent, present = feed.take(2)
    assert absent["o"] is None and len(present["o"]) == 1
    generated = CalibrationFeed([spec], None, num_samples=1).take(1)[0]["o"]
    assert len(generated) == SEQUENCE_LENGTH and generated[0].shape == (2,)
    _, report = onnxslim_kit.optimize(OPTIONAL, "fuse,compact", calib=[{"o": None}])
    assert report.ok


def test_map_input_generated_from_the_vocabulary_and_from_npz(tmp_path):
    (spec,) = input_specs(MAP)
    assert spec.wrappers == ("map",) and spec.key_dtype == np.dtype(object) and spec.dtype == np.float32
    generated = CalibrationFeed([spec], None, num_samples=1).take(1)[0]["m"]
    assert sorted(generated) == ["a", "b", "c"] and all(isinstance(v, float) for v in generated.values())
    result, report = onnxslim_kit.optimize(MAP, "fuse,compact")
    assert report.ok and ("fuse", "ok") in _verified(report), report.table()
    np.savez(tmp_path / "m.npz", **{"m/keys": np.array(["c", "a"]), "m/values": np.array([2.5, -1.0])})
    (sample,) = CalibrationFeed([spec], tmp_path / "m.npz")
    assert sample["m"] == {"c": 2.5, "a": -1.0}
    np.testing.assert_array_equal(run_ort(result, sample)[0], [[-1.0, 0.0, 2.5]])
    with pytest.raises(UserError, match=r"input 'm': key 3 is a int; the map's keys are strings"):
        CalibrationFeed([spec], [{"m": {3: 1.0}}])


# --- strings ---------------------------------------------------------------------------------


def test_string_input_generated_words_need_no_data():
    (spec,) = input_specs(STRINGS)
    assert spec.words == ("cat", "dog", "owl")
    samples = CalibrationFeed([spec], None, {"s": [32]}, num_samples=2, seed=5).take(2)
    assert samples[0]["s"].dtype == object and set(samples[0]["s"]) <= {"cat", "dog", "owl"}
    assert list(samples[1]["s"]) == list(CalibrationFeed([spec], None, {"s": [32]}, num_samples=2, seed=5).take(2)[1]["s"])
    result, report = onnxslim_kit.optimize(STRINGS, "fuse,compact")
    assert report.ok and ("fuse", "ok") in _verified(report), report.table()
    words = np.array(["owl", "emu", "cat"], dtype=object)
    assert run_ort(result, {"s": words})[0].tolist() == [3, -1, 1]


@pytest.mark.parametrize("stored", [np.array(["dog", "cat"]), np.array([b"dog", b"cat"])], ids=["U", "S"])
def test_string_arrays_from_npz_become_object_arrays(tmp_path, stored):
    np.savez(tmp_path / "s.npz", s=stored)
    (sample,) = CalibrationFeed(input_specs(STRINGS), tmp_path / "s.npz")
    assert sample["s"].dtype == object and sample["s"].tolist() == ["dog", "cat"]
    _, report = onnxslim_kit.optimize(STRINGS, "fuse", calib=tmp_path / "s.npz")
    assert report.ok
    np.savez(tmp_path / "bad.npz", s=np.array([b"\xff"]))
    with pytest.raises(UserError, match=r"input 's': bytes that are not UTF-8"):
        CalibrationFeed(input_specs(STRINGS), tmp_path / "bad.npz")


# --- NaN as data -----------------------------------------------------------------------------

X = np.array([1.0, np.nan, -2.0, np.inf, np.nan, 0.5], np.float32)


def test_nan_is_refused_by_default_and_names_the_flag():
    with pytest.raises(UserError, match=r"input 'x' \(float32\) has 2 NaN and 1 inf of 6 values; .*must not be "
                                        r"NaN .*--allow-nan") as info:
        onnxslim_kit.optimize(NAN, "fuse", calib=[{"x": X}])
    assert "\n" not in str(info.value)


def test_allow_nan_verifies_a_lossless_pass_with_nan_positions_equal():
    result, report = onnxslim_kit.optimize(NAN, "fuse", calib=[{"x": X}], allow_nan=True)
    assert _verified(report) == [("fuse", "ok")], report.table()
    assert [n.op_type for n in result.graph.node].count("Mul") == 1
    assert report.settings["allow_nan"] is True
    missing, y = run_ort(result, {"x": X})
    assert missing.tolist() == np.isnan(X).tolist()
    np.testing.assert_array_equal(y, X)  # NaN where X is NaN, inf kept


def test_allow_nan_from_the_command_line_and_lossy_passes_refused(tmp_path, capsys):
    onnx.save(NAN, tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=X)
    base = [str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"), "-o", str(tmp_path / "o.onnx"), "-q"]
    assert main(base + ["--allow-nan"]) == 0, capsys.readouterr().err
    assert (tmp_path / "o.onnx").exists()
    (tmp_path / "o.onnx").unlink()
    code = main(base + ["--allow-nan", "--passes", "fuse,int8"])
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith("[onnxslim_kit]")]
    assert code == 2 and len(lines) == 1, err
    assert "--allow-nan / allow_nan=True is for lossless passes only, and 'int8' is lossy" in lines[0]
    assert not (tmp_path / "o.onnx").exists()


def test_nan_positions_in_the_comparison():
    same = compare(X, X.copy())
    assert not same.nonfinite_mismatch and within_tolerance(same, 1e-4)
    moved = X.copy()
    moved[[1, 2]] = moved[[2, 1]]  # a NaN moved: caught, though every finite value is equal elsewhere
    assert compare(X, moved).nonfinite_mismatch and not within_tolerance(compare(X, moved), 1e-4)
    vanished = np.where(np.isnan(X), 0.0, X).astype(np.float32)
    assert not within_tolerance(compare(X, vanished), 1e-4)


# --- comparing values that are not tensors ---------------------------------------------------


def test_compare_sequences_maps_and_optionals():
    a = [np.ones(3, np.float32), np.arange(5, dtype=np.float32)]  # elements of different lengths
    assert within_tolerance(compare(a, [x.copy() for x in a]), 1e-4)
    off = [a[0], a[1] + np.float32(0.5)]
    assert compare(a, off).max_abs == pytest.approx(0.5) and not within_tolerance(compare(a, off), 1e-4)
    assert compare(a, a[:1]).nonfinite_mismatch  # another length
    assert within_tolerance(compare([], []), 1e-4)
    assert within_tolerance(compare({"a": 1.0, "b": 2.0}, {"b": 2.0, "a": 1.0}), 1e-4)
    assert not within_tolerance(compare({"a": 1.0}, {"a": 1.5}), 1e-4)
    assert compare({"a": 1.0}, {"b": 1.0}).nonfinite_mismatch
    assert within_tolerance(compare(None, None), 1e-4) and compare(None, a).nonfinite_mismatch
