"""ONNX Runtime sessions for verification, calibration and benchmarking.

One place decides how a ModelProto becomes a session: in memory when it serializes under
2 GB, through a temporary folder with external data otherwise; graph optimisation level
and thread counts are explicit arguments, never global settings.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from .model import needs_external_data, save_proto

OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(opt_level: str = "disable", threads: int = 0) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[opt_level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # failures reach the user as exceptions, not as ORT log lines
    return so


def make_session(
    model: onnx.ModelProto | str | Path,
    opt_level: str = "disable",
    threads: int = 0,
    providers: list | None = None,
) -> ort.InferenceSession:
    """A session for a proto or a file path (models over 2 GB go through a temp folder)."""
    so = session_options(opt_level, threads)
    providers = providers or ["CPUExecutionProvider"]
    if isinstance(model, (str, Path)):
        return ort.InferenceSession(str(model), so, providers=providers)
    if not needs_external_data(model):
        return ort.InferenceSession(model.SerializeToString(), so, providers=providers)
    with tempfile.TemporaryDirectory(prefix="slim-ort-") as tmp:
        path = save_proto(model, Path(tmp) / "model.onnx", external_data=True)
        return ort.InferenceSession(str(path), so, providers=providers)


_FLOAT_INPUTS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def run(session: ort.InferenceSession, sample: dict) -> dict:
    """Run one sample; returns {output name: array}. Extra keys in ``sample`` are ignored.

    Float arrays are cast to the float type the session declares for that input (a float16
    model with float16 inputs runs on the same float32 samples as the original).
    """
    feed = {}
    for spec in session.get_inputs():
        if spec.name not in sample:
            continue
        value = sample[spec.name]
        want = _FLOAT_INPUTS.get(spec.type)
        if want is not None and isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.dtype != want:
            value = value.astype(want)
        feed[spec.name] = value
    outputs = [o.name for o in session.get_outputs()]
    return dict(zip(outputs, session.run(outputs, feed)))
