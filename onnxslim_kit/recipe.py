"""Replayable reports: what a run needs to be run again, and reading it back (``--recipe``).

The JSON report (:class:`.report.Report`) records

* ``tool``: the versions of onnxslim_kit, onnx, onnxruntime, onnx-graphsurgeon, numpy, python;
* ``seed``, ``argv`` (the command line), ``input_sha256`` (of the input file);
* ``pass_list``: the resolved passes, every option with its value (defaults filled in; a
  value a parse hook made, a selector for instance, as its canonical text);
* ``settings``: input shapes, fixed inputs, sample counts, whether it verified;
  ``rtol``, ``atol`` (per output), ``exclude``;
* ``sources``: the calibration / evaluation data given (a path, or what was given in Python).

:func:`recipe_arguments` turns such a report back into :func:`onnxslim_kit.optimize`
arguments: the same passes and options, seed, shapes, fixed inputs, tolerances and exclusion.
The model and the data paths come from the caller when given, else from the report. With the
same inputs the output file is byte-identical. A different tool version, or an input whose
sha256 differs, is a warning (logged), not an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .errors import UserError
from .version import __version__

logger = logging.getLogger("onnxslim_kit")

DISTRIBUTIONS = {
    "onnxslim_kit": "onnxslim_kit",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnx_graphsurgeon": "onnx-graphsurgeon",
    "numpy": "numpy",
}


def _version(distribution: str) -> str:
    if distribution == "onnxslim_kit":
        return __version__
    try:
        return version(distribution)
    except PackageNotFoundError:
        if distribution == "onnxruntime":  # onnxruntime-gpu and friends
            try:
                import onnxruntime

                return onnxruntime.__version__
            except ImportError:
                pass
        return "not installed"


def tool_versions() -> dict:
    """``{"onnxslim_kit": "0.1.0", "onnx": …, "onnxruntime": …, …, "python": "3.11.9"}``."""
    found = {key: _version(dist) for key, dist in DISTRIBUTIONS.items()}
    found["python"] = platform.python_version()
    return found


def version_line() -> str:
    """``onnxslim_kit X (onnx A, onnxruntime B, onnx-graphsurgeon C, numpy D)`` for ``--version``."""
    v = tool_versions()
    return (f"onnxslim_kit {v['onnxslim_kit']} (onnx {v['onnx']}, onnxruntime {v['onnxruntime']}, "
            f"onnx-graphsurgeon {v['onnx_graphsurgeon']}, numpy {v['numpy']})")


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe_source(source) -> dict | None:
    """What a ``calib=`` / ``eval_data=`` source was, for the report (a path is replayable)."""
    if source is None:
        return None
    if isinstance(source, (str, Path)):
        return {"path": str(source)}
    if callable(getattr(source, "get_next", None)):
        return {"python": f"CalibrationDataReader {type(source).__name__}"}
    if callable(source):
        return {"python": f"function {getattr(source, '__qualname__', type(source).__name__)}"}
    try:
        count = len(source)
    except TypeError:
        return {"python": type(source).__name__}
    return {"python": f"{type(source).__name__} of {count} samples"}


def load(path) -> dict:
    """The report at ``path`` (a UserError when it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"--recipe {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"--recipe {path}: not a JSON report ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("pass_list"), list) or not data["pass_list"]:
        raise UserError(f"--recipe {path}: not an onnxslim_kit report with a pass list (write one with --report)")
    return data


def _warn_versions(recorded: dict, where: str) -> None:
    now = tool_versions()
    changed = [f"{key} {recorded[key]} → {now.get(key)}" for key in sorted(recorded)
               if key != "python" and recorded.get(key) != now.get(key)]
    if changed:
        logger.warning(f"{where}: made with other versions ({', '.join(changed)}); the output may differ")


def _source(given, recorded: dict | None, kind: str, where: str):
    if given is not None:
        return given
    if not recorded:
        return None
    if "path" in recorded:
        return recorded["path"]
    flag = "--calib" if kind == "calibration" else "--eval"
    raise UserError(f"{where}: its {kind} data was given in Python ({recorded.get('python')}); give {flag}")


def recipe_arguments(data: dict, *, model=None, calib=None, eval_data=None, where: str = "--recipe") -> dict:
    """:func:`onnxslim_kit.optimize` keyword arguments (``model`` included) replaying ``data``."""
    _warn_versions(data.get("tool") or {}, where)
    model = model if model is not None else data.get("input_path")
    if model is None:
        raise UserError(f"{where}: the report names no input model; give the model on the command line")
    recorded_hash = data.get("input_sha256")
    if recorded_hash and Path(model).is_file() and file_sha256(model) != recorded_hash:
        logger.warning(f"{where}: {model} is not the input the recipe was made from (sha256 differs)")
    sources = data.get("sources") or {}
    settings = data.get("settings") or {}
    passes = [(item["name"], dict(item.get("options") or {})) for item in data["pass_list"]]
    arguments = {
        "model": model,
        "passes": passes,
        "calib": _source(calib, sources.get("calib"), "calibration", where),
        "eval_data": _source(eval_data, sources.get("eval"), "evaluation", where),
        "seed": int(data.get("seed", 0)),
        "rtol": float(data.get("rtol", 1e-4)),
        "atol": dict(data.get("atol") or {}),
        "exclude": data.get("exclude") or None,
        "target": data.get("target") or None,
        "metric": data.get("metric") or None,
    }
    for key in ("input_shapes", "fixed_inputs", "num_samples", "verify_samples", "verify", "allow_nan"):
        if settings.get(key) is not None:
            arguments[key] = settings[key]
    return arguments
