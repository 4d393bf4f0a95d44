"""Match / check / rewrite: the result of a match step, and the state a pass run's rules share.

A rule works in three steps (onnxscript's rewriter is the model):

1. **match** — does the pattern occur at this node? If not, the rule does not concern the node:
   :data:`NOT_CONCERNED` (nothing is counted);
2. **check** — may it be rewritten here? If not, :meth:`MatchResult.fail` with a *reason*
   (``"bn: shared weight"``), counted once per node in the report's skip reasons;
3. **rewrite** — carried out from the payload of :meth:`MatchResult.of`; never fails.

"Does not apply" is always a value, never an exception. Because the fuse loop re-applies
every rule each round until nothing changes, a node that stays unmatched would have its
reason counted once per round; :class:`SkipOnce` counts each (node, reason) pair once per pass
run. :class:`RuleRun` holds what the rules of one run share: the model, the
:class:`~onnxslim_kit.pipeline.PassResult`, the skip set, the inferred shapes
(:class:`~onnxslim_kit.passes._common.shapes.ShapeTable`) and a few caches — explicit
state owned by the run, nothing written into the model's or the result's ``__dict__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnxslim_kit.passes._common.shapes import ShapeTable, infer_shapes


@dataclass(frozen=True)
class MatchResult:
    """What a match/check step found: a payload for the rewrite (``ok``) or a reason (not ``ok``).

    ``reason == ""`` means "this rule does not concern the node" (nothing to count).
    """

    value: Any = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def counted(self) -> bool:
        """A failure whose reason belongs in the report."""
        return bool(self.reason)

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def of(value: Any) -> "MatchResult":
        return MatchResult(value, None)

    @staticmethod
    def fail(reason: str = "") -> "MatchResult":
        return MatchResult(None, reason)

    def prefixed(self, prefix: str) -> "MatchResult":
        """The same failure with ``prefix`` before the reason (``"bn: " + "weight not constant"``)."""
        return self if self.ok or not self.reason else MatchResult(None, prefix + self.reason)


NOT_CONCERNED = MatchResult.fail("")


class SkipOnce:
    """Counts ``result.skip(reason)`` once per (node, reason) pair for the life of this object."""

    def __init__(self, result):
        self.result = result
        self._seen: dict = {}  # (id(node), reason) -> node (kept alive so its id cannot be reused)

    def __call__(self, node, reason: str) -> None:
        key = (id(node), reason)
        if key not in self._seen:
            self._seen[key] = node
            self.result.skip(reason)

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(eq=False)
class RuleRun:
    """State shared by the rules of one pass run (one instance per ``Pass.run``)."""

    model: Any
    result: Any
    skip_once: SkipOnce = None
    shapes: ShapeTable = field(default_factory=ShapeTable)
    shapes_inferred: bool = False
    dirty: bool = False  # something was folded: shapes may be known now
    unfoldable: set = field(default_factory=set)  # id(node) that constant folding gave up on
    notes: set = field(default_factory=set)  # notes already written (at most NOTES_LIMIT)
    digests: dict = field(default_factory=dict)  # id(constant) -> (values, digest)

    NOTES_LIMIT = 20

    def __post_init__(self):
        if self.skip_once is None:
            self.skip_once = SkipOnce(self.result)

    @property
    def opset(self) -> int:
        return self.model.opset

    def ensure_shapes(self, refresh: bool = False) -> ShapeTable:
        """Run ONNX shape inference once per run (again when ``refresh``); returns the table."""
        if self.shapes_inferred and not refresh:
            return self.shapes
        table, problem = infer_shapes(self.model)
        if problem and not self.shapes_inferred:
            self.result.notes.append(f"shape inference: {problem}")
        self.shapes = table
        self.shapes_inferred = True
        return self.shapes

    def note_once(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < self.NOTES_LIMIT:
            self.notes.add(text)
            self.result.notes.append(text)

    def skip(self, node, found: MatchResult) -> None:
        """Count a failed match's reason (once per node); "not concerned" counts nothing."""
        if found.counted:
            self.skip_once(node, found.reason)
