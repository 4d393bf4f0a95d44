"""Non-finite calibration / evaluation data (issue 15, item 5): a NaN or inf in a float input
is a one-line user error naming the input and the sample, found when the feed is read,
whatever the source (file, folder, list, function, reader; --calib and --eval)."""

import warnings

import numpy as np
import onnx
import pytest
from conftest import parse

import onnxslim_kit
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError

MATMUL = parse("""
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,16] x, int64[1,2] ids) => (float[1,8] y, int64[1,2] z) <float[16,8] w = {""" +
               ", ".join(str((i % 7 - 3) * 0.25) for i in range(128)) + """}> {
  y = MatMul (x, w)
  z = Identity (ids)
}
""")
SPECS = input_specs(MATMUL)


def _samples(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 16)).astype(np.float32), "ids": np.zeros((1, 2), np.int64)}
            for _ in range(n)]


def _stack(samples):
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def _run(args, capsys):
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    return code, [line for line in err.strip().splitlines() if not line.startswith("[onnxslim_kit]")], err


@pytest.mark.parametrize("passes", ["int8", "fuse"])
def test_all_nan_calib_file_is_refused(tmp_path, capsys, passes):
    onnx.save(MATMUL, tmp_path / "m.onnx")
    data = _stack(_samples())
    data["x"][:] = np.nan
    np.savez(tmp_path / "c.npz", **data)
    before = (tmp_path / "m.onnx").read_bytes()
    code, lines, err = _run([tmp_path / "m.onnx", "--passes", passes, "--calib", tmp_path / "c.npz",
                             "-o", tmp_path / "o.onnx", "-q"], capsys)
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert line.startswith("error:") and "c.npz" in line and "sample 0" in line and "'x'" in line
    assert "16 NaN of 16 values" in line and "must not be NaN" in line
    assert not (tmp_path / "o.onnx").exists() and (tmp_path / "m.onnx").read_bytes() == before


def test_one_percent_nan_prints_no_runtime_warning(tmp_path, capsys):
    onnx.save(MATMUL, tmp_path / "m.onnx")
    samples = _samples(25)
    samples[7]["x"][0, 3] = np.nan
    samples[7]["x"][0, 5] = np.inf
    samples[7]["x"][0, 6] = -np.inf
    np.savez(tmp_path / "c.npz", **_stack(samples))  # 4 NaN/inf of 400 values: 1 %
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the test
        code, lines, err = _run([tmp_path / "m.onnx", "--passes", "int8", "--calib", tmp_path / "c.npz",
                                 "-o", tmp_path / "o.onnx", "-q"], capsys)
    assert code == 2 and len(lines) == 1 and "RuntimeWarning" not in err, err
    assert "sample 7" in lines[0] and "1 NaN" in lines[0] and "2 inf" in lines[0] and "of 16 values" in lines[0]
    assert not (tmp_path / "o.onnx").exists()


def test_eval_data_with_inf_is_kept_as_data(tmp_path, capsys):
    # an inf the data holds is data (an attention mask's -inf), not a mistake: kept, logged
    onnx.save(MATMUL, tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", **_stack(_samples()))
    folder = tmp_path / "eval"
    folder.mkdir()
    for i, sample in enumerate(_samples(3, seed=1)):
        if i == 2:
            sample["x"][0, 0] = np.inf
        np.savez(folder / f"s{i}.npz", **sample)
    code, lines, err = _run([tmp_path / "m.onnx", "--calib", tmp_path / "c.npz", "--eval", folder,
                             "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0, err
    assert "holds 1 inf of 16 values (kept" in err and "s2.npz" in err
    assert (tmp_path / "o.onnx").exists()


def test_a_python_list_given_to_optimize():
    samples = _samples(5)
    samples[3]["x"][0, :2] = np.nan
    with pytest.raises(UserError, match=r"calibration sample 3: input 'x' .*2 NaN.*must not be NaN"):
        onnxslim_kit.optimize(MATMUL, "fuse", calib=samples)
    with pytest.raises(UserError, match=r"sample 3: input 'x'"):
        onnxslim_kit.optimize(MATMUL, "fuse", calib=_samples(), eval_data=samples)


class _Reader:
    def __init__(self, samples, rewind):
        self.samples, self.items = samples, list(samples)
        if rewind:
            self.rewind = lambda: setattr(self, "items", list(self.samples))

    def get_next(self):
        return self.items.pop(0) if self.items else None


@pytest.mark.parametrize("rewind", [False, True])
def test_a_reader_with_nan(rewind):
    samples = _samples(3)
    samples[1]["x"][0, 0] = np.nan
    with pytest.raises(UserError, match=r"calibration sample 1: input 'x' .*1 NaN"):
        list(CalibrationFeed(SPECS, _Reader(samples, rewind)))
    with pytest.raises(UserError, match=r"sample 1: input 'x'"):
        onnxslim_kit.optimize(MATMUL, "fuse", calib=_Reader(samples, rewind))


def test_a_function_source_and_a_transform():
    samples = _samples(3)
    samples[2]["x"][0, 1] = np.nan
    with pytest.raises(UserError, match=r"calibration sample 2: input 'x' .*1 NaN"):
        list(CalibrationFeed(SPECS, lambda: iter(samples)))
    with pytest.raises(UserError, match=r"calibration sample 2: input 'x'"):
        CalibrationFeed(SPECS, [(s["x"], 0) for s in samples],
                        transform=lambda t: {"x": t[0], "ids": np.zeros((1, 2), np.int64)})


def test_overflow_in_the_cast_to_float16_is_refused():
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float16[1,4] x) => (float16[1,4] y) { y = Identity (x) }
    """)
    with pytest.raises(UserError, match=r"input 'x' \(float16\).*1 inf of 4 values \(1 from the cast to float16\)"):
        CalibrationFeed(input_specs(model), [{"x": np.array([[1.0, 2.0, 1e6, 3.0]])}])


def test_finite_data_integers_and_generated_data_pass():
    samples = _samples(3)
    assert len(list(CalibrationFeed(SPECS, samples))) == 3
    assert CalibrationFeed(SPECS, None, num_samples=2).count() == 2
    big = [{"x": s["x"], "ids": np.full((1, 2), np.iinfo(np.int64).max)} for s in samples]  # not floats: no check
    assert CalibrationFeed(SPECS, big).count() == 3
    _, report = onnxslim_kit.optimize(MATMUL, "fuse", calib=samples)
    assert report.ok
