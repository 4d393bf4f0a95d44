"""Verification of a candidate model against the original.

Two checks, in order:

1. ``onnx.checker.check_model(full_check=True)`` — only required when the original passes it
   too (some exporters write models the checker rejects but ONNX Runtime runs).
2. ONNX Runtime, all of its own graph optimisations disabled (so its fusions cannot hide or
   cause a difference), original vs candidate on the same sample inputs; per output the
   worst :class:`~onnxslim_kit.metrics.Drift` over the samples. A lossless pass must keep
   every output within ``max|a−b| ≤ 1e-6 + rtol·max|a|``, or, for an output given a
   per-output absolute tolerance (``--atol OUT:1e-3``, as Polygraphy), ``max|a−b| ≤ atol``.

Statuses: ``ok`` (within tolerance), ``drift`` (lossy pass, numbers recorded),
``failed`` (lossless pass beyond tolerance), ``invalid`` (checker or ONNX Runtime rejects the
candidate while accepting the original), ``unverified`` (ONNX Runtime cannot load the
original either, e.g. custom-domain ops: only the checker ran). An original that ONNX Runtime
loads but cannot run on the sample inputs (generated shapes that do not fit, e.g. a dynamic
dimension the graph needs to be 16) is a :class:`UserError` naming ``--input-shape``/``--calib``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import onnx

from .errors import UserError
from .metrics import compare, merge, within_atol, within_tolerance
from .model import Model, needs_external_data
from .runtime import give_back, make_session, run
from .streaming import checker_view


def checker_error(proto: onnx.ModelProto) -> str | None:
    """The checker's complaint about ``proto`` (None when it passes).

    It checks a weightless view (:func:`.streaming.checker_view`): the checker serializes and
    parses what it is given, which for the whole model would be two transient copies."""
    if needs_external_data(proto):
        return None  # the checker needs a path for >2 GB models; ORT still runs below
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="slim-check-") as folder:
        try:
            view = checker_view(proto, folder)
            os.chdir(folder)  # the checker resolves external data against the working folder
            onnx.checker.check_model(view, full_check=True)
        except Exception as exc:  # noqa: BLE001 - the checker raises several types
            return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        finally:
            os.chdir(cwd)
    return None


@dataclass
class Check:
    status: str
    outputs: dict = field(default_factory=dict)  # output name -> Drift dict
    message: str = ""
    against: str = "original"  # or "previous": the last accepted model, after a lossy pass

    def to_dict(self) -> dict:
        return {"status": self.status, "message": self.message, "outputs": self.outputs,
                "against": self.against}

    def summary(self) -> str:
        if self.message:
            return self.message
        worst = max((d.get("max_rel") or 0.0 for d in self.outputs.values()), default=0.0)
        cos = min((d.get("cosine") for d in self.outputs.values() if d.get("cosine") is not None), default=1.0)
        return f"max rel err {worst:.2e}, min cosine {cos:.6f}"


class Verifier:
    """Holds the original's outputs on the samples; checks candidates against them.

    A lossy candidate is compared with the original (the drift adds up over the passes); a
    lossless one with the model the last lossy pass left (:meth:`accept`; the original when
    none ran): ``fp16,compact`` must show ``compact`` changed nothing, not fail it for the
    drift ``fp16`` already made."""

    def __init__(self, original: onnx.ModelProto, samples: list, rtol: float = 1e-4, atol: dict | None = None):
        self.samples = samples
        self.rtol = rtol
        self.atol = dict(atol or {})  # output name -> absolute tolerance (instead of rtol)
        self.original_check = checker_error(original)
        self.reference, self.runtime_error = None, None
        self.accepted = self._last = None  # outputs of the last accepted / last checked model
        try:
            session = _session(original)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types
            self.runtime_error = _first_line(exc)
            return
        try:
            self.reference = self.accepted = _run_all(session, samples)
        except Exception as exc:  # noqa: BLE001
            raise UserError(
                f"ONNX Runtime loads the original model but cannot run it on the sample inputs "
                f"({_shapes(samples)}): {_first_line(exc)}; give the real input shapes with "
                f"--input-shape NAME:D1,D2,... or real data with --calib (or skip verification: --no-verify)"
            ) from None
        finally:
            del session
            give_back()

    def check(self, candidate: onnx.ModelProto | Model, lossless: bool) -> Check:
        """``candidate``: a proto, or a :class:`Model` — checked and run without exporting its
        weights (:meth:`Model.session_proto`; no whole-model proto held beside the session)."""
        arrays = None
        self._last = None
        if isinstance(candidate, Model):
            candidate, arrays = candidate.session_proto()
        if self.original_check is None:
            problem = checker_error(candidate)
            if problem is not None:
                return Check("invalid", message=f"onnx checker: {problem}")
        if self.reference is None:
            return Check("unverified", message=f"ONNX Runtime cannot run the original: {self.runtime_error}")
        session = None
        try:
            session = _session(candidate, arrays)
            del candidate, arrays
            results = _run_all(session, self.samples)
        except Exception as exc:  # noqa: BLE001
            return Check("invalid", message=f"ONNX Runtime: {_first_line(exc)}")
        finally:
            del session
            give_back()
        outputs, ok = {}, True
        reference = self.accepted if lossless else self.reference
        for name in reference[0]:
            if name not in results[0]:
                return Check("invalid", message=f"output {name!r} disappeared")
            drift = merge([compare(ref[name], res[name]) for ref, res in zip(reference, results)])
            outputs[name] = drift.to_dict()
            ok = ok and self._within(name, drift)
        self._last = results
        against = "original" if reference is self.reference else "previous"
        return Check("ok" if ok else "failed" if lossless else "drift", outputs, against=against)

    def _within(self, name: str, drift) -> bool:
        if name in self.atol:
            return within_atol(drift, self.atol[name])
        return within_tolerance(drift, self.rtol)

    def accept(self, lossless: bool) -> None:
        """The model last checked was accepted. After a lossy pass later lossless passes are
        compared with it; after a lossless one they keep their reference, so lossless passes
        in a row never drift further from it than the tolerance allows."""
        if self._last is not None and not lossless:
            self.accepted = self._last
        self._last = None


def _session(proto: onnx.ModelProto, arrays: dict | None = None):
    """A verification session: ORT's arena off (it would keep the largest run's intermediates
    until the session goes, and malloc keeps them after; MiniLM: ≈ 50 MB)."""
    return make_session(proto, arena=False, arrays=arrays)


def _run_all(session, samples: list) -> list:
    """Each sample's outputs; the run's freed intermediates given back after each."""
    outputs = []
    for sample in samples:
        outputs.append(run(session, sample))
        give_back()
    return outputs


def _shapes(samples: list) -> str:
    first = samples[0] if samples else {}
    return ", ".join(f"{name}:{','.join(map(str, getattr(v, 'shape', ())))}" for name, v in first.items())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
