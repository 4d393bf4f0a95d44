"""``fp16`` — float32 weights and activations to float16, with automatic mixed precision.

Before / after (``keep_io=true``, the default: the model's inputs and outputs stay float32)::

    x:f32 → Conv(W:f32) → Relu → y:f32   ⇒   x → Cast(f16) → Conv(W:f16) → Relu → Cast(f32) → y

Which nodes run in float16 (:mod:`onnxslim_kit.passes.fp16.plan` has the slot rules):

1. static: nodes whose op schema allows float16 for their float32 type variables, minus
   If/Loop/Scan (bodies compute in float32; their weights are stored as float16 + Cast,
   :mod:`onnxslim_kit.passes.fp16.bodies`, ``bodies=false`` to keep them), custom-domain ops, the default block list (``Range``,
   ``TopK``, ``NonMaxSuppression``, ``RoiAlign``, ``ArgMax/Min``, random generators, ``CumSum``,
   ``Resize``/``Upsample``/``GridSample``, ``Cast``/``CastLike``/``EyeLike``/``ConstantOfShape``;
   ``default_block=false`` drops it), the user's ``block_ops`` (op types separated by ``;``, ``|``
   or ``+``) and ``block_names`` (a regex searched in node names), and shape computations;
2. range, on the calibration data (float32 model, every main-graph tensor observed):
   a node stays float32 when a float tensor it reads or writes (weights included) has
   max|x| > 65504 / 2 (float16 overflow, ×2 headroom for inputs not seen) or lives entirely
   below the smallest normal float16 (0 < max|x| < 2⁻¹⁴: underflow to subnormals/zero);
3. drift, ``target=cos:0.999`` (or ``rel:1e-3`` = max relative error, ``none``): the outputs
   are compared with the original model (``metrics.compare``, worst over the samples), measured
   on a float32 *emulation* that rounds every float16 weight and tensor (Cast f16 → f32 round
   trips; see :func:`._fp16_apply.emulate` for why the real model on CPU would hide drift). When
   the target is missed or a NaN/Inf appears where float32 had none, the float16 nodes are
   ranked by the error they add (relative error of their output minus the largest relative
   error of their inputs, one sample) and the smallest prefix of that ranking that meets
   the target is moved to float32 (binary search; everything float32 reproduces the input
   model, so the search always ends);
4. Casts: a float16 node with at most ``merge_limit`` weight elements moves to float32 when
   that removes Casts (adjacent float32 islands merge); one Cast per tensor and precision.

ONNX Runtime's CPU provider has float16 kernels for few ops (no Conv, Gemm, most
activations on x86): it wraps the others in Casts when the session starts, so on CPU the
model shrinks (≈ 0.5×) but usually gets slower. The report names how many float16 nodes
have no CPU float16 kernel.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import compare, merge
from onnxslim_kit.model import Model, model_size_bytes
from onnxslim_kit.pipeline import Option, Pass, PassResult, register_pass
from onnxslim_kit.runtime import make_session, run

from onnxslim_kit.passes.fp16.apply import apply, emulate
from onnxslim_kit.passes.fp16.plan import CastModel, build_plan, merge_islands
from onnxslim_kit.passes.fp16.bodies import store_body_weights_fp16

FP16_MAX = 65504.0
HEADROOM = 2.0
FP16_MIN_NORMAL = 2.0**-14


@register_pass
class Fp16Pass(Pass):
    name = "fp16"
    summary = "float32 → float16 with automatic mixed precision (overflow/drift fallback), Casts at the edges"
    lossless = False
    options = {
        "keep_io": Option(bool, True, "keep the model's inputs and outputs float32"),
        "block_ops": Option(str, "", "op types kept float32, separated by ';', '|' or '+'"),
        "block_names": Option(str, "", "regex: nodes whose name matches stay float32"),
        "default_block": Option(bool, True, "apply the default block list of ops unsafe in float16"),
        "target": Option(str, "cos:0.999", "drift target vs the original: cos:X, rel:X or none"),
        "samples": Option(int, 8, "calibration samples for ranges and drift"),
        "merge_limit": Option(int, 4096, "max weight elements of a node moved to float32 to save Casts (-1: never)"),
        "bodies": Option(bool, True, "store If/Loop/Scan body weights as float16 + Cast (the bodies compute in float32)"),
    }

    def is_lossless(self, options: dict) -> bool:
        return False

    def run(self, model: Model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        target = _parse_target(opts["target"])
        block_ops = {op for op in re.split(r"[;|+\s]+", opts["block_ops"]) if op}
        try:
            re.compile(opts["block_names"])
        except re.error as exc:
            raise UserError(f"fp16(block_names=...): not a regular expression ({exc})") from None
        size_before = None  # the report's size ratio covers the body weights too
        if opts["bodies"] and len(list(model.all_graphs())) > 1:
            size_before = model_size_bytes(model.to_proto())
            if store_body_weights_fp16(model, result):
                model.commit()
        base = model.to_proto()
        samples = ctx.feed.take(opts["samples"])
        stats = _observe(base, samples)
        dtypes = _dtypes(base, stats)
        plan_args = (dtypes, block_ops, opts["block_names"], opts["default_block"])

        work = Model.from_proto(base)
        infos = build_plan(work.graph, *plan_args)
        for info in infos:
            if info.reason is None:
                info.reason = _range_reason(info, stats)
        half0 = {k for k, info in enumerate(infos) if info.reason is None}
        for info in infos:
            if info.reason is not None:
                result.skip(info.reason)
        if not half0:
            result.notes.append("no node can run in float16")
            if size_before:
                result.metrics["size_ratio"] = round(model_size_bytes(base) / size_before, 4)
            return result

        search = _Search(base, plan_args, opts, samples, ctx.original, target)
        best = search.evaluate(half0)
        dropped = []
        if not best.ok:
            ranked = _rank(best, base, infos, half0, samples[0])
            lo, hi = 0, len(ranked)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                trial = search.evaluate(half0 - set(ranked[:mid]))
                lo, hi = (lo, mid) if trial.ok else (mid, hi)
            dropped = ranked[:hi]
            best = search.evaluate(half0 - set(dropped))
        result.skip("float32 for the drift target / NaN-Inf", len(dropped))
        result.skip("float32 to save Casts (island merge)", len(half0) - len(dropped) - len(best.half))
        if not best.half:
            result.notes.append("every candidate node had to stay float32")
            if size_before:
                result.metrics["size_ratio"] = round(model_size_bytes(base) / size_before, 4)
            return result
        final, casts = search.build(best)
        model.graph = final.graph
        model.commit()
        result.rewrite("node→float16", len(best.half))
        result.rewrite("Cast inserted", casts)
        self._report(result, size_before or model_size_bytes(base), final.to_proto(), best, casts, search, infos)
        return result

    @staticmethod
    def _report(result, bytes_before, proto, best, casts, search, infos) -> None:
        ratio = model_size_bytes(proto) / bytes_before  # external data counted (streamed models)
        no_kernel = _no_cpu_fp16_kernel([infos[k].node.op for k in best.half])
        result.metrics.update(
            size_ratio=round(ratio, 4), casts=casts, nodes_float16=len(best.half),
            cosine_fp16_emulated=best.cosine, max_rel_fp16_emulated=best.max_rel, amp_evaluations=search.count,
        )
        result.notes.append(
            f"file {ratio:.3f}×, {len(best.half)} nodes float16, {casts} Casts; float16 arithmetic "
            f"(emulated) min output cosine {best.cosine:.6f} vs {search.reference_name}"
        )
        if no_kernel:
            top = ", ".join(f"{op}×{n}" for op, n in no_kernel.most_common(6))
            result.notes.append(
                f"{sum(no_kernel.values())} float16 nodes have no float16 kernel in ONNX Runtime's CPU "
                f"provider ({top}): ORT wraps them in Casts, so CPU latency rises; float16 pays off on GPU/NPU"
            )


def _parse_target(text: str):
    text = text.strip().lower()
    if text in ("", "none"):
        return None
    kind, _, value = text.partition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if kind not in ("cos", "rel") or number is None:
        raise UserError(f"fp16(target={text}): expected cos:X, rel:X or none")
    return kind, number


# --- observation ----------------------------------------------------------------------------

def _observe(proto: onnx.ModelProto, samples: list) -> dict:
    """Per tensor: (dtype, max |x| over finite values), over the samples (one at a time)."""
    inputs = {i.name for i in proto.graph.input}
    names = [o for n in proto.graph.node for o in n.output if o and o not in inputs]
    stats = {}
    for s, values in enumerate(iter_activations(proto, names, samples, threads=1)):
        for name, array in list(values.items()) + list(samples[s].items()):
            array = np.asarray(array)
            if array.dtype.kind != "f":
                stats.setdefault(name, (array.dtype, 0.0))
                continue
            finite = np.abs(array[np.isfinite(array)]) if array.size else array
            peak = float(finite.max()) if finite.size else 0.0
            stats[name] = (array.dtype, max(peak, stats.get(name, (None, 0.0))[1]))
    return stats


def _dtypes(proto: onnx.ModelProto, stats: dict) -> dict:
    """Tensor name → numpy dtype: observed at run time, else from ONNX type inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - inference is best effort; the observed dtypes win anyway
        inferred = proto
    dtypes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        elem = v.type.tensor_type.elem_type
        if elem:
            dtypes[v.name] = onnx.helper.tensor_dtype_to_np_dtype(elem)
    dtypes.update({name: dtype for name, (dtype, _) in stats.items()})
    return dtypes


def _range_reason(info, stats: dict) -> str | None:
    node = info.node
    for t in [node.inputs[i] for i in info.ins] + [node.outputs[i] for i in info.outs]:
        if isinstance(t, gs.Constant):
            values = np.asarray(t.values)
            peak = float(np.abs(values[np.isfinite(values)]).max()) if values.size else 0.0
            if peak > FP16_MAX:
                return "weight overflows float16"
            continue
        peak = stats.get(t.name, (None, 0.0))[1]
        if peak * HEADROOM > FP16_MAX:
            return "values overflow float16"
        if 0.0 < peak < FP16_MIN_NORMAL:
            return "values underflow float16"
    return None


# --- drift search ---------------------------------------------------------------------------

class _Trial:
    def __init__(self, half, model, drift):
        self.half, self.model = half, model  # model: the float16-rounding emulation
        self.cosine = min((d.cosine for d in drift.values()), default=1.0)
        self.max_rel = max((d.max_rel for d in drift.values()), default=0.0)
        self.nonfinite = any(d.nonfinite_mismatch for d in drift.values())
        self.ok = False


class _Search:
    """Measures candidate assignments (sets of plan indices in float16) on the emulation."""

    def __init__(self, base, plan_args, opts, samples, original, target):
        self.base, self.plan_args, self.samples, self.target = base, plan_args, samples, target
        self.keep_io, self.merge_limit = opts["keep_io"], opts["merge_limit"]
        self.count = 0
        self.reference = _outputs(original, samples)
        self.reference_name = "the original model"
        if not self._meets(_Trial(set(), None, _drift(self.reference, _outputs(base, samples)))):
            self.reference = _outputs(base, samples)  # earlier lossy passes already miss the target
            self.reference_name = "the input of this pass (earlier passes already miss the target)"
        self.cache = {}

    def _plan(self):
        model = Model.from_proto(self.base)
        return model, build_plan(model.graph, *self.plan_args)

    def evaluate(self, half: set) -> _Trial:
        key = frozenset(half)
        if key not in self.cache:
            self.count += 1
            model, infos = self._plan()
            merged = merge_islands(CastModel(model.graph, infos, self.keep_io), half, self.merge_limit)
            emulate(model, infos, merged, self.keep_io)
            model.commit()
            proto = model.to_proto()
            trial = _Trial(merged, proto, _drift(self.reference, _outputs(proto, self.samples)))
            trial.ok = self._meets(trial)
            self.cache[key] = trial
        return self.cache[key]

    def build(self, trial: _Trial) -> tuple:
        """The real float16 model of ``trial`` and the number of Casts it has."""
        model, infos = self._plan()
        casts = apply(model, infos, trial.half, self.keep_io)
        model.commit()
        return model, casts

    def _meets(self, trial: _Trial) -> bool:
        if trial.nonfinite:
            return False
        if self.target is None:
            return True
        kind, value = self.target
        return trial.cosine >= value if kind == "cos" else trial.max_rel <= value


def _outputs(proto: onnx.ModelProto, samples: list) -> list:
    session = make_session(proto, threads=1)
    return [run(session, s) for s in samples]


def _drift(reference: list, outputs: list) -> dict:
    drift = {}
    for name in reference[0]:
        if name in outputs[0] and np.asarray(reference[0][name]).dtype.kind == "f":
            drift[name] = merge([compare(r[name], o[name]) for r, o in zip(reference, outputs)])
    return drift


def _rank(trial: _Trial, base: onnx.ModelProto, infos: list, half: set, sample: dict) -> list:
    """Float16 plan indices, the ones adding the most relative error first (on ``sample``)."""
    produced = {o for node in trial.model.graph.node for o in node.output}
    names = [o for node in base.graph.node for o in node.output if o in produced]
    first = next(iter_activations(base, names, [sample], threads=1))
    first.update({k: np.asarray(v) for k, v in sample.items()})
    observed = next(iter_activations(trial.model, names, [sample], threads=1))
    observed.update({k: np.asarray(v) for k, v in sample.items()})

    def rel(name):
        if name not in observed or name not in first or np.asarray(first[name]).dtype.kind != "f":
            return 0.0
        a, b = np.asarray(first[name], dtype=np.float64), np.asarray(observed[name], dtype=np.float64)
        if a.shape != b.shape:
            return 0.0
        if not np.all(np.isfinite(b) == np.isfinite(a)):
            return float("inf")
        ok = np.isfinite(a)
        norm = np.linalg.norm(a[ok])
        return float(np.linalg.norm(a[ok] - b[ok]) / norm) if norm > 0 else 0.0

    scores = {}
    for k in half:
        node = infos[k].node
        out_err = max((rel(node.outputs[i].name) for i in infos[k].outs), default=0.0)
        in_err = max((rel(t.name) for t in node.inputs if isinstance(t, gs.Variable) and t.name), default=0.0)
        scores[k] = out_err - in_err if np.isfinite(out_err) else float("inf")
    return sorted(half, key=lambda k: (-scores[k], k))


def _no_cpu_fp16_kernel(ops: list) -> Counter:
    """Ops (with counts) that ONNX Runtime's CPU provider cannot run in float16."""
    try:
        from onnxruntime.capi import _pybind_state
        kernels = _pybind_state.get_all_opkernel_def()
    except Exception:  # noqa: BLE001 - internal API; the note is optional
        return Counter()
    has_fp16 = {k.op_name for k in kernels if k.provider == "CPUExecutionProvider" and k.domain in ("", "ai.onnx")
                and any("tensor(float16)" in types for types in k.type_constraints.values())}
    return Counter(op for op in ops if op not in has_fp16)
