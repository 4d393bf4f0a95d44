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
"""

from __future__ import annotations

from onnxslim_kit.passes._quant.qdq import RUNGS, apply_plan
from onnxslim_kit.passes.int8.fallback import trial_copy
from onnxslim_kit.passes.int8.layer_speed import MODEL_CHECK_MAX_BYTES, layer_weight_bytes
from onnxslim_kit.passes.int8.resident import release


def on_kernels(model, plan, chosen: dict, score, fixed: dict, scorer, fid, result, search) -> tuple:
    """``(chosen, score)`` of the search (``search(allowed) -> (chosen, score, _)``), judged on
    ORT's int8 kernels and searched once more when they miss ``fid.allowed`` (module docstring)."""
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
