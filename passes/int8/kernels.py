"""The int8 search's choice judged as ONNX Runtime runs it: on its fused int8 kernels.

The fallback search (:mod:`.fallback`) scores its trials in sessions on shared in-memory
weights with ORT's graph optimizations off, so a trial runs its Q/DQ graph as float
emulation: DequantizeLinear → float Conv / Gemm → QuantizeLinear. Deployments, ``bench`` and
the pipeline's verification run with optimizations on, where ORT fuses those into QLinearConv /
QGemm / MatMulInteger kernels that accumulate in int32 and requantize once — a different
rounding. Measured on captcha-whisperer's CRNN (``fuse,int8``): logits up to 0.12 apart; the
search read 0.89 of the budget where the written model used 0.92, and after ``prune`` 1.11, a
missed target the search had accepted.

So the chosen configuration ``c`` is built whole and judged at ``opt_level="all"``, giving
``u_k(c)``. When ``u_k(c) > allowed`` the search runs once more with the allowance lowered by
the gap the emulation left,

    allowed' = allowed − (u_k(c) − u_e(c))          (u_e: the search's own reading)

and its choice, over the same ranking of the layers, is judged on the kernels the same way (all
float when allowed' ≤ 0). The result
and its note carry the kernels' figure. Skipped above
:data:`.layer_speed.MODEL_CHECK_MAX_BYTES` of layer weights: a whole export beside the model.

Where a run costs far more than building a session — samples over ``BATCH_BYTES`` of inputs
(:func:`.fallback.large_samples`, detectors at 640² and more) and at most
:data:`TRIAL_KERNELS_MAX_BYTES` of layer weights — the trials themselves run with ORT's
optimizations on (:func:`trials_on_kernels`), so the search judges what deployments run and
the check above is its own last trial. It is faster too: yolov8n_doclaynet at 1024², 2 threads,
every Conv static int8 276 → 128 ms a run, the weights rung's choice 188 → 116 ms; its search
29 → 14 s, the same layers chosen. Their protos carry the weights' bytes (ORT's constant folding
of a weight's DequantizeLinear / the weights rung's Cast → Mul reads the proto, not an array
handed over, :meth:`.fallback.SharedWeights.session`). Small samples stay emulated: a session
with optimizations costs more to build than their runs cost (MiniLM: 8.1 → 10.3 s, +100 MB;
PP-OCRv4 rec and captcha_crnn the same choice in the same time).
"""

from __future__ import annotations

from onnxslim_kit.passes._quant.qdq import RUNGS, apply_plan
from onnxslim_kit.passes.int8.fallback import large_samples, trial_copy
from onnxslim_kit.passes.int8.layer_speed import MODEL_CHECK_MAX_BYTES, layer_weight_bytes
from onnxslim_kit.passes.int8.resident import release

TRIAL_KERNELS_MAX_BYTES = 256 << 20  # layer weights above which trials stay emulated (each trial proto holds a copy)


def trials_on_kernels(model, plan, samples: list) -> bool:
    """Whether the search's trials run on ORT's kernels themselves (module docstring): large
    samples and at most :data:`TRIAL_KERNELS_MAX_BYTES` of layer weights."""
    return large_samples(samples) and layer_weight_bytes(
        model, plan, {spec.name for spec in plan.layers}) <= TRIAL_KERNELS_MAX_BYTES


def on_kernels(model, plan, chosen: dict, score, fixed: dict, scorer, fid, result, search) -> tuple:
    """``(chosen, score)`` of the search (``search(allowed) -> (chosen, score, _)``), judged on
    ORT's int8 kernels and searched once more when they miss ``fid.allowed`` (module docstring)."""
    if scorer.kernels:
        result.notes.append(f"judged on ORT's int8 kernels: {float(score):.0%} of the budget (the search's trials ran them)")
        result.metrics["budget_used_kernels"] = round(float(score), 4)
        return chosen, score
    int8 = _int8(chosen, fixed)
    if not int8 or layer_weight_bytes(model, plan, int8) > MODEL_CHECK_MAX_BYTES:
        return chosen, score
    kernels = kernel_score(model, plan, {**chosen, **fixed}, scorer)
    note = f"judged on ORT's int8 kernels: {float(kernels):.0%} of the budget (the search's emulation: {float(score):.0%})"
    if float(kernels) > fid.allowed + 1e-9:
        tighter = fid.allowed - (float(kernels) - float(score))
        chosen, score = search(tighter)[:2] if tighter > 0 else ({n: "float" for n in chosen}, score)
        kernels = kernel_score(model, plan, {**chosen, **fixed}, scorer) if _int8(chosen, fixed) else score
        note += f"; searched again at {max(tighter, 0.0):.0%} of it: {float(kernels):.0%} on the kernels"
    result.notes.append(note)
    result.metrics["budget_used_kernels"] = round(float(kernels), 4)
    return chosen, kernels if getattr(kernels, "verdict", None) is not None else score


def kernel_score(model, plan, assign: dict, scorer):
    """The budget fraction (:class:`.fallback.Used`) of ``assign`` (``{layer: choice}``) built
    whole and run by ORT with its optimizations on, one sample a run."""
    from onnxslim_kit.runtime import give_back, make_session

    trial = trial_copy(model)
    apply_plan(trial, plan, {n for n, c in assign.items() if c == "int8"},
               fallback={n: c for n, c in assign.items() if c in RUNGS})
    release(model.graph)
    session = make_session(trial.to_proto(), "all", threads=scorer.threads, prepack=False, arena=False)
    del trial
    try:
        return scorer.score_session(session, batch=False)
    finally:
        del session
        give_back()


def _int8(chosen: dict, fixed: dict) -> set:
    return {n for n, c in {**chosen, **fixed}.items() if c == "int8"}
