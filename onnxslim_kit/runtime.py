"""ONNX Runtime sessions for verification, calibration and benchmarking.

One place decides how a ModelProto becomes a session: in memory when it serializes under
2 GB, through a temporary folder with external data otherwise; graph optimisation level
and thread counts are explicit arguments, never global settings.
"""

from __future__ import annotations

import json
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
# metadata key of models with integer inputs/outputs (int8 pass, io=uint8|int8): JSON
# {"inputs": {name: [scale, zero point]}, "outputs": {name: [scale, zero point]}}
INTEGER_IO_KEY = "onnxslim_kit.integer_io"


def integer_io(session: ort.InferenceSession) -> dict:
    """The integer input/output encodings a model declares (empty for ordinary models)."""
    cached = getattr(session, "_slim_integer_io", None)
    if cached is None:
        text = session.get_modelmeta().custom_metadata_map.get(INTEGER_IO_KEY)
        cached = json.loads(text) if text else {}
        session._slim_integer_io = cached
    return cached


def prepare_feed(session: ort.InferenceSession, sample: dict) -> dict:
    """The feed ``session.run`` accepts for one sample; extra keys in ``sample`` are ignored.

    Float arrays are cast to the float type the session declares for that input (a float16
    model with float16 inputs runs on the same float32 samples as the original). A model
    with integer inputs (``INTEGER_IO_KEY``) gets float samples quantized,
    ``q = clip(round(x / s) + z)``.
    """
    io = integer_io(session)
    feed = {}
    for spec in session.get_inputs():
        if spec.name not in sample:
            continue
        value = sample[spec.name]
        want = _FLOAT_INPUTS.get(spec.type)
        if want is not None and isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.dtype != want:
            value = value.astype(want)
        if spec.name in io.get("inputs", {}) and np.asarray(value).dtype.kind == "f":
            scale, zero = io["inputs"][spec.name]
            dtype = np.uint8 if spec.type == "tensor(uint8)" else np.int8
            info = np.iinfo(dtype)
            value = np.clip(np.round(np.asarray(value, np.float64) / scale) + zero, info.min, info.max).astype(dtype)
        feed[spec.name] = value
    return feed


def run(session: ort.InferenceSession, sample: dict) -> dict:
    """Run one sample (prepared by :func:`prepare_feed`); returns {output name: array}.

    A model with integer outputs (``INTEGER_IO_KEY``) returns them dequantized,
    ``(q − z) · s``, so it compares with the float model on the same samples.
    """
    io = integer_io(session)
    feed = prepare_feed(session, sample)
    outputs = [o.name for o in session.get_outputs()]
    values = dict(zip(outputs, session.run(outputs, feed)))
    for name, (scale, zero) in io.get("outputs", {}).items():
        if name in values:
            values[name] = ((values[name].astype(np.float32) - np.float32(zero)) * np.float32(scale))
    return values
