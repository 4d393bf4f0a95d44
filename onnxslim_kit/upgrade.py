"""Models older than the oldest opset this tool handles, upgraded on load when that is lossless.

onnx's own backend test data has 112 PyTorch exports at opset 6 (``pytorch-converted``,
``pytorch-operator``); ``fuse`` and ``compact`` are written against opset 7 and later
(``model.MIN_OPSET``). Such a model M (ai.onnx opset v < 7) is upgraded on load:

1. M' = ``onnx.version_converter.convert_version(M, t)`` for t = 9, then 13 if that fails
   (9 is the first opset past the broadcasting change of 7 and the ``Upsample``/``Pad`` forms
   of 7–10 that 11 rewrites; 13 when the converter has no adapter down there); M' gets the IR
   version its opset needs (``onnx.helper.find_min_ir_version_for``) and passes the checker;
2. M and M' are run by ONNX Runtime (optimisations off) on the same generated samples
   (:class:`.calibration.CalibrationFeed`, seed 0); M' is accepted when every output has the same
   shape and dtype and |y' − y| ≤ 1e-6 + 1e-5·|y| element-wise (NaN where NaN; integer and
   boolean outputs equal). Measured on the wheel's 112 opset-6 models (onnx 1.23, ONNX Runtime
   1.32): 78 upgraded to 9 with bit-identical outputs; ONNX Runtime cannot run the other 34 at
   opset 6 (no kernel for opset-6 Add, Gemm, BatchNormalization, AveragePool…: NOT_IMPLEMENTED),
   so their upgrade cannot be checked and they are refused (``tests/core/test_upgrade.py``).

When the conversion fails, ONNX Runtime cannot run M or M', or the outputs differ, M is kept
and the load is refused with one line naming the reason (:class:`.errors.UserError`, exit 2).
The accepted upgrade travels on the proto as a metadata entry (:data:`NOTE_KEY`) that
:meth:`.model.Model.from_proto` turns into a ``load`` note of the report and never writes out.
"""

from __future__ import annotations

import numpy as np
import onnx

from .errors import UserError

TARGETS = (9, 13)
NOTE_KEY = "onnxslim_kit.load_note"
RTOL, ATOL = 1e-5, 1e-6
SAMPLES = 2


def upgrade(proto: onnx.ModelProto, opset: int, where) -> onnx.ModelProto:
    """``proto`` (ai.onnx ``opset``) upgraded to the first of :data:`TARGETS` that converts and
    gives the same outputs under ONNX Runtime, with a load note; a :class:`UserError` naming
    ``where`` and the reason when none does. ``proto`` itself is not modified."""
    feeds = _samples(proto, where)
    reference = _run(proto, feeds)
    if isinstance(reference, str):
        raise UserError(f"{where}: opset {opset} is older than 7, the oldest this tool handles, and the "
                        f"upgrade cannot be verified: ONNX Runtime cannot run the original ({reference})")
    reasons = []
    for target in TARGETS:
        converted = _convert(proto, target)
        if isinstance(converted, str):
            reasons.append(f"to {target}: {converted}")
            continue
        got = _run(converted, feeds)
        differs = f"ONNX Runtime cannot run it ({got})" if isinstance(got, str) else _differs(reference, got, converted)
        if differs:
            reasons.append(f"to {target}: {differs}")
            continue
        converted.metadata_props.add(
            key=NOTE_KEY, value=f"opset {opset} upgraded to {target} by onnx's version converter "
                                f"(outputs equal under ONNX Runtime on {len(feeds)} samples)")
        return converted
    raise UserError(f"{where}: opset {opset} is older than 7, the oldest this tool handles, and no lossless "
                    f"upgrade was found ({'; '.join(reasons)})")


def pop_note(proto: onnx.ModelProto) -> tuple:
    """(the upgrade's note or None, the other metadata entries as a dict)."""
    note, rest = None, {}
    for prop in proto.metadata_props:
        if prop.key == NOTE_KEY:
            note = prop.value
        else:
            rest[prop.key] = prop.value
    return note, rest


def _convert(proto: onnx.ModelProto, target: int):
    try:
        converted = onnx.version_converter.convert_version(proto, target)
        converted.ir_version = max(converted.ir_version,
                                   onnx.helper.find_min_ir_version_for(list(converted.opset_import), True))
        onnx.checker.check_model(converted)
    except Exception as exc:  # noqa: BLE001 - the converter raises anything (RuntimeError, IndexError…)
        return _short(exc)
    return converted


def _samples(proto: onnx.ModelProto, where) -> list:
    from .calibration import CalibrationFeed, input_specs

    try:
        return CalibrationFeed(input_specs(proto), None, seed=0).take(SAMPLES)
    except UserError as exc:
        raise UserError(f"{where}: an old opset model whose upgrade cannot be verified: {exc}") from None


def _run(proto: onnx.ModelProto, feeds: list):
    """The outputs on every sample, or the reason ONNX Runtime gives for not running it."""
    from .runtime import make_session

    try:  # optimisations off; weights spilled to a file ORT maps, never serialized (any size); no packed copies
        session = make_session(proto, "disable", prepack=False, arena=False)
        names = [i.name for i in session.get_inputs()]
        return [session.run(None, {n: feed[n] for n in names}) for feed in feeds]
    except Exception as exc:  # noqa: BLE001 - ORT's errors are many types; the reason is reported
        return _short(exc)


def _differs(reference: list, got: list, converted: onnx.ModelProto) -> str | None:
    names = [o.name for o in converted.graph.output]
    for before, after in zip(reference, got):
        for name, y, y2 in zip(names, before, after):
            y, y2 = np.asarray(y), np.asarray(y2)
            if y.shape != y2.shape or y.dtype != y2.dtype:
                return f"output {name!r} is {y2.dtype}{list(y2.shape)}, was {y.dtype}{list(y.shape)}"
            if y.dtype.kind in "fc":
                close = np.isclose(y2, y, rtol=RTOL, atol=ATOL, equal_nan=True)
            else:
                close = y2 == y
            if not np.all(close):
                return f"output {name!r} changes ({int(np.size(close) - np.count_nonzero(close))} values)"
    return None


def _short(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[0][:160] if lines else type(exc).__name__)
