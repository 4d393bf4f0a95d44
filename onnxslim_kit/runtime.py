"""ONNX Runtime sessions for verification, calibration and benchmarking.

One place decides how a ModelProto becomes a session: a skeleton proto plus the weights
handed over as arrays (never serialized, any size); graph optimisation level and thread
counts are explicit arguments, never global settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from .streaming import copy_fields, is_anchored, relocate_anchored, tensor_array, tensor_nbytes

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
    """A session for a proto or a file path.

    A proto's large main-graph initializers are not serialized: ORT gets a skeleton proto
    (those tensors as external-data stubs) and the weights as arrays through
    ``add_external_initializers``, which it uses without copying (see :func:`split_weights`).
    Serializing would hold the weights three times at once (Python bytes, ORT's parsed proto,
    ORT's tensors); this holds them once (MiniLM: −170 MB per session).
    """
    so = session_options(opt_level, threads)
    providers = providers or ["CPUExecutionProvider"]
    if isinstance(model, (str, Path)):
        return ort.InferenceSession(str(model), so, providers=providers)
    skeleton, names, arrays, folder = split_weights(model)
    if folder is not None:  # weights left on disk: ORT maps them from their files itself
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    if names:
        so.add_external_initializers(names, values)
    session = ort.InferenceSession(skeleton.SerializeToString(), so, providers=providers)
    session._slim_weights = (arrays, values)  # kept alive with the session (ORT is handed the buffers)
    return session


SPLIT_MIN_BYTES = 1024
_NUMPY_TYPES = {getattr(onnx.TensorProto, n): np.dtype(d) for n, d in (
    ("FLOAT", np.float32), ("FLOAT16", np.float16), ("DOUBLE", np.float64), ("INT8", np.int8),
    ("UINT8", np.uint8), ("INT16", np.int16), ("UINT16", np.uint16), ("INT32", np.int32),
    ("UINT32", np.uint32), ("INT64", np.int64), ("UINT64", np.uint64), ("BOOL", np.bool_))}


def split_weights(proto: onnx.ModelProto) -> tuple:
    """(skeleton, names, arrays, folder): a copy of ``proto`` whose large in-memory main-graph
    initializers are in-memory external-data stubs, their names and values; tensors left on
    disk (anchored, :mod:`onnxslim_kit.streaming`) keep pointing at their files, relative to
    ``folder`` (None when there are none), for ORT to map.

    The skeleton is built field by field, never copying the initializers it replaces.
    Initializers that are also graph inputs (overridable at run time), and types numpy cannot
    hold exactly, are copied as they are.
    """
    skeleton = onnx.ModelProto()
    copy_fields(proto, skeleton, skip=("graph",))
    copy_fields(proto.graph, skeleton.graph, skip=("initializer",))
    inputs = {i.name for i in proto.graph.input}
    names, arrays = [], []
    for init in proto.graph.initializer:
        dtype = _NUMPY_TYPES.get(init.data_type)
        if is_anchored(init) or dtype is None or init.name in inputs or tensor_nbytes(init) < SPLIT_MIN_BYTES:
            skeleton.graph.initializer.append(init)
            continue
        stub = skeleton.graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        stub.external_data.add(key="location", value="in-memory")
        names.append(init.name)
        arrays.append(tensor_array(init))
    return skeleton, names, arrays, relocate_anchored(skeleton)


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
