"""Passes, their results, the registry, and the loop that runs them with verification.

A pass is a class with a ``name`` (its registry key, file name and CLI word), declared
``options``, and ``run(model, ctx) -> PassResult``. The pass edits ``model.graph``; the
pipeline then

1. calls ``model.commit()`` (dead-code removal, topological order),
2. verifies the result (onnx checker, ONNX Runtime with its own optimisations off, on the
   sample inputs): a lossy pass against the *original* model, a lossless one against the
   model the last lossy pass left (the original when none ran),
3. for a lossless pass whose outputs moved beyond tolerance: restores the model from before
   the pass, records it, and under ``strict`` raises :class:`VerificationError`;
   for a lossy pass: records the drift (cosine, max abs, top-1 agreement).

"Does not apply" is never an exception: passes count reasons with :meth:`PassResult.skip`.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import onnx

from .errors import UserError, VerificationError
from .model import Model, drop_new_value_info
from .report import PassReport, Report, model_stats
from .runtime import give_back
from .verify import Verifier


@dataclass(frozen=True)
class Option:
    """A declared pass option: type, default, one-line help, optional choices."""

    type: type
    default: Any
    help: str
    choices: tuple | None = None

    def parse(self, text: Any, where: str) -> Any:
        if not isinstance(text, str):
            value = text
        elif self.type is bool:
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise UserError(f"{where}: expected true/false, got {text!r}")
            value = lowered in ("1", "true", "yes", "on")
        else:
            try:
                value = self.type(text)
            except ValueError:
                raise UserError(f"{where}: expected {self.type.__name__}, got {text!r}") from None
        if self.choices is not None and value not in self.choices:
            raise UserError(f"{where}: {value!r} is not one of {', '.join(map(str, self.choices))}")
        return value


@dataclass
class PassResult:
    """What a pass did, in numbers. ``rewrites``/``skipped`` map a short label to a count."""

    modified: bool = False
    rewrites: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)

    def rewrite(self, label: str, count: int = 1) -> None:
        if count:
            self.rewrites[label] += count
            self.modified = True

    def skip(self, reason: str, count: int = 1) -> None:
        if count:
            self.skipped[reason] += count


@dataclass
class PassContext:
    """What a pass may use besides the model: its options, the data feed, the original model."""

    options: dict
    feed: Any  # calibration.CalibrationFeed
    original: onnx.ModelProto
    progress: Callable[..., Iterable] = lambda it, **_: it
    log: Callable[[str], None] = lambda _msg: None


class Pass:
    """Base class. Subclasses set ``name``, ``summary``, ``lossless``, ``options`` and ``run``."""

    name: str = ""
    summary: str = ""
    lossless: bool = True
    options: dict = {}

    def is_lossless(self, options: dict) -> bool:
        """Whether the pass, with these options, must leave the outputs unchanged."""
        return self.lossless

    def run(self, model: Model, ctx: PassContext) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError


# --- registry ---------------------------------------------------------------------------

_REGISTRY: dict = {}


def register_pass(cls):
    """Class decorator: make a pass available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def available_passes() -> dict:
    """All passes: the built-in ones and those of the ``onnxslim_kit.passes`` entry-point group."""
    from importlib import import_module
    from importlib.metadata import entry_points

    from .passes import BUILTIN_PASSES

    for module in BUILTIN_PASSES:
        import_module(f"onnxslim_kit.passes.{module}")
    for ep in entry_points(group="onnxslim_kit.passes"):
        register_pass(ep.load())
    return dict(sorted(_REGISTRY.items()))


# --- parsing "fuse,prune(ratio=0.3,criterion=l1),int8" ------------------------------------

@dataclass
class PassSpec:
    name: str
    options: dict


def parse_pass_list(text: str) -> list:
    """Split ``a,b(k=v,k2=v2),c`` into specs (option values still strings)."""
    specs, depth, start = [], 0, 0
    pieces = []
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
    for piece in pieces:
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
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in (x.strip() for x in items) if item]


def resolve(specs: list) -> list:
    """Turn specs into (pass instance, validated options); unknown names/options are UserErrors."""
    registry = available_passes()
    resolved = []
    for spec in specs:
        if spec.name not in registry:
            raise UserError(f"unknown pass {spec.name!r}; available: {', '.join(registry)}")
        instance = registry[spec.name]()
        options = {key: opt.default for key, opt in instance.options.items()}
        for key, value in spec.options.items():
            if key not in instance.options:
                known = ", ".join(instance.options) or "none"
                raise UserError(f"pass {spec.name!r} has no option {key!r}; its options: {known}")
            options[key] = instance.options[key].parse(value, f"{spec.name}({key}=...)")
        resolved.append((instance, options))
    return resolved


# --- the run loop -----------------------------------------------------------------------

def run_pipeline(
    original: onnx.ModelProto,
    specs: list,
    feed,
    *,
    verify: bool = True,
    strict: bool = False,
    rtol: float = 1e-4,
    verify_samples: int = 4,
    eval_feed=None,
    progress: Callable[..., Iterable] = lambda it, **_: it,
    log: Callable[[str], None] = lambda _msg: None,
) -> tuple:
    """Run the passes in order on ``original``; return (optimised ModelProto, Report)."""
    resolved = resolve(specs)
    model = Model.from_proto(original)
    report = Report(load_notes=list(model.load_notes))
    held_out = eval_feed is not None
    verifier = Verifier(original, (eval_feed if held_out else feed).take(verify_samples), rtol=rtol) if verify else None
    if held_out:
        report.verified_on = "held-out evaluation samples"
    else:
        report.verified_on = "generated random samples" if getattr(feed, "generated", False) else "calibration samples"
    if verifier is not None:
        report.original_check = verifier.original_check
    good_stats = report.before = model_stats(original)
    big = good_stats["bytes"] >= COLLECT_MIN_BYTES
    final = original  # the proto returned: the original itself until a pass is accepted
    for index, (instance, options) in enumerate(resolved):
        lossless = instance.is_lossless(options)
        log(f"{instance.name}: running")
        snapshot = model.snapshot()  # for a rollback; shares the constants' arrays (never mutated)
        start = time.perf_counter()
        ctx = PassContext(options=options, feed=feed, original=original, progress=progress, log=log)
        result = instance.run(model, ctx)
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
            check = verifier.check(model, lossless=lossless)
            entry.verification = check.to_dict()
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
        if verifier is not None:
            verifier.accept(lossless)
        snapshot = None
        release(big)
        candidate = model.to_proto()
        drop_new_value_info(candidate, model.source_value_info)
        good_stats = model_stats(candidate)
        report.passes.append(entry.finish(good_stats))
        # no proto is kept while the next pass runs (one whole-model copy fewer); after the
        # last pass the candidate is the result
        final = candidate if index == len(resolved) - 1 else None
        del candidate
        give_back()  # freed heap back before the next pass allocates
    report.after = good_stats
    if final is None:
        final = model.to_proto()
        drop_new_value_info(final, model.source_value_info)
    model = snapshot = None  # the graph's arrays go before the caller saves the result
    release(big)
    return final, report


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
