"""Verification of a candidate model against the original.

Two checks, in order:

1. ``onnx.checker.check_model(full_check=True)`` — only required when the original passes it
   too (some exporters write models the checker rejects but ONNX Runtime runs).
2. ONNX Runtime, original vs candidate on the same sample inputs; per output the worst
   :class:`~onnxslim_kit.metrics.Drift` over the samples. The original, and a lossless
   pass's candidate, run with all of ORT's graph optimisations disabled (so its fusions cannot
   hide or cause a difference); a lossy pass's candidate runs as users run it, optimisations
   on (``all``), so an int8 model is judged by the integer kernels ORT fuses it into, not by
   its QDQ graph computed in float (they differed on CPUs whose u8·s8 kernels saturate:
   ``passes/_quant/qdq.py``); weights stored as decoders run unfolded (:func:`_session`). A
   lossless pass must keep every output within ``max|a−b| ≤ 1e-6 + rtol'·max|a|``, or, for an
   output given a per-output absolute tolerance (``--atol OUT:1e-3``, as Polygraphy),
   ``max|a−b| ≤ atol``.
   ``rtol' = max(rtol, 4·eps(dtype))`` for the output's float dtype: a lossless rewrite may
   reorder arithmetic, and every rounding moves a value by up to eps/2 relative — one
   float16 step (2⁻¹⁰ ≈ 9.8e-4) is ten times the default rtol 1e-4, so on float16 outputs
   the bound is four float16 steps (≈ 3.9e-3) at the output's scale; float32's 4·2⁻²³ ≈ 4.8e-7
   leaves the default as it was (:func:`.metrics.dtype_rtol` has the reasoning).

Statuses: ``ok`` (within tolerance), ``drift`` (lossy pass, numbers recorded),
``failed`` (lossless pass beyond tolerance), ``invalid`` (checker or ONNX Runtime rejects the
candidate while accepting the original), ``unverified`` (ONNX Runtime cannot load the
original either, e.g. custom-domain ops: only the checker ran). An original that ONNX Runtime
loads but cannot run on the sample inputs (generated shapes that do not fit, e.g. a dynamic
dimension the graph needs to be 16) is a :class:`UserError` naming ``--input-shape``/``--calib``
— after, for generated data, a bounded search for data it runs on (:func:`fit_generated`).

Generated data that fits (:mod:`.calibration` derives integer values from the graph first:
indices below the axis they index, Reshape / Expand / Slice / axes inputs, split sizes): when
ORT still refuses the samples, the dynamic dimensions (but batch) are tried at other sizes
(:data:`FIT_SIZES`: 256 to 1024 for a sample length a first Conv or a reflect Pad needs, 1 for
a state's batch), each one alone and all together, then constant integer inputs (``1``,
``0``); the first assignment ORT runs becomes the data of the whole run (passes included),
and the report's load notes say which. At most :data:`FIT_TRIES` runs of one sample, none
with more than :data:`FIT_MAX_ELEMENTS` values; when none runs, the message is as before.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np
import onnx

from .errors import UserError
from .metrics import compare, least_precise, merge, within_atol, within_tolerance
from .model import Model, needs_external_data
from .runtime import give_back, make_session, run, weight_decoders
from .streaming import checker_view


def checker_error(proto: onnx.ModelProto, full_check: bool = True) -> str | None:
    """The checker's complaint about ``proto`` (None when it passes); ``full_check``: with its
    strict shape inference.

    It checks a weightless view (:func:`.streaming.checker_view`): the checker serializes and
    parses what it is given, which for the whole model would be two transient copies."""
    if needs_external_data(proto):
        return None  # the checker needs a path for >2 GB models; ORT still runs below
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="slim-check-") as folder:
        try:
            view = checker_view(proto, folder)
            os.chdir(folder)  # the checker resolves external data against the working folder
            onnx.checker.check_model(view, full_check=full_check)
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
    verdict: object = None  # lossy: the :class:`.fidelity.Verdict` per output view

    def to_dict(self) -> dict:
        out = {"status": self.status, "message": self.message, "outputs": self.outputs, "against": self.against}
        if self.verdict is not None:
            out["fidelity"] = self.verdict.to_dict()
        return out

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

    def __init__(self, original: onnx.ModelProto, samples: list, rtol: float = 1e-4, atol: dict | None = None,
                 feed=None, fidelity=None):
        """``feed``: the generated feed ``samples`` came from; when ORT cannot run them, a
        variant it runs is searched for (:func:`fit_generated`) and kept as :attr:`feed`,
        what it changed in :attr:`derived` (None when nothing was searched). ``fidelity``: a
        :class:`.fidelity.Fidelity` whose views and target judge lossy candidates (its
        reference and tail tensors are filled from the original's run here)."""
        self.samples = samples
        self.fidelity, self.runtime = fidelity, None
        self.feed, self.derived = feed, None
        self.rtol = rtol
        self.atol = dict(atol or {})  # output name -> absolute tolerance (instead of rtol)
        self.original_check = checker_error(original)
        self.compute_dtype = lowest_float_dtype(original)
        self.reference, self.runtime_error = None, None
        self.accepted = self._last = None  # outputs of the last accepted / last checked model
        extra = fidelity.views.runtime_tensors if fidelity is not None else []
        try:
            session = _session(original, extra_outputs=extra)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types
            self.runtime_error = _first_line(exc)
            return
        try:
            try:
                self._reference_run(session, samples, original, extra)
            except Exception:  # noqa: BLE001 - ORT raises its own types; a search for data it runs on
                fitted = fit_generated(session, feed, len(samples)) if feed is not None else None
                if fitted is None:
                    raise
                self.feed, self.samples, self.derived = fitted
                self._reference_run(session, self.samples, original, extra)
        except Exception as exc:  # noqa: BLE001
            raise UserError(
                f"ONNX Runtime loads the original model but cannot run it on the sample inputs "
                f"({_shapes(samples)}): {_first_line(exc)}; give the real input shapes with "
                f"--input-shape NAME:D1,D2,... or real data with --calib (or skip verification: --no-verify)"
            ) from None
        finally:
            del session
            give_back()

    def _reference_run(self, session, samples: list, original: onnx.ModelProto, extra: list) -> None:
        results = _run_all(session, samples)
        outputs = {o.name for o in original.graph.output}
        self.reference = self.accepted = [{k: v for k, v in r.items() if k in outputs} for r in results]
        if extra:
            self.runtime = [{k: v for k, v in r.items() if k in extra} for r in results]
        if self.fidelity is not None:
            self.fidelity.samples = samples
            self.fidelity._reference, self.fidelity._runtime = self.reference, self.runtime

    def check(self, candidate: onnx.ModelProto | Model, lossless: bool, fidelity=None) -> Check:
        """``candidate``: a proto, or a :class:`Model` — checked and run without exporting its
        weights (:meth:`Model.session_proto`; no whole-model proto held beside the session).
        ``fidelity``: the pass's own (its target or share) for a lossy candidate's verdict."""
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
            session = _session(candidate, arrays, opt_level="disable" if lossless else "all")
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
            ok = ok and self._within(name, drift, getattr(reference[0][name], "dtype", None))
        self._last = results
        against = "original" if reference is self.reference else "previous"
        check = Check("ok" if ok else "failed" if lossless else "drift", outputs, against=against)
        judged_by = fidelity or self.fidelity
        if not lossless and judged_by is not None:
            check.verdict = judged_by.judge(results, self.reference, self.runtime)
        return check

    def _within(self, name: str, drift, dtype=None) -> bool:
        if name in self.atol:
            return within_atol(drift, self.atol[name])
        return within_tolerance(drift, self.rtol, dtype=least_precise(dtype, self.compute_dtype))

    def accept(self, lossless: bool) -> None:
        """The model last checked was accepted. After a lossy pass later lossless passes are
        compared with it; after a lossless one they keep their reference, so lossless passes
        in a row never drift further from it than the tolerance allows."""
        if self._last is not None and not lossless:
            self.accepted = self._last
        self._last = None


# sizes tried for a dynamic dimension: 1 (a state's batch), a sample length a first Conv /
# reflect Pad / STFT needs; no larger — a sequence of 4096 makes an attention score 4096²
FIT_SIZES = (256, 1, 512, 1024)
FIT_TRIES = 48
FIT_MAX_ELEMENTS = 1 << 22


def _assignments(dims: list, base: dict) -> list:
    """Shape overrides to try, nearest first: all dynamic dimensions at one size, then one
    dimension at a size with the others at another (a long sample axis beside a batch-1 state)."""
    def shapes(values: dict) -> dict:
        out = {name: list(shape) for name, shape in base.items()}
        for (name, axis), size in values.items():
            out[name][axis] = size
        return out

    tries = [shapes({d: size for d in dims}) for size in FIT_SIZES]
    for d in dims:
        for size in FIT_SIZES:
            for rest in (64,) + FIT_SIZES:
                if rest != size and len(dims) > 1:
                    tries.append(shapes({**{o: rest for o in dims}, d: size}))
    return tries


def fit_generated(session, feed, n: int):
    """A bounded search for generated data ORT runs the original on: ``(feed, samples, note)``
    or None. Tries shape assignments of the dynamic dimensions, then constant integer inputs."""
    dims = feed.dynamic_dims()
    base = {s.name: feed.concrete_shape(s) for s in feed.specs}
    ints = [s.name for s in feed.specs if s.dtype.kind in "iu"]
    tries = [(shapes, {}) for shapes in (_assignments(dims, base) if dims else [])]
    tries += [({}, {name: value for name in ints}) for value in (1, 0)] if ints else []
    for shapes, fill in tries[:FIT_TRIES]:
        if sum(int(np.prod(v)) for v in shapes.values()) > FIT_MAX_ELEMENTS:
            continue
        changed = {k: v for k, v in shapes.items() if v != base[k]}
        variant = feed.variant(changed, fill)
        try:
            run(session, variant.take(1)[0])
        except Exception:  # noqa: BLE001 - ORT refuses this one; the next
            continue
        finally:
            give_back()
        what = [f"{k}:{','.join(map(str, v))}" for k, v in changed.items()] + [f"{k}={v}" for k, v in fill.items()]
        return variant, variant.take(n), "generated data derived for ONNX Runtime: " + " ".join(what)
    return None


UNFOLDED_DECODERS = 1 << 24  # bytes of decoder inputs (labels, codebooks) above which they run unfolded


def _session(proto: onnx.ModelProto, arrays: dict | None = None, extra_outputs: list | None = None,
             opt_level: str = "disable"):
    """A verification session: ORT's arena off (it would keep the largest run's intermediates
    until the session goes, and malloc keeps them after; MiniLM: ≈ 50 MB), no packed weight
    copies; at level ``disable`` a Model's ``arrays`` are read where they lie (other levels
    spill them to a temporary file, :func:`.runtime.make_session`). With the
    reference session gone before any candidate's (:class:`Verifier` keeps only its outputs),
    the verification peak is one model's session (``tests/core/test_verify_memory.py``). Weights
    stored as decoders (``cluster``'s look-ups, :func:`.runtime.weight_decoders`) of
    :data:`UNFOLDED_DECODERS` bytes or more are decoded by each run, not folded when the session
    is made: the same values without the folding's peak. Smaller ones are folded, as users run
    them: a Conv whose weight is computed runs on ORT's plain kernel, not its NCHWc one, and
    rounds differently (PP-OCR cls v2's ``fuse,cluster``: max abs 0.003829002 vs 0.003828973)."""
    outputs = {o.name for o in proto.graph.output}
    extra = [n for n in extra_outputs or [] if n not in outputs] or None
    fold = opt_level == "disable" or weight_decoders(proto.graph) < UNFOLDED_DECODERS
    return make_session(proto, opt_level, arena=False, arrays=arrays, extra_outputs=extra, prepack=False, fold=fold)


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


def lowest_float_dtype(proto: onnx.ModelProto):
    """The least precise float type the graph computes in (its initializers, inputs, outputs,
    annotated values and Casts): a float32 output computed in float16 carries float16 rounding,
    so its lossless bound is float16's (``Cast → Conv → BN → Cast`` moved an output by 2e-4
    relative: found by the fuzzer, ``benchmarks/results/fuzz-2026-12-02.md``)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    from .model import proto_graphs

    types = set()
    for graph in proto_graphs(proto.graph):
        types.update(t.data_type for t in graph.initializer)
        for value in list(graph.input) + list(graph.output) + list(graph.value_info):
            if value.type.HasField("tensor_type"):
                types.add(value.type.tensor_type.elem_type)
        for node in graph.node:
            types.update(a.i for a in node.attribute if node.op_type == "Cast" and a.name == "to")
    dtypes = []
    for code in types:
        try:
            dtypes.append(tensor_dtype_to_np_dtype(code))
        except Exception:  # noqa: BLE001 - undefined / string / non-numpy types
            continue
    return least_precise(*dtypes)
