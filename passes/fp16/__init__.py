"""``fp16`` — float32 weights and activations to float16, with automatic mixed precision.

Before / after (``keep_io=true``, the default: the model's inputs and outputs stay float32)::

    x:f32 → Conv(W:f32) → Relu → y:f32   ⇒   x → Cast(f16) → Conv(W:f16) → Relu → Cast(f32) → y

Which nodes run in float16 (:mod:`onnxslim_kit.passes.fp16.plan` has the slot rules):

1. static: nodes whose op schema allows float16 for their float32 type variables, minus
   If/Loop/Scan (bodies compute in float32; their weights are stored as float16 + Cast,
   :mod:`onnxslim_kit.passes.fp16.bodies`, ``bodies=false`` to keep them), custom-domain ops, the default block list (``Range``,
   ``TopK``, ``NonMaxSuppression``, ``RoiAlign``, ``ArgMax/Min``, random generators, ``CumSum``,
   ``Resize``/``Upsample``/``GridSample``, ``Cast``/``CastLike``/``EyeLike``/``ConstantOfShape``;
   ``default_block=false`` drops it), the nodes ``exclude`` selects (:mod:`onnxslim_kit.selection`:
   ``op:TYPE``, ``re:REGEX``, ``NAME``, ``first:TYPE:N``, ``last:TYPE:N``, ``all``, separated by
   ``;``; a term matching no node is an error) and those the global ``--exclude`` selects, and
   shape computations;
2. range, on the calibration data (float32 model, every main-graph tensor observed):
   a node stays float32 when a float tensor it reads or writes (weights included) has
   max|x| > 65504 / 2 (float16 overflow, ×2 headroom for inputs not seen) or lives entirely
   below the smallest normal float16 (0 < max|x| < 2⁻¹⁴: underflow to subnormals/zero);
3. drift, judged by the fidelity contract (:mod:`onnxslim_kit.fidelity`): ``target`` empty (the
   default) = the pipeline's ``--target`` and this pass's share of its budget (``fid.allowed``);
   ``target=cos:X`` / ``rel:X`` / ``top1:X`` / ``none`` holds that one instead. A trial's outputs
   on the held-out samples (``fid.samples``; the ranges are observed on the others) are scored
   per output view against the original model (each output on its own scale, each branch of a
   concatenated detector head, the decisions of Softmax/Sigmoid heads), measured on a float32
   *emulation* that rounds every float16 weight and tensor (Cast f16 → f32 round trips; see
   :func:`.apply.emulate` for why the real model on CPU would hide drift). When the budget
   fraction used exceeds the allowed share or a NaN/Inf appears where float32 had none, the
   float16 nodes are ranked by the error they add (relative error of their output minus the
   largest relative error of their inputs, one fit sample) and the smallest prefix of that
   ranking that meets the target is moved to float32 (binary search,
   :mod:`onnxslim_kit.passes.fp16.search`; everything float32 reproduces the input model, so
   the search always ends). Reported: ``target``, ``budget_used``, ``budget_allowed``, the
   per-view figures (``views``) and a note naming the binding view and the judged samples.
   Until issue 18 the default was ``cos:0.999`` of the whole-output worst cosine on the
   calibration samples, stricter than the pipeline's ``cos:0.99``. Measured (``benchmarks/inputs.py``
   data, 32 calibration samples, 8 held out; emulated worst view): ppocrv4_rec, the default and
   ``target=cos:0.999`` both keep all 407 nodes float16 (softmax cosine 0.999791, agreement 1;
   2 % / 21 % of the budget), mtcnn_onet all 24 (dense_5 1−cos 1.3e-06), yolov8n_coco all 231
   (``output0[scores]`` cosine 0.999922, agreement 1; ``[values]`` 1.0): no model needed the
   stricter target's float32 fallback, so the new default changes none of them; with
   ``target=cos:0.9999`` ppocrv4_rec moves 71 nodes to float32 (10 trials, file 0.709×, cosine 0.99990);
4. Casts: a float16 node with at most ``merge_limit`` weight elements moves to float32 when
   that removes Casts (adjacent float32 islands merge); one Cast per tensor and precision.

Memory: the search's trials share one float16 array per weight (computed once, read as
``Cast(fp16(W))`` by each trial's session, and reused by the result) and its cache keeps scores
only (:mod:`onnxslim_kit.passes.fp16.search`). A 279 MB decoder (12 pre-LN layers, external
data), ``fuse,fp16``: peak RSS of the run 1.98 GB → 0.65 GB (the verification after the pass
now sets it; the pass itself peaks at 0.59 GB while observing ranges: the float32 model's file
map and one sample's tensors); with the search forced (``target=cos:0.9999999``, 10 trials)
2.07 GB → 0.58 GB.

ONNX Runtime's CPU provider has float16 kernels for few ops (no Conv, Gemm, most
activations on x86): it wraps the others in Casts when the session starts, so on CPU the
model shrinks (≈ 0.5×) but usually gets slower. The report names how many float16 nodes
have no CPU float16 kernel.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.model import Model, model_size_bytes
from onnxslim_kit.api import Option, Pass, PassResult, check_target, exclusions, pass_fidelity, register_pass
from onnxslim_kit.selection import SYNTAX, Selector

from onnxslim_kit.passes.fp16.bodies import store_body_weights_fp16
from onnxslim_kit.passes.fp16.plan import build_plan
from onnxslim_kit.passes.fp16.search import Search, fallback, read

FP16_MAX = 65504.0
HEADROOM = 2.0
FP16_MIN_NORMAL = 2.0**-14
EXCLUDED = "excluded (exclude=)"
EXCLUDED_GLOBALLY = "excluded (--exclude)"


@dataclass
class _Inputs:
    """What the plan and the search start from: the model as a proto, samples, observations."""

    base: onnx.ModelProto
    samples: list
    stats: dict
    plan_args: tuple
    size_before: int | None  # the model's bytes before body weights were stored float16


@register_pass
class Fp16Pass(Pass):
    name = "fp16"
    summary = "float32 → float16 with automatic mixed precision (overflow/drift fallback), Casts at the edges"
    lossless = False
    options = {
        "keep_io": Option(bool, True, "keep the model's inputs and outputs float32"),
        "exclude": Option(str, "", f"nodes kept float32 (a selector: {SYNTAX}); the global --exclude too", parse=Selector.parse),
        "default_block": Option(bool, True, "apply the default block list of ops unsafe in float16"),
        "target": Option(str, "", "fidelity target (cos:V, top1:V, rel:V, none); default: the pipeline's "
                                  "--target share", parse=check_target),
        "samples": Option(int, 8, "calibration samples the ranges are observed on (the drift is judged on "
                                  "the pipeline's held-out samples)"),
        "merge_limit": Option(int, 4096, "max weight elements of a node moved to float32 to save Casts (-1: never)"),
        "bodies": Option(bool, True, "store If/Loop/Scan body weights as float16 + Cast (the bodies compute in float32)"),
    }
    renamed = {"block_ops": "exclude=op:TYPE (one op:TYPE per op type, separated by ';')",
               "block_names": "exclude=re:REGEX"}

    def is_lossless(self, options: dict) -> bool:
        return False

    def run(self, model: Model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        inputs = _prepare(model, ctx, result)
        work = Model.from_proto(inputs.base)  # the plan's nodes live in its graph
        infos = build_plan(work.graph, *inputs.plan_args)
        half0 = _candidates(infos, inputs.stats, result)
        if not half0:
            return _nothing(result, inputs, "no node can run in float16")
        search = Search(inputs.base, inputs.plan_args, opts, pass_fidelity(ctx))
        best, dropped = fallback(search, inputs.base, infos, half0, inputs.samples[0])
        result.skip("float32 for the drift target / NaN-Inf", len(dropped))
        result.skip("float32 to save Casts (island merge)", len(half0) - len(dropped) - len(best.half))
        if not best.half:
            return _nothing(result, inputs, "every candidate node had to stay float32")
        final, casts = search.build(best)
        model.graph = final.graph
        model.commit()
        result.rewrite("node→float16", len(best.half))
        result.rewrite("Cast inserted", casts)
        self._report(result, inputs.size_before or model_size_bytes(inputs.base), model, best, casts, search, infos)
        return result

    @staticmethod
    def _report(result, bytes_before, model, best, casts, search, infos) -> None:
        # external data counted (streamed models); exported without the weights' bytes (no copy)
        ratio = model_size_bytes(model.to_proto(weights=False)) / bytes_before
        no_kernel = _no_cpu_fp16_kernel([infos[k].node.op for k in best.half])
        result.metrics.update(
            size_ratio=round(ratio, 4), casts=casts, nodes_float16=len(best.half),
            cosine_fp16_emulated=best.cosine, max_rel_fp16_emulated=best.max_rel, amp_evaluations=search.count,
        )
        _report_fidelity(result, search.fid, best.verdict, search)
        result.notes.append(f"file {ratio:.3f}×, {len(best.half)} nodes float16, {casts} Casts")
        if no_kernel:
            top = ", ".join(f"{op}×{n}" for op, n in no_kernel.most_common(6))
            result.notes.append(
                f"{sum(no_kernel.values())} float16 nodes have no float16 kernel in ONNX Runtime's CPU "
                f"provider ({top}): ORT wraps them in Casts, so CPU latency rises; float16 pays off on GPU/NPU"
            )


def _report_fidelity(result: PassResult, fid, verdict, search) -> None:
    """``target``, ``budget_used``, ``budget_allowed``, the per-view figures and the note naming
    the binding view and the judged samples (float16 arithmetic emulated)."""
    result.metrics["target"] = str(fid.target)
    result.metrics["budget_used"] = round(verdict.used, 4)
    result.metrics["budget_allowed"] = round(fid.allowed, 4)
    result.metrics["views"] = [s.to_dict() for s in verdict.scores]
    judged = f"judged on {verdict.samples} {fid.judged_on or 'samples'}"
    if fid.target.metric == "none":
        result.notes.append(f"target none: worst view {verdict.binding} (float16 arithmetic emulated, not bound), "
                            f"{judged}")
        return
    held = "holds" if verdict.met(fid.allowed) else (
        "not made worse (its input already missed this share)" if verdict.met(search.allowed) else "missed")
    result.notes.append(
        f"fidelity {held}: {verdict.binding} binds (float16 arithmetic emulated, vs {search.reference_name}), "
        f"{verdict.used:.0%} of the {fid.target} budget used (allowed {fid.allowed:.0%}), {judged}")


def _prepare(model: Model, ctx, result: PassResult) -> _Inputs:
    """The user's selections (checked first: a selector matching nothing fails before any
    work), body weights stored float16 (``bodies``), the samples and their observations."""
    opts = ctx.options
    excluded = _excluded(model, ctx)
    size_before = None  # the report's size ratio covers the body weights too
    if opts["bodies"] and len(list(model.all_graphs())) > 1:
        size_before = model_size_bytes(model.to_proto())
        if store_body_weights_fp16(model, result):
            model.commit()
    base = model.to_proto()
    samples = ctx.feed.take(opts["samples"])
    stats = _observe(base, samples)
    return _Inputs(base, samples, stats, (_dtypes(base, stats), excluded, opts["default_block"]), size_before)


def _excluded(model: Model, ctx) -> dict:
    """Node name → reason, for the nodes ``exclude=`` (must match) and the global ``--exclude``
    select (:func:`onnxslim_kit.selection.exclusions`). The plan is built on copies of the
    graph, so it speaks of names: unnamed main-graph nodes are named first."""
    own = Selector.coerce(ctx.options["exclude"], "fp16(exclude=...)")
    glob = Selector.coerce(getattr(ctx, "exclude", None), "--exclude")
    if not (own or glob):
        return {}
    for node in model.graph.nodes:
        if not node.name:
            node.name = model.fresh_name(f"fp16/{node.op}")
    chosen = exclusions(model.graph, own, glob, "fp16(exclude=...)", (EXCLUDED, EXCLUDED_GLOBALLY))
    named = [(node.name, chosen[id(node)]) for node in model.graph.nodes if id(node) in chosen]
    out = {name: reason for name, reason in named if reason == EXCLUDED_GLOBALLY}
    for name, reason in named:
        out.setdefault(name, reason)
    return out


def _candidates(infos: list, stats: dict, result: PassResult) -> set:
    """Plan indices that may run in float16 (static and range rules); the others counted."""
    for info in infos:
        if info.reason is None:
            info.reason = _range_reason(info, stats)
    for info in infos:
        if info.reason is not None:
            result.skip(info.reason)
    return {k for k, info in enumerate(infos) if info.reason is None}


def _nothing(result: PassResult, inputs: _Inputs, note: str) -> PassResult:
    """The result when no node becomes float16 (body weights may still have been stored float16)."""
    result.notes.append(note)
    if inputs.size_before:
        result.metrics["size_ratio"] = round(model_size_bytes(inputs.base) / inputs.size_before, 4)
    return result


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
            values = read(t)  # not cached in the graph: one weight's map alive at a time
            peak = float(np.abs(values[np.isfinite(values)]).max()) if values.size else 0.0
            del values
            if peak > FP16_MAX:
                return "weight overflows float16"
            continue
        peak = stats.get(t.name, (None, 0.0))[1]
        if peak * HEADROOM > FP16_MAX:
            return "values overflow float16"
        if 0.0 < peak < FP16_MIN_NORMAL:
            return "values underflow float16"
    return None


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
