"""The pass list and the loop that runs it with verification.

``--passes "fuse,prune(ratio=0.3),int8"`` is parsed into :class:`PassSpec` s
(:func:`parse_pass_list`), then :func:`resolve` d against the registry: every pass name and
every option of every pass is checked — option texts converted, parse hooks run — before any
pass runs. For each pass the pipeline then

1. runs it (``pass.run(model, ctx) -> PassResult``; an exception of the pass becomes a
   :class:`.errors.PassError` naming it and the passes before it — user errors, verification
   errors and ``KeyboardInterrupt`` pass through unchanged; a result that is not a
   :class:`PassResult` is an internal error of that pass too),
2. calls ``model.commit()`` (dead-code removal, topological order),
3. verifies the result (onnx checker, ONNX Runtime with its own optimisations off, on the
   sample inputs): a lossy pass against the *original* model, a lossless one against the
   model the last lossy pass left (the original when none ran),
4. for a lossless pass whose outputs moved beyond tolerance: restores the model from before
   the pass, records it, and under ``strict`` raises :class:`VerificationError`;
   for a lossy pass: records the drift (cosine, max abs, top-1 agreement).

The global exclusion (``--exclude``, a :class:`.selection.Selector`) must select at least one
node of the input model (checked before any pass runs); passes get it as ``ctx.exclude``.

The pass-author names (``Option``, ``Pass``, ``PassResult``, ``PassContext``,
``register_pass``, ``available_passes``) are re-exported here for older imports; new code
imports them from :mod:`onnxslim_kit.api`.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import onnx

from .errors import PassError, SlimError, UserError, VerificationError
from .model import Model, drop_new_value_info
from .pass_base import Option, Pass, PassContext, PassResult
from .registry import available_passes, clear_cache, register_pass
from .report import PassReport, Report, model_stats
from .runtime import give_back
from .verify import Verifier

__all__ = [
    "Option", "Pass", "PassContext", "PassResult", "PassSpec", "available_passes", "clear_cache",
    "parse_exclude", "parse_pass_list", "register_pass", "resolve", "run_pipeline",
]

logger = logging.getLogger("onnxslim_kit")


def _log_info(message: str) -> None:
    logger.info(message)


# --- parsing "fuse,prune(ratio=0.3,criterion=l1),int8" ------------------------------------

@dataclass
class PassSpec:
    name: str
    options: dict


def _split_passes(text: str) -> list:
    depth, start, pieces = 0, 0, []
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise UserError(f"--passes: unbalanced ')' in {text!r}")
        elif ch == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise UserError(f"--passes: unbalanced '(' in {text!r}")
    pieces.append(text[start:])
    return pieces


def parse_pass_list(text: str) -> list:
    """Split ``a,b(k=v,k2=v2),c`` into specs (option values still strings)."""
    specs = []
    for piece in _split_passes(text):
        piece = piece.strip()
        if not piece:
            continue
        name, _, rest = piece.partition("(")
        options = {}
        if rest:
            if not rest.endswith(")"):
                raise UserError(f"--passes: expected ')' at the end of {piece!r}")
            for item in _split_top_level(rest[:-1]):
                key, eq, value = item.partition("=")
                if not eq or not key.strip():
                    raise UserError(f"--passes: option {item!r} of {name.strip()} is not key=value")
                options[key.strip()] = value.strip()
        specs.append(PassSpec(name.strip(), options))
    if not specs:
        raise UserError("--passes: no pass given")
    return specs


def _split_top_level(text: str) -> list:
    """Split a pass's option text at the commas outside parentheses. Only ``(``/``)`` nest: a
    selector's regular expression may hold an unbalanced ``[`` or ``{``."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in (x.strip() for x in items) if item]


def _unknown_option(cls, name: str, key: str) -> UserError:
    known = ", ".join(cls.options) or "none"
    message = f"pass {name!r} has no option {key!r}; its options: {known}"
    instead = (getattr(cls, "renamed", None) or {}).get(key)
    if instead:
        message += f"; renamed: use {instead}"
    return UserError(message)


def resolve(specs: list) -> list:
    """Turn specs into (pass instance, validated options), defaults filled in; unknown names
    and options, and option values their type or parse hook refuses, are UserErrors."""
    registry = available_passes()
    resolved = []
    for spec in specs:
        if spec.name not in registry:
            raise UserError(f"unknown pass {spec.name!r}; available: {', '.join(registry)}")
        cls = registry[spec.name]
        for key in spec.options:
            if key not in cls.options:
                raise _unknown_option(cls, spec.name, key)
        options = {}
        for key, opt in cls.options.items():
            where = f"{spec.name}({key}=...)"
            options[key] = opt.convert(spec.options[key], where) if key in spec.options else opt.default_value(where)
        resolved.append((cls(), options))
    return resolved


def parse_exclude(exclude):
    """The global exclusion as one :class:`.selection.Selector`: from None, a selector text, a
    list of texts (``--exclude`` given several times: their union) or a Selector."""
    from .selection import Selector

    if exclude is None:
        return Selector.EMPTY
    if isinstance(exclude, Selector):
        return exclude
    texts = [exclude] if isinstance(exclude, str) else list(exclude)
    selector = Selector.EMPTY
    for text in texts:
        selector = selector | (text if isinstance(text, Selector) else Selector.parse(str(text), where="--exclude"))
    return selector


def _check_atol(atol: dict, original: onnx.ModelProto) -> dict:
    outputs = [o.name for o in original.graph.output]
    for name in atol:
        if name not in outputs:
            raise UserError(f"--atol: the model has no output {name!r}; its outputs: {', '.join(outputs)}")
    return {name: float(value) for name, value in atol.items()}


# --- the run loop -----------------------------------------------------------------------

class _RuntimeRefusal(Exception):
    """ONNX Runtime cannot run the model a pass was given (custom-domain ops …): the pass is
    skipped with this reason, the model left as it was before it."""


def _runtime_refusal(exc: BaseException, snapshot: Model) -> str | None:
    """The skip reason when ``exc`` is ONNX Runtime's and ORT cannot load the model as it was
    before the pass (the model's fault, not the pass's); None otherwise (an internal error)."""
    if not type(exc).__module__.startswith("onnxruntime"):
        return None
    from .runtime import make_session

    try:
        proto, arrays = snapshot.session_proto()
        make_session(proto, arena=False, arrays=arrays, prepack=False)
    except Exception as load_error:  # noqa: BLE001 - ORT raises its own types
        text = str(load_error).strip().splitlines()[0] if str(load_error).strip() else type(load_error).__name__
        text = text.split("Fatal error: ", 1)[-1][:200]
        return f"ONNX Runtime cannot run the model ({text}): the pass needs it"
    finally:
        give_back()
    return None


def _run_pass(instance, model: Model, ctx: PassContext, done: list, snapshot: Model | None = None) -> PassResult:
    """``instance.run`` with its failures named: a bug in a pass says which pass. An ONNX
    Runtime error about a model ORT cannot load at all is :class:`_RuntimeRefusal`."""
    after = f" (after {', '.join(done)})" if done else ""
    try:
        result = instance.run(model, ctx)
    except (SlimError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the pass named
        reason = _runtime_refusal(exc, snapshot) if snapshot is not None else None
        if reason is not None:
            raise _RuntimeRefusal(reason) from exc
        raise PassError(f"internal error in pass {instance.name!r}{after}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, PassResult):
        raise PassError(f"internal error in pass {instance.name!r}{after}: run() returned "
                        f"{type(result).__name__}, not a PassResult")
    return result


def _verified_on(feed, held_out: bool) -> str:
    if held_out:
        return "held-out evaluation samples"
    return "generated random samples" if getattr(feed, "generated", False) else "calibration samples"


def run_pipeline(
    original: onnx.ModelProto,
    specs: list,
    feed,
    *,
    verify: bool = True,
    strict: bool = False,
    rtol: float = 1e-4,
    atol: dict | None = None,
    exclude=None,
    seed: int = 0,
    verify_samples: int = 4,
    eval_feed=None,
    target=None,
    metric=None,
    progress: Callable[..., Iterable] = lambda it, **_: it,
    log: Callable[[str], None] = _log_info,
) -> tuple:
    """Run the passes in order on ``original``; return (optimised ModelProto, Report).

    ``atol``: ``{output: tolerance}`` — those outputs are judged lossless by max abs error ≤
    tolerance instead of the relative rule. ``exclude``: see :func:`parse_exclude`.
    ``target``: the fidelity target of the whole pipeline (:mod:`.fidelity`; default
    ``cos:0.99``); each lossy pass gets ``ctx.fidelity``, its share of the budget the passes
    before it left, judged on held-out samples (:func:`.fidelity.split_feed`)."""
    from .fidelity import DEFAULT, Target

    target = Target.parse(("metric:0.99" if metric is not None else DEFAULT) if target is None else target)
    metric = _user_metric(metric)
    resolved = resolve(specs)
    atol = _check_atol(atol or {}, original)
    selector = parse_exclude(exclude)
    if selector:
        selector.select(original.graph, where="--exclude", must_match=True)
    model = Model.from_proto(original)
    report = Report(load_notes=list(model.load_notes), seed=seed, exclude=str(selector) if selector else None,
                    atol=dict(atol), rtol=rtol,
                    pass_list=[{"name": instance.name, "options": dict(options)} for instance, options in resolved])
    feed, fidelity, verifier, lossy = _judging(original, resolved, feed, eval_feed, (target, metric), report, log,
                                               verify=verify, verify_samples=verify_samples, rtol=rtol, atol=atol)
    good_stats = report.before = model_stats(original)
    big = good_stats["bytes"] >= COLLECT_MIN_BYTES
    final = original  # the proto returned: the original itself until a pass is accepted
    done, used = [], 0.0  # used: the budget fraction the accepted lossy passes spent (measured)
    for index, (instance, options) in enumerate(resolved):
        lossless = instance.is_lossless(options)
        log(f"{instance.name}: running")
        snapshot = model.snapshot()  # for a rollback; shares the constants' arrays (never mutated)
        start = time.perf_counter()
        ctx = PassContext(options=options, feed=feed, original=original, progress=progress, log=log,
                          exclude=selector, seed=seed)
        ctx.fidelity = None if lossless else _pass_fidelity(fidelity, instance.name, options, sum(
            i >= index for i in lossy), used, log)
        measured = None
        try:
            result = _run_pass(instance, model, ctx, done, snapshot)
        except _RuntimeRefusal as refusal:  # the model as it was; the reason counted, one warning
            model, result = snapshot, PassResult()
            result.skip(str(refusal))
            logger.warning(f"{instance.name}: skipped: {refusal}")
        done.append(instance.name)
        report.pass_list[index]["options"].update(result.replay)  # the recipe repeats, not re-times
        model.commit()
        elapsed = time.perf_counter() - start
        release(big)  # what the pass dropped (trial graphs are cycles), before the verification session
        entry = PassReport(
            name=instance.name, options=options, lossless=lossless, modified=result.modified,
            rewrites=dict(result.rewrites), skipped=dict(result.skipped), notes=list(result.notes),
            metrics=dict(result.metrics), seconds=round(elapsed, 3), before=good_stats,
        )
        if result.modified and verifier is not None:
            against = "the model before it" if lossless else "the original"
            log(f"{instance.name}: verifying against {against} with ONNX Runtime")
            # the model itself, not its proto: no whole-model copy beside the session
            check = verifier.check(model, lossless=lossless, fidelity=ctx.fidelity)
            entry.verification = check.to_dict()
            if check.verdict is not None:
                entry.fidelity, measured = _fidelity_entry(check.verdict, ctx.fidelity), check.verdict.used
            if check.status == "invalid" or (lossless and check.status == "failed"):
                entry.rolled_back = True
                model = snapshot
                release(big)  # the rejected graph
                report.passes.append(entry.finish(good_stats))
                if strict:
                    raise VerificationError(
                        f"pass {instance.name!r} changed the outputs ({check.summary()}); rolled back"
                    )
                continue
        # accepted: the weights the pass replaced (held by the snapshot) go before the export
        if ctx.fidelity is not None and result.modified:
            used = measured if measured is not None else ctx.fidelity.allowed  # unmeasured: all its share
        if verifier is not None:
            verifier.accept(lossless)
        snapshot = None
        release(big)
        candidate = model.to_proto()
        drop_new_value_info(candidate, model.source_value_info)
        _note_executed(entry, candidate, feed)
        good_stats = model_stats(candidate)
        report.passes.append(entry.finish(good_stats))
        # no proto is kept while the next pass runs (one whole-model copy fewer); after the
        # last pass the candidate is the result
        final = candidate if index == len(resolved) - 1 else None
        del candidate
        give_back()  # freed heap back before the next pass allocates
    report.after = good_stats
    _check_target(report, strict)
    if final is None:
        final = model.to_proto()
        drop_new_value_info(final, model.source_value_info)
    model = snapshot = None  # the graph's arrays go before the caller saves the result
    release(big)
    return final, report


def _judging(original, resolved: list, feed, eval_feed, target, report: Report, log, *, verify: bool,
             verify_samples: int, rtol: float, atol: dict) -> tuple:
    """The data the passes fit, what judges them and the verifier: ``(feed, fidelity, verifier,
    indices of the lossy passes)``. With a lossy pass the feed is split (:func:`.fidelity.split_feed`)
    and the verifier runs on the judged samples; without one it runs on ``verify_samples``."""
    from .fidelity import Fidelity, split_feed

    held_out = eval_feed is not None
    generated = feed if not held_out and getattr(feed, "generated", False) else None
    lossy = [i for i, (instance, options) in enumerate(resolved) if not instance.is_lossless(options)]
    fidelity, verified_on = None, None
    if lossy:  # the passes fit one part of the data and are judged on the other
        feed, samples, verified_on, warning = split_feed(feed, eval_feed)
        fidelity = Fidelity.build(original, target[0], samples, verified_on, metric=target[1], pool_feed=feed)
        if warning:
            report.load_notes.append(warning)
            logger.warning(warning)
    else:
        samples = (eval_feed if held_out else feed).take(verify_samples) if verify else []
    report.target = str(target[0])
    report.metric = target[1].name if target[1] is not None else None
    report.views = [v.name for v in fidelity.views] if fidelity is not None else []
    verifier = (Verifier(original, samples, rtol=rtol, atol=atol, feed=generated, fidelity=fidelity)
                if verify else None)
    if verifier is not None and verifier.derived:  # the data ORT runs on, for the passes too
        feed = verifier.feed
        report.load_notes.append(verifier.derived)
        log(verifier.derived)
    report.verified_on = verified_on or _verified_on(feed, held_out)
    if verifier is not None:
        report.original_check = verifier.original_check
    return feed, fidelity, verifier, lossy


def _note_executed(entry: PassReport, candidate: onnx.ModelProto, feed) -> None:
    """What ONNX Runtime runs of a quantized result (:mod:`.executed`: int8 kernels, the share of
    MACs in them, the DequantizeLinear it left), in the pass's metrics and notes."""
    from .executed import executed_line, executed_summary, has_quantized_ops

    if not entry.lossless and entry.modified and has_quantized_ops(candidate):
        entry.metrics["executed"] = executed_summary(candidate, next(iter(feed), None))
        entry.notes.append(executed_line(entry.metrics["executed"]))


def _user_metric(metric):
    """None, a :class:`.fidelity.judge.UserMetric`, a callable or a ``module:function`` text."""
    from .fidelity.judge import UserMetric, load_metric

    if metric is None or isinstance(metric, UserMetric):
        return metric
    if isinstance(metric, str):
        return load_metric(metric)
    if not callable(metric):
        raise UserError(f"metric= must be a function or 'module:function', not {type(metric).__name__}")
    return UserMetric(metric)


def _pass_fidelity(fidelity, name: str, options: dict, remaining: int, used: float, log):
    """A lossy pass's ``ctx.fidelity``: its own ``target=`` or its share of what is left."""
    if fidelity is None:
        return None
    mine = fidelity.for_pass(str(options.get("target") or ""), remaining, used)
    log(f"{name}: {mine.describe()}")
    return mine


def _check_target(report: Report, strict: bool) -> None:
    """Warn (under ``strict``: raise) when the last measured lossy pass left the pipeline's target missed."""
    last = next((p.fidelity for p in reversed(report.passes) if p.fidelity and not p.rolled_back), None)
    if last is None or last.get("pipeline_met") is not False:
        return
    message = f"the pipeline's target {report.target} is missed: {last['binding']}"
    if strict:
        raise VerificationError(message)
    logger.warning(message)


def _fidelity_entry(verdict, fidelity) -> dict:
    """The report's fidelity of a lossy pass: its verdict, the share it was given, whether held."""
    entry = verdict.to_dict()
    allowed = fidelity.allowed if fidelity is not None else 1.0
    entry.update(allowed=round(allowed, 6), met=verdict.met(allowed),
                 pipeline_met=verdict.met(1.0) if fidelity is None or not fidelity.own_target else None,
                 judged_on=fidelity.judged_on if fidelity is not None else "")
    return entry


# models of at least this many bytes get a full garbage collection between steps
COLLECT_MIN_BYTES = 16 << 20


def release(collect: bool) -> None:
    """Free what was dropped: a graph's nodes and tensors refer to each other, so only the cycle
    collector frees a dropped graph, and its arrays with it (MiniLM: 131 MB still held when
    ``optimize`` returned, ~100 MB of the int8 pass's trial graphs after it). ``collect``: run
    it (costs a walk over every object of the process: for big models only, see
    ``COLLECT_MIN_BYTES``). Then the heap's free pages go back (:func:`.runtime.give_back`)."""
    if collect:
        gc.collect()
    give_back()
