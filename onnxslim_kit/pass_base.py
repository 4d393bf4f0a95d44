"""What a pass is: :class:`Pass`, its declared :class:`Option` s, :class:`PassContext` and
:class:`PassResult`.

A pass is a class with a ``name`` (its registry key, its folder under ``passes/`` and its CLI
word), a one-line ``summary``, ``lossless``, declared ``options`` and ``run(model, ctx) ->
PassResult``. The pass edits ``model.graph`` and says what it did in numbers; the pipeline (not
the pass) commits, verifies and rolls back (:mod:`.pipeline`).

Options
-------
``options`` maps an option name to an :class:`Option`. It is frozen when the class is created
(a ``types.MappingProxyType``), so no pass can change another's options at run time and a
subclass that extends them writes ``options = {**Base.options, "k": Option(...)}``.

``Option(type, default, help, choices=None, parse=None)``:

* ``type``: ``int``, ``float``, ``str``, ``bool`` (``true/false/yes/no/on/off/1/0``) — the text
  of ``--passes "p(k=v)"`` is converted with it;
* ``parse``: an optional hook ``parse(text) -> value`` (or ``parse(text, where)``) for an
  option with its own mini-language (a selector, a fidelity target, a ladder). It is called
  by :func:`.pipeline.resolve` for every option of every pass **before any pass runs**, so
  ``int8(target=cos:2)`` fails before ``fuse`` has spent a minute. It raises
  :class:`.errors.UserError`; a message that does not already name the option is prefixed
  with ``pass(option=...)``. The hook also runs on the default when the default is a
  string, so ``ctx.options[k]`` is always the parsed value. Values that are not strings
  (given through the Python API) are passed through as they are.
* ``choices``: the allowed values (checked after conversion).

A pass class may set ``renamed = {"old_option": "what to write instead"}``: an old option
name then fails with ``pass 'fp16' has no option 'block_ops'; ...; renamed: use exclude=op:TYPE``.

"Does not apply" is never an exception: a pass counts reasons with :meth:`PassResult.skip`.
"""

from __future__ import annotations

import abc
import inspect
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import onnx

from .errors import UserError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    """A declared pass option: type, default, one-line help, optional choices and parse hook."""

    type: type
    default: Any
    help: str
    choices: tuple | None = None
    parse: Callable[..., Any] | None = None

    def convert(self, text: Any, where: str) -> Any:
        """The value of ``text`` (a string from the command line, or a Python value)."""
        if not isinstance(text, str):
            value = text
        elif self.parse is not None:
            value = _call_hook(self.parse, text, where)
        elif self.type is bool:
            lowered = text.strip().lower()
            if lowered not in _TRUE + _FALSE:
                raise UserError(f"{where}: expected true/false, got {text!r}")
            value = lowered in _TRUE
        else:
            try:
                value = self.type(text)
            except ValueError:
                raise UserError(f"{where}: expected {self.type.__name__}, got {text!r}") from None
        if self.choices is not None and value not in self.choices:
            raise UserError(f"{where}: {value!r} is not one of {', '.join(map(str, self.choices))}")
        return value

    def default_value(self, where: str) -> Any:
        """The default, through the parse hook when there is one (so passes see one kind)."""
        if self.parse is not None and isinstance(self.default, str):
            return _call_hook(self.parse, self.default, where)
        return self.default


def _takes_where(hook: Callable) -> bool:
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return False
    if any(p.name == "where" for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _call_hook(hook: Callable, text: str, where: str) -> Any:
    try:
        return hook(text, where=where) if _takes_where(hook) else hook(text)
    except UserError as exc:
        message = str(exc)
        if where in message:
            raise
        raise UserError(f"{where}: {message}") from None


@dataclass
class PassResult:
    """What a pass did, in numbers. ``rewrites``/``skipped`` map a short label to a count."""

    modified: bool = False
    rewrites: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    # options a replay (``--recipe``) runs with instead of the given ones, so that it repeats a
    # decision this run made from the machine's timings without timing again (int8's ``speed``)
    replay: dict = field(default_factory=dict)

    def rewrite(self, label: str, count: int = 1) -> None:
        if count:
            self.rewrites[label] += count
            self.modified = True

    def skip(self, reason: str, count: int = 1) -> None:
        if count:
            self.skipped[reason] += count


def _empty_selector():
    from .selection import Selector

    return Selector.EMPTY


@dataclass
class PassContext:
    """What a pass may use besides the model: its options, the data feed, the original model.

    ``exclude``: the global ``--exclude`` selector (:class:`.selection.Selector`, empty by
    default); a lossy pass leaves the nodes it selects (``must_match=False``) as they are.
    ``seed``: the run's seed, for passes that draw random numbers.
    ``fidelity``: for a lossy pass, what it must hold (:class:`.fidelity.Fidelity`: target,
    its share of the budget, output views, held-out samples); None for a lossless pass.
    """

    options: dict
    feed: Any  # calibration.CalibrationFeed
    original: onnx.ModelProto
    progress: Callable[..., Iterable] = lambda it, **_: it
    log: Callable[[str], None] = lambda _msg: None
    exclude: Any = field(default_factory=_empty_selector)
    seed: int = 0
    fidelity: Any = None  # fidelity.Fidelity: the target share a lossy pass holds (None: lossless)


class Pass(abc.ABC):
    """Base class. Subclasses set ``name``, ``summary``, ``lossless``, ``options`` and ``run``."""

    name: str = ""
    summary: str = ""
    lossless: bool = True
    options: types.MappingProxyType = types.MappingProxyType({})
    renamed: types.MappingProxyType = types.MappingProxyType({})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # each class gets its own read-only view of its options (never a shared mutable dict)
        for attr in ("options", "renamed"):
            value = cls.__dict__.get(attr)
            if value is not None and not isinstance(value, types.MappingProxyType):
                setattr(cls, attr, types.MappingProxyType(dict(value)))

    def is_lossless(self, options: dict) -> bool:
        """Whether the pass, with these options, must leave the outputs unchanged."""
        return self.lossless

    @abc.abstractmethod
    def run(self, model, ctx: PassContext) -> PassResult:
        """Edit ``model.graph`` (a :class:`.model.Model`); return what was done."""
