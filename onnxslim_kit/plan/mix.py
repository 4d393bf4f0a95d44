"""Per-layer mixes: dynamic int8 for the MatMul/Gemm layers that tolerate it, float for the rest.

``fuse,dynamic`` is the fastest int8 form of MatMul-heavy models on ORT's CPU provider, but on
some (MiniLM) a few layers break the target. The mix keeps exactly those float:
``fuse,dynamic(exclude=A;B;…)``, a fixed pipeline like any other (its report is the recipe, every
per-layer decision resolved in the ``exclude=`` list).

When it is searched (:func:`search`): the ``fuse,dynamic`` candidate was produced and *misses* the
target (when it holds, a mix keeps more layers float, so it can only be slower), and at least 2
layers can be chosen (:func:`.sensitivity.dynamic_layers` whose names a selector can name).

How the search is pruned, with N such layers:

1. **Estimate** (no timing, no model build per layer): each layer alone in dynamic int8, its
   loss L_ℓ at the model's outputs, from one session holding every layer's quantized twin behind a
   switch (:mod:`.gated`: (N + 1) × ``SAMPLES`` runs on fit calibration samples); order the layers
   by L_ℓ, largest first (ties: graph order). Let M(k) be the mix with the first k float. (The
   local error of :mod:`.sensitivity` is cheaper, but on MiniLM it ranks the layer that breaks
   the target 20th of 36; the end-to-end loss ranks it first.)
2. **Measure what the estimate cannot decide**: whether M(k) holds the target end to end on the
   held-out samples (one optimize run of M(k), the pipeline's fidelity judgement). M(N) is
   ``fuse`` (holds), M(0) is ``fuse,dynamic`` (misses). Assuming the verdict is monotone in k
   (more layers float, closer to the original), a binary search over k ∈ [1, N − 1] finds the
   smallest k that holds in at most ⌈log₂ N⌉ optimize runs. (Not monotone: it still ends at a k
   that holds, with k − 1 missing.)
3. The mix found (none when every tried k misses) is added as one more candidate and timed with
   the others; the choice rules of :mod:`.choose` are unchanged, so it is chosen only when it
   measures faster (or, within the tie, smaller). The tried k and their verdicts are kept in its
   notes.

No new trial starts once the plan's time budget is spent (the mix found so far is kept).
"""

from __future__ import annotations

import time

from .candidates import Candidate

DYNAMIC = "fuse,dynamic"
SAMPLES = 8  # fit samples the sensitivity estimate reads
UNSAFE = set(",;()=")  # a node name with one of these cannot be written in exclude=
PREFIXES = ("re:", "op:", "first:", "last:")


def nameable(name: str) -> bool:
    """Whether ``name`` can stand as a NAME in a pass option's selector."""
    return bool(name) and name == name.strip() and name != "all" and not (set(name) & UNSAFE) and not (
        name.startswith(PREFIXES))


def mix_pipeline(excluded: list) -> str:
    return f"{DYNAMIC}(exclude={';'.join(excluded)})"


def ranked_layers(errors: dict, order: list) -> list:
    """The layer names by error, largest first; ties in graph ``order``."""
    position = {name: i for i, name in enumerate(order)}
    return sorted(errors, key=lambda n: (-errors[n], position[n]))


def fit_samples(proto, settings: dict) -> list:
    """Up to ``SAMPLES`` calibration samples the pipeline fits on (not those it holds out)."""
    from ..calibration import CalibrationFeed, input_specs
    from ..fidelity.context import held_out

    feed = CalibrationFeed(input_specs(proto), settings.get("calib"), settings.get("input_shapes") or {},
                           num_samples=settings.get("num_samples", 8), seed=settings.get("seed", 0))
    keep_all = settings.get("eval_data") is not None
    samples = [s for i, s in enumerate(feed) if keep_all or not held_out(i)]
    return samples[:SAMPLES]


def bisect(count: int, holds) -> tuple:
    """``(k, trace)``: the smallest k in [1, count − 1] with ``holds(k)`` found by binary search
    (``holds(count)`` is taken as true and never called; k = None when only count holds, or when
    ``holds`` returns None: stopped). ``trace``: ``[(k, verdict)]`` in the order tried."""
    lo, hi, found, trace = 1, count, None, []
    while lo < hi:
        mid = (lo + hi) // 2
        verdict = holds(mid)
        if verdict is None:
            break
        trace.append((mid, verdict))
        if verdict:
            hi, found = mid, mid
        else:
            lo = mid + 1
    return found, trace


def search(model, candidates: list, settings: dict, executor, log, deadline: float | None = None,
           errors_of=None, record: dict | None = None) -> list:
    """``[the mix candidate]`` or ``[]`` (module docstring). ``deadline``: a ``time.perf_counter()``
    value after which no trial starts. ``errors_of(proto, samples)``: the estimate (default
    :func:`.gated.layer_losses`, end to end; :func:`.sensitivity.layer_errors` is the local one).
    ``record``: filled with the estimate when it was made — ``{"layers": [{"layer", "loss",
    "float"}, …]}`` in graph order (``float``: kept float by the mix found) — for the report."""
    from .gated import layer_losses
    from .sensitivity import dynamic_layers

    by_name = {c.pipeline: c for c in candidates}
    dynamic, fuse = by_name.get(DYNAMIC), by_name.get("fuse")
    if dynamic is None or fuse is None or fuse.proto is None or dynamic.proto is None or dynamic.error or dynamic.met:
        return []
    order = [name for name, _, _ in dynamic_layers(fuse.proto) if nameable(name)]
    if len(order) < 2:
        return []
    errors = (errors_of or layer_losses)(fuse.proto, fit_samples(fuse.proto, settings))
    ranked = ranked_layers({n: errors[n] for n in order if n in errors}, order)
    if len(ranked) < 2:
        return []
    tried = {}

    def holds(k: int):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        chosen = set(ranked[:k])
        pipeline = mix_pipeline([n for n in order if n in chosen])
        candidate = executor.candidates(model, [pipeline], settings, None, None, log)[0][0]
        tried[k] = candidate
        log(f"plan: mix, {k} of {len(ranked)} layers float: "
            f"{candidate.error or ('met' if candidate.met else 'MISSED')}, {candidate.binding}")
        return None if candidate.error else bool(candidate.usable)

    k, trace = bisect(len(ranked), holds)
    if record is not None:
        kept = set(ranked[:k]) if k is not None else set()
        record["layers"] = [{"layer": n, "loss": float(errors[n]), "float": n in kept} for n in order if n in errors]
    if k is None:
        return []
    mix = tried[k]
    mix.label = f"{DYNAMIC} mix: {k} of {len(ranked)} float"
    mix.notes = list(mix.notes) + [
        f"mix: layers by dynamic-int8 error, most sensitive float: {', '.join(ranked[:k])}",
        "mix: tried " + ", ".join(f"k={t} {'met' if ok else 'missed'}" for t, ok in trace)]
    return [mix]


__all__ = ["search", "bisect", "nameable", "mix_pipeline", "ranked_layers", "Candidate"]
