"""onnxslim_kit: compress ONNX models with verified, framework-agnostic graph passes.

Python API::

    import onnxslim_kit
    proto, report = onnxslim_kit.optimize("model.onnx", passes="fuse,prune(ratio=0.3)")
    print(report.table())
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from .calibration import CalibrationFeed, input_specs
from .errors import SlimError, UserError, VerificationError
from .model import Model, load_proto, save_proto
from .pipeline import Option, Pass, PassContext, PassResult, PassSpec, parse_pass_list, register_pass, run_pipeline
from .report import Report
from .specialize import fix_inputs

__version__ = "0.1.0"

__all__ = [
    "optimize", "Model", "Pass", "PassResult", "PassContext", "Option", "register_pass",
    "CalibrationFeed", "Report", "SlimError", "UserError", "VerificationError", "save_proto", "load_proto",
]


def _specs(passes) -> list:
    if isinstance(passes, str):
        return parse_pass_list(passes)
    specs = []
    for item in passes:
        if isinstance(item, str):
            specs.extend(parse_pass_list(item))
        else:
            name, options = item
            specs.append(PassSpec(name, {k: v for k, v in options.items()}))
    return specs


def optimize(
    model,
    passes="fuse",
    *,
    calib=None,
    input_shapes: dict | None = None,
    fixed_inputs: dict | None = None,
    num_samples: int = 8,
    seed: int = 0,
    verify: bool = True,
    strict: bool = False,
    rtol: float = 1e-4,
    verify_samples: int = 4,
    eval_data=None,
    progress=None,
    log=None,
) -> tuple:
    """Run ``passes`` on ``model`` (a path or ModelProto); return ``(ModelProto, Report)``.

    ``passes``: ``"fuse,prune(ratio=0.3)"`` or a list of such strings or ``(name, {option: value})``.
    ``calib``: path (.npz/.npy/folder), a list of ``{input: array}`` dicts, or a callable
    returning an iterable of them; ``None`` generates ``num_samples`` random samples.
    ``eval_data``: the same kinds of source, used only to verify each pass (held-out samples,
    so the drift of a data-driven pass is not measured on the data it was fitted to).
    ``fixed_inputs``: ``{"sr": 16000}`` — those inputs become constants before the passes run
    (:mod:`.specialize`); the result no longer has them, and it is verified against the original
    with the same values.
    """
    if isinstance(model, (str, Path)):
        input_path = str(model)
        proto = load_proto(model, lazy=True)  # weights in external data stay on disk
    elif isinstance(model, onnx.ModelProto):
        input_path = None
        proto = model
    else:
        raise UserError(f"optimize() takes a path or an onnx.ModelProto, not {type(model).__name__}")
    fixed_notes = []
    if fixed_inputs:
        if proto is model:  # the caller's proto is never modified
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
        fixed_notes = fix_inputs(proto, {k: [str(x) for x in np.ravel(v)] for k, v in fixed_inputs.items()})
    specs = input_specs(proto)
    feed = CalibrationFeed(specs, calib, input_shapes, num_samples=num_samples, seed=seed)
    eval_feed = CalibrationFeed(specs, eval_data, input_shapes) if eval_data is not None else None
    kwargs = {}
    if progress is not None:
        kwargs["progress"] = progress
    if log is not None:
        kwargs["log"] = log
    result, report = run_pipeline(
        proto, _specs(passes), feed, verify=verify, strict=strict, rtol=rtol,
        verify_samples=verify_samples, eval_feed=eval_feed, **kwargs,
    )
    report.input_path = input_path
    report.load_notes[:0] = fixed_notes
    return result, report
