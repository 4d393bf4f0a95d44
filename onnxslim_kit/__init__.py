"""onnxslim_kit: compress ONNX models with verified, framework-agnostic graph passes.

Python API::

    import onnxslim_kit
    proto, report = onnxslim_kit.optimize("model.onnx", passes="fuse,prune(ratio=0.3)")
    print(report.table())

Pass authors import from :mod:`onnxslim_kit.api`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from .version import __version__

__all__ = [
    "optimize", "Model", "Pass", "PassResult", "PassContext", "Option", "register_pass",
    "CalibrationFeed", "Report", "SlimError", "UserError", "VerificationError", "PassError",
    "save_proto", "load_proto", "__version__",
]

# Imported on first use (PEP 562), so that ``import onnxslim_kit`` — the first thing
# ``python -m onnxslim_kit`` does — is quick, and a Ctrl-C during the heavy imports (numpy, onnx,
# onnxruntime) lands inside the command line's handler: one line, exit 130, no traceback.
_LAZY = {
    "CalibrationFeed": "calibration", "input_specs": "calibration",
    "PassError": "errors", "SlimError": "errors", "UserError": "errors", "VerificationError": "errors",
    "Model": "model", "load_proto": "model", "save_proto": "model",
    "Option": "pipeline", "Pass": "pipeline", "PassContext": "pipeline", "PassResult": "pipeline",
    "PassSpec": "pipeline", "parse_pass_list": "pipeline", "register_pass": "pipeline", "run_pipeline": "pipeline",
    "describe_source": "recipe", "file_sha256": "recipe", "tool_versions": "recipe",
    "Report": "report", "fix_inputs": "specialize",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        try:  # a submodule not imported yet (``onnxslim_kit.calibration``)
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def _specs(passes) -> list:
    from .pipeline import PassSpec, parse_pass_list

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


def _input_hash(model, proto) -> str | None:
    import hashlib

    from .recipe import file_sha256

    if isinstance(model, (str, Path)):
        return file_sha256(model)
    try:
        return hashlib.sha256(proto.SerializeToString()).hexdigest()
    except ValueError:  # over 2 GB in memory: not hashed
        return None


def _check_settings(num_samples, verify_samples, rtol, input_shapes) -> None:
    import math
    from numbers import Integral, Real

    from .errors import UserError

    for name, value in (("num_samples", num_samples), ("verify_samples", verify_samples)):
        if not isinstance(value, Integral) or value < 1:
            raise UserError(f"{name} must be an integer >= 1, not {value!r}")
    if not (isinstance(rtol, Real) and math.isfinite(rtol) and rtol >= 0):
        raise UserError(f"rtol must be a number >= 0, not {rtol!r}")
    for name, dims in (input_shapes or {}).items():
        if any(not isinstance(d, Integral) or d < 1 for d in dims):
            raise UserError(f"input_shapes {name}: {list(dims)}: dimensions must be integers >= 1")


def _nan_settings(allow_nan: bool, passes) -> dict:
    """The feed's NaN settings for ``allow_nan``: kept for lossless passes only — with a lossy
    pass in the list, NaN data is refused naming it (its statistics over NaN would be NaN)."""
    from .pipeline import resolve

    if not allow_nan:
        return {}
    lossy = [instance.name for instance, options in resolve(_specs(passes)) if not instance.is_lossless(options)]
    if not lossy:
        return {"allow_nan": True}
    return {"nan_reason": f"--allow-nan / allow_nan=True is for lossless passes only, and {lossy[0]!r} is lossy "
                          "(a statistic over NaN is NaN); drop the NaN values or the lossy pass"}


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
    atol: dict | None = None,
    exclude=None,
    transform=None,
    verify_samples: int = 4,
    eval_data=None,
    target=None,
    metric=None,
    allow_nan: bool = False,
    progress=None,
    log=None,
) -> tuple:
    """Run ``passes`` on ``model`` (a path or ModelProto); return ``(ModelProto, Report)``.

    ``passes``: ``"fuse,prune(ratio=0.3)"`` or a list of such strings or ``(name, {option: value})``.
    ``calib``: path (.npz/.npy/folder), a list of ``{input: array}`` dicts, a callable
    returning an iterable of them, or an ONNX Runtime ``CalibrationDataReader`` (``get_next()``;
    ``rewind()`` optional); ``None`` generates ``num_samples`` random samples.
    ``transform``: a function applied to every item of ``calib`` and ``eval_data`` (as
    ``nncf.Dataset(data, transform_fn)``), returning the ``{input: array}`` dict.
    ``eval_data``: the same kinds of source, used only to verify each pass (held-out samples,
    so the drift of a data-driven pass is not measured on the data it was fitted to).
    ``fixed_inputs``: ``{"sr": 16000}`` — those inputs become constants before the passes run
    (:mod:`.specialize`); the result no longer has them, and it is verified against the original
    with the same values.
    ``atol``: ``{"output": 1e-3}`` — those outputs are judged lossless by max abs error ≤ atol
    instead of the relative rule (``rtol``).
    ``target``: the fidelity the whole pipeline holds (``"cos:0.99"``, the default; ``"top1:0.99"``,
    ``"rel:1e-3"``, ``"none"``), judged per output view (:mod:`.fidelity`) on samples the passes
    did not fit: without ``eval_data`` one calibration sample in four is held out.
    ``metric``: a function ``(reference, candidate) -> score`` of two lists of output dicts (one
    per judged sample; 1.0 = as the original) or a ``"module:function"`` text: it binds the
    target instead of the built-in views (target ``metric:V``, default ``metric:0.99``).
    ``exclude``: a selector text (``"op:Softmax; re:^head/"``) or a list of them: nodes every
    lossy pass leaves as they are; it must select a node of the input model.
    ``allow_nan``: NaN in ``calib`` / ``eval_data`` is kept as data (a model where NaN is a
    legitimate input value, "missing"); lossless passes are verified with NaN positions compared
    as equal. Refused (one line, when the data holds NaN) if a pass in the list is lossy.
    ``log``: a callable for the progress lines; by default they go to the
    ``logging.getLogger("onnxslim_kit")`` logger (INFO; the library installs no handler).
    """
    import numpy as np
    import onnx

    from .calibration import CalibrationFeed, input_specs
    from .errors import UserError
    from .model import checked_proto, load_proto
    from .pipeline import run_pipeline
    from .recipe import describe_source, tool_versions
    from .specialize import fix_inputs
    _check_settings(num_samples, verify_samples, rtol, input_shapes)
    if isinstance(model, (str, Path)):
        input_path = str(model)
        proto = load_proto(model, lazy=True)  # weights in external data stay on disk
    elif isinstance(model, onnx.ModelProto):
        input_path = None
        proto = checked_proto(model, "the model")  # an old opset upgraded (a copy), as a file's is
    else:
        raise UserError(f"optimize() takes a path or an onnx.ModelProto, not {type(model).__name__}")
    input_hash = _input_hash(model, proto)
    fixed_notes, fixed_texts = [], {k: [str(x) for x in np.ravel(v)] for k, v in (fixed_inputs or {}).items()}
    if fixed_texts:
        if proto is model:  # the caller's proto is never modified
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
        fixed_notes = fix_inputs(proto, fixed_texts)
    specs = input_specs(proto)
    nan = _nan_settings(allow_nan, passes)
    feed = CalibrationFeed(specs, calib, input_shapes, num_samples=num_samples, seed=seed, transform=transform, **nan)
    eval_feed = (CalibrationFeed(specs, eval_data, input_shapes, transform=transform, role="evaluation", **nan)
                 if eval_data is not None else None)
    kwargs = {}
    if progress is not None:
        kwargs["progress"] = progress
    if log is not None:
        kwargs["log"] = log
    result, report = run_pipeline(
        proto, _specs(passes), feed, verify=verify, strict=strict, rtol=rtol, atol=atol, exclude=exclude,
        seed=seed, verify_samples=verify_samples, eval_feed=eval_feed, target=target, metric=metric,
        **kwargs,
    )
    report.input_path = input_path
    report.input_sha256 = input_hash
    report.tool = tool_versions()
    report.settings = {
        "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
        "fixed_inputs": fixed_texts, "num_samples": num_samples, "verify_samples": verify_samples,
        "verify": verify, **({"allow_nan": True} if allow_nan else {}),
    }
    report.sources = {"calib": describe_source(calib), "eval": describe_source(eval_data)}
    report.load_notes[:0] = fixed_notes
    return result, report
