"""The other tools ("anchors"), each run the way a new user would, in its own child process.

=================  =====================================================================
anchor             what runs in the child
=================  =====================================================================
onnxslim           ``onnxslim.slim(model)`` (OnnxSlim 0.1.98, defaults)
onnxsim            ``onnxsim.simplify(model)`` (0.8.1, defaults; its own check must pass)
onnxoptimizer      ``onnxoptimizer.optimize(model)`` (0.4.2, default fuse-and-eliminate passes,
                   fuse_bn_into_conv among them)
ort_static         ONNX Runtime ``quant_pre_process`` (on failure: noted, then the original is
                   used, as the docs allow), opset raised to 13 when lower (per-channel
                   DequantizeLinear needs it; noted), then ``quantize_static``: QDQ,
                   per-channel int8 weights, uint8 activations, min-max, calibrated on the
                   suite's calibration samples through a ``CalibrationDataReader``
ort_dynamic        ONNX Runtime ``quantize_dynamic`` (defaults: int8 weights)
nncf               NNCF 3.4 ``nncf.quantize(onnx_model, nncf.Dataset(samples))``, ONNX backend
                   (no torch, no openvino), default preset (performance: symmetric
                   activations), ``subset_size`` = every calibration sample; opset raised to
                   13 first when lower (noted)
nncf_mixed         the same with ``preset=QuantizationPreset.MIXED`` (asymmetric activations)
nncf_transformer   the same with ``model_type=ModelType.TRANSFORMER`` (MIXED preset, as NNCF
                   picks for that model type; meant for MiniLM)
=================  =====================================================================

:func:`run_anchor` never raises for a tool's failure: an exception, a crash, a time-out or
a missing package becomes a row with ``error`` set (the last line of the child's error
output). Rows: ``{tool, output, error, notes, wall_seconds, peak_rss_mb, left_files}``.

Wall time and peak memory (:func:`measure`): the command runs as a child process, started
by a minimal wrapper interpreter (≈ 10 MB) that reaps it with ``os.wait4`` — the resource
usage of *that* child alone — and reports ``ru_maxrss`` (KiB on Linux): the tool's peak
resident memory, Python interpreter and imports included (≈ 70–180 MB of baseline for
onnx + onnxruntime; every tool pays it). The wrapper exists because Linux carries the RSS
high-water mark over fork and exec: spawned straight from the (large) suite process, the
tool would be charged the suite's memory. Wall time is ``time.perf_counter`` from spawn to
reap, interpreter start-up and imports included. The child runs in a fresh temporary
working directory; files a tool leaves there are listed (``left_files``).

Child protocol: ``python anchors.py TOOL SRC DST [--calib NPZ]`` writes DST and prints a
JSON list of notes as its last line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ANCHORS = ["onnxslim", "onnxsim", "onnxoptimizer", "ort_static", "ort_dynamic", "nncf", "nncf_mixed",
           "nncf_transformer"]
PACKAGES = {"onnxslim": "onnxslim", "onnxsim": "onnxsim", "onnxoptimizer": "onnxoptimizer",
            "ort_static": "onnxruntime", "ort_dynamic": "onnxruntime", "nncf": "nncf", "nncf_mixed": "nncf",
            "nncf_transformer": "nncf"}
QDQ_MIN_OPSET = 13


# --- measuring a child process ------------------------------------------------------------

# A minimal process between us and the tool: Linux carries the RSS high-water mark over fork
# and exec, so a tool spawned straight from this (large) process would be charged our memory.
_WRAPPER = """\
import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
wall = time.perf_counter() - start
with open(sys.argv[1], "w") as fh:
    json.dump({"maxrss_kb": usage.ru_maxrss, "wall_seconds": wall}, fh)
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def measure(cmd: list, timeout: float = 900.0, cwd: str | None = None) -> dict:
    """Run ``cmd``; return returncode, stdout, stderr, wall_seconds, peak_rss_mb, timed_out.

    The command is started by a small wrapper interpreter that reaps it with ``os.wait4``
    (the resource usage of that one child) and reports its ``ru_maxrss`` and wall time."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.TemporaryDirectory(prefix="measure-") as tmp:
        stats_file = Path(tmp) / "rusage.json"
        proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(stats_file), *map(str, cmd)], stdout=out,
                                stderr=err, cwd=cwd, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
        out.seek(0)
        err.seek(0)
        return {"returncode": proc.returncode, "stdout": out.read(), "stderr": err.read(),
                "wall_seconds": round(stats["wall_seconds"], 3) if stats else None,
                "peak_rss_mb": round(stats["maxrss_kb"] / 1024, 1) if stats else None, "timed_out": timed_out}


def last_error_line(text: str) -> str:
    """The most telling line of a traceback / error output (the last non-empty one)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "no error output")[:400]


def new_row(tool: str) -> dict:
    return {"tool": tool, "output": None, "error": None, "notes": [], "wall_seconds": None, "peak_rss_mb": None,
            "left_files": []}


def run_tool(row: dict, cmd: list, dst: Path, timeout: float) -> dict:
    """Run a tool's command, measured, in a fresh working directory; fill ``row`` with the
    outcome: wall time, peak RSS, files left behind, the model written or the error."""
    Path(dst).unlink(missing_ok=True)  # never mistake a file of an earlier run for this run's output
    workdir = tempfile.mkdtemp(prefix="slim-tool-")
    try:
        result = measure(cmd, timeout=timeout, cwd=workdir)
        row["left_files"] = sorted(str(p.relative_to(workdir)) for p in Path(workdir).rglob("*") if p.is_file())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    row["wall_seconds"], row["peak_rss_mb"] = result["wall_seconds"], result["peak_rss_mb"]
    if result["timed_out"]:
        row["error"] = f"timed out after {timeout:.0f} s"
    elif result["returncode"] != 0:
        row["error"] = f"exit {result['returncode']}: {last_error_line(result['stderr'] or result['stdout'])}"
    elif not Path(dst).is_file():
        row["error"] = "the tool exited 0 but wrote no model"
    else:
        row["output"] = str(dst)
    row["stdout"] = result["stdout"]
    return row


def run_anchor(tool: str, src: Path, dst: Path, calib: Path | None = None, timeout: float = 900.0) -> dict:
    """Run one anchor on ``src`` in a child process; a row, whatever happens."""
    row = new_row(tool)
    if tool not in ANCHORS:
        row["error"] = f"unknown anchor {tool!r}; anchors: {', '.join(ANCHORS)}"
        return row
    from importlib.util import find_spec

    if find_spec(PACKAGES[tool]) is None:
        row["error"] = f"{PACKAGES[tool]} is not installed (pip install -r benchmarks/requirements.txt)"
        return row
    cmd = [sys.executable, str(Path(__file__).resolve()), tool, str(Path(src).resolve()), str(Path(dst).resolve())]
    if calib is not None:
        cmd += ["--calib", str(Path(calib).resolve())]
    run_tool(row, cmd, Path(dst), timeout)
    try:
        row["notes"] = json.loads(row.pop("stdout").strip().splitlines()[-1])
    except (IndexError, ValueError):
        pass
    return row


# --- the tools, as run inside the child ------------------------------------------------------

def _onnxslim(src: Path, dst: Path, calib, notes: list) -> None:
    import onnx
    import onnxslim

    onnx.save(onnxslim.slim(str(src)), str(dst))


def _onnxsim(src: Path, dst: Path, calib, notes: list) -> None:
    import onnx
    import onnxsim

    model, ok = onnxsim.simplify(onnx.load(str(src)))
    if not ok:
        raise RuntimeError("onnxsim: the simplified model failed onnxsim's own check")
    onnx.save(model, str(dst))


def _onnxoptimizer(src: Path, dst: Path, calib, notes: list) -> None:
    import onnx
    import onnxoptimizer

    onnx.save(onnxoptimizer.optimize(onnx.load(str(src))), str(dst))


class NpzReader:
    """CalibrationDataReader over a .npz of stacked samples (key = input name, axis 0 = sample)."""

    def __init__(self, path: Path, input_names: list):
        with np.load(path) as data:
            arrays = {name: data[name] for name in input_names}
        count = len(next(iter(arrays.values())))
        # np.asarray: a 0-d input (silero's sample rate) must stay an array, not a numpy scalar
        self.samples = [{name: np.asarray(arrays[name][i]) for name in input_names} for i in range(count)]
        self.position = 0

    def get_next(self):
        if self.position >= len(self.samples):
            return None
        self.position += 1
        return self.samples[self.position - 1]

    def rewind(self):
        self.position = 0


def _pre_processed(src: Path, tmp: Path, notes: list) -> Path:
    """quant_pre_process as ORT's docs advise; on failure, note why and go on with ``src``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = tmp / "pre.onnx"
    try:
        quant_pre_process(str(src), str(out))
        notes.append("quant_pre_process: ok")
        return out
    except Exception as exc:  # noqa: BLE001 - a tool failure is a note here, not a crash
        reason = f"{type(exc).__name__}: {last_error_line(str(exc))}" if str(exc).strip() else type(exc).__name__
        notes.append(f"quant_pre_process failed ({reason}); quantized without it")
        return src


def _with_opset(path: Path, tmp: Path, notes: list) -> Path:
    import onnx

    model = onnx.load(str(path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= QDQ_MIN_OPSET:
        return path
    converted = onnx.version_converter.convert_version(model, QDQ_MIN_OPSET)
    out = tmp / f"opset{QDQ_MIN_OPSET}.onnx"
    onnx.save(converted, str(out))
    notes.append(f"opset {opset} → {QDQ_MIN_OPSET} first (per-channel QDQ needs it)")
    return out


def _ort_static(src: Path, dst: Path, calib, notes: list) -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if calib is None:
        raise RuntimeError("ort_static needs --calib samples")
    names = [i.name for i in ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).get_inputs()]
    with tempfile.TemporaryDirectory(prefix="ort-static-") as tmp:
        model = _with_opset(_pre_processed(src, Path(tmp), notes), Path(tmp), notes)
        quantize_static(str(model), str(dst), NpzReader(calib, names), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)


def _ort_dynamic(src: Path, dst: Path, calib, notes: list) -> None:
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(str(src), str(dst))


def _nncf(src: Path, dst: Path, calib, notes: list, preset: str | None = None, model_type: str | None = None) -> None:
    """NNCF's post-training quantization on the ONNX backend, every calibration sample used."""
    import nncf
    import onnx
    import onnxruntime as ort

    if calib is None:
        raise RuntimeError("nncf needs --calib samples")
    names = [i.name for i in ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).get_inputs()]
    samples = NpzReader(calib, names).samples
    with tempfile.TemporaryDirectory(prefix="nncf-") as tmp:
        model = onnx.load(str(_with_opset(Path(src), Path(tmp), notes)))
    options = {}
    if preset is not None:
        options["preset"] = getattr(nncf.QuantizationPreset, preset)
    if model_type is not None:
        options["model_type"] = getattr(nncf.ModelType, model_type)
    quantized = nncf.quantize(model, nncf.Dataset(samples), subset_size=len(samples), **options)
    notes.append(f"nncf {nncf.__version__}: {len(samples)} samples"
                 + "".join(f", {k}={v.name}" for k, v in options.items()))
    onnx.save(quantized, str(dst))


def _nncf_mixed(src: Path, dst: Path, calib, notes: list) -> None:
    _nncf(src, dst, calib, notes, preset="MIXED")


def _nncf_transformer(src: Path, dst: Path, calib, notes: list) -> None:
    _nncf(src, dst, calib, notes, model_type="TRANSFORMER")


TOOLS = {"onnxslim": _onnxslim, "onnxsim": _onnxsim, "onnxoptimizer": _onnxoptimizer,
         "ort_static": _ort_static, "ort_dynamic": _ort_dynamic,
         "nncf": _nncf, "nncf_mixed": _nncf_mixed, "nncf_transformer": _nncf_transformer}


def child_main(argv: list) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="run one anchor tool (child process of run_suite.py)")
    parser.add_argument("tool", choices=sorted(TOOLS))
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--calib", type=Path)
    args = parser.parse_args(argv)
    notes: list = []
    try:
        TOOLS[args.tool](args.src, args.dst, args.calib, notes)
    finally:
        print(json.dumps(notes))
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
