"""The ``int8`` pass's speed decision (its step 9): which layers stay float because int8 does not
pay on this machine, whether the whole result does, and how a replay repeats that without timing.

Before the fallback search (:func:`before_search`): with ``speed=layers`` the layers whose int8
kernel is slower than their float op (:func:`~onnxslim_kit.passes.int8.layer_speed.slow_layers`,
timed once per layer kind and machine, cached) are held float; the search then runs with them
float. After it (:func:`whole_model_pays`): with ``speed=layers`` or ``speed=model`` the int8
candidate is timed against float (:func:`~onnxslim_kit.passes.int8.layer_speed.model_ratio`,
cached under both models' sha256) and kept only when its ratio ≤ ``speed_margin``; skipped above
:data:`~onnxslim_kit.passes.int8.layer_speed.MODEL_CHECK_MAX_BYTES` of float layer weights,
where two whole sessions would double the memory.

Replay: the decision is written into the report's pass list (``PassResult.replay``) as
``speed=off, speed_decided=<the slow layers, ';'-separated>`` or ``*`` (the whole model kept
float), so that ``--recipe`` gives the same bytes on any machine with no cache and no timing:
``speed=off`` with ``speed_decided`` holds those layers float at the same step, or keeps the
model float at the same point. The guard's trial model carries its own set of names, so whether
it ran does not change the names of the result.
"""

from __future__ import annotations

from onnxslim_kit.errors import UserError
from onnxslim_kit.passes.int8.layer_speed import (
    MODEL_CHECK_MAX_BYTES,
    default_cache_path,
    layer_weight_bytes,
    model_ratio,
    resolve_speed,
    slow_layers,
)
from onnxslim_kit.passes._quant.qdq import apply_plan

WHOLE = "*"  # speed_decided: the whole model kept float


def resolved_speed(opts: dict) -> str:
    """``layers``, ``model`` or ``off``: the ``speed`` option (``auto`` resolved), or the older
    ``speed_check`` spelling when given."""
    if opts["speed_check"] is not None:
        return "model" if opts["speed_check"] else "off"
    return resolve_speed(opts["speed"])


def before_search(model, plan, fixed: dict, speed: str, ctx, result) -> dict:
    """``{layer: "float"}``: the layers held float for speed (timed, or replayed from
    ``speed_decided`` when ``speed`` is ``off``)."""
    opts = ctx.options
    if speed == "layers":
        return slow_layers(model, plan, {s.name for s in plan.layers} - set(fixed), ctx.feed.take(1)[0], opts, result)
    decided = opts["speed_decided"] if speed == "off" else ""
    return replayed_slow_layers(plan, decided, result) if decided and decided != WHOLE else {}


def kept_float(model, plan, enabled: set, rungs: dict, slow: dict, speed: str, ctx, result) -> bool:
    """True when the whole model stays float for speed (timed, or replayed); records the replay."""
    replayed = speed == "off" and ctx.options["speed_decided"] == WHOLE
    rejected = bool(enabled) and (replayed or speed != "off" and not whole_model_pays(
        model, plan, enabled, rungs, ctx, result))
    if speed != "off":
        result.replay = replay_options(slow, rejected)
    if rejected:
        if replayed:
            result.skip(f"int8 not faster than float (speed_decided={WHOLE}, from a timed run)", len(enabled))
        result.metrics["layers_int8"] = 0
        result.metrics["layers_float"] = len(plan.layers)
    return rejected


def whole_model_pays(model, plan, enabled: set, rungs: dict, ctx, result) -> bool:
    """True when the int8 candidate runs faster than float by the margin
    (:mod:`onnxslim_kit.passes.int8.speed`), or when its layers' float weights exceed
    :data:`MODEL_CHECK_MAX_BYTES` (the note says the check was skipped)."""
    weight_bytes = layer_weight_bytes(model, plan, enabled)
    if weight_bytes > MODEL_CHECK_MAX_BYTES:
        result.notes.append(f"whole-model speed check skipped ({weight_bytes / 2**30:.1f} GB of layer weights: "
                            "two sessions would double the memory); only the per-layer timings decide")
        return True
    trial = model.snapshot()  # its own names: the result's names do not depend on whether this ran
    apply_plan(trial, plan, enabled, fallback=rungs)
    trial.commit()
    ratio, spread, rounds = model_ratio(trial.to_proto(), model.to_proto(), ctx.feed.take(1)[0],
                                        ctx.options["timing_cache"] or default_cache_path())
    result.metrics["speed_ratio"] = round(ratio, 3)
    result.metrics["speed_rounds"] = rounds
    if ratio <= ctx.options["speed_margin"]:
        return True
    result.skip(f"int8 not faster than float here ({ratio:.2f}× its latency): kept float", len(enabled))
    result.notes.append(f"int8 would be {ratio:.2f}× the float latency here (ORT, optimizations on, 1 thread, "
                        f"{rounds} interleaved rounds, spread {spread[0]:.2f}–{spread[1]:.2f}): kept float; "
                        "pass speed=off to force")
    return False


def replay_options(slow: dict, rejected: bool) -> dict:
    """The options a replay runs with to repeat a timed decision: ``speed=off`` and
    ``speed_decided`` = ``*`` (the whole model kept float) or the ``slow`` layers, ';'-separated.
    Empty (the replay times again) when a layer's name holds a ';'."""
    if any(";" in name for name in slow):
        return {}
    return {"speed": "off", "speed_check": None, "speed_decided": WHOLE if rejected else ";".join(sorted(slow))}


def replayed_slow_layers(plan, decided: str, result) -> dict:
    """``{layer: "float"}`` for the layers ``speed_decided`` names (each must be a layer of the plan)."""
    names = [n for n in decided.split(";") if n]
    known = {spec.name for spec in plan.layers}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"int8(speed_decided=...): {unknown[0]!r} is not a layer int8 quantizes here "
                        "(the recipe was made for another model?)")
    result.skip("int8 slower here (speed_decided, from a timed run)", len(names))
    return {name: "float" for name in names}
