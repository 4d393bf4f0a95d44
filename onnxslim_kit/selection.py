"""One syntax for choosing nodes: every pass's ``include=`` / ``exclude=`` and the global ``--exclude``.

A selector text is a list of *terms* separated by ``;`` (a comma separates pass options in
``--passes "int8(exclude=…),fp16"``); whitespace around a term is ignored. A node is selected
when any term selects it (the selector is the union of its terms):

==================  ==========================================================================
``NAME``            the node named exactly ``NAME`` (a bare word without ``:``)
``re:REGEX``        nodes whose name matches ``REGEX`` (``re.search``); ``name:REGEX`` is an alias
``op:TYPE``         every node of op type ``TYPE`` (exact, case-sensitive as in ONNX)
``first:TYPE:N``    the first ``N`` nodes of op type ``TYPE`` in topological order (``*``: any type)
``last:TYPE:N``     the last ``N`` nodes of op type ``TYPE`` in topological order (``*``: any type)
``all``             every node
==================  ==========================================================================

Let ``V`` be the nodes of the main graph in topological order (the order of its node list,
which ONNX requires to be topological), ``C ⊆ V`` the candidates (``V`` unless the caller
restricts them, e.g. int8 to its quantizable layers) and ``V_T = [v ∈ C : op(v) = T]``. Then

    sel(NAME) = {v ∈ C : name(v) = NAME}          sel(op:T)      = V_T
    sel(re:R) = {v ∈ C : R.search(name(v))}        sel(first:T:N) = V_T[:N]
    sel(all)  = C                                  sel(last:T:N)  = V_T[len(V_T) − N:]

and ``select(t₁;…;tₖ) = ⋃ sel(tᵢ)`` (a set of node names). Selectors form a monoid under
:meth:`Selector.union` (``|``) with :data:`Selector.EMPTY` as identity.

``must_match=True`` (a pass's own option): a term that selects no node of ``V`` is a
:class:`~onnxslim_kit.errors.UserError` naming the closest node names (``difflib``) or, for
``op:`` / ``first:`` / ``last:``, the closest op types. ``must_match=False`` (the global
``--exclude`` seen by a pass after earlier passes renamed or removed nodes): such terms are
ignored.

:meth:`Selector.select` gives names, :meth:`Selector.nodes` the nodes themselves (unnamed ones
included), :meth:`Selector.nodes_in` the nodes of a model's graphs (If/Loop/Scan bodies:
``NAME`` / ``re:`` / ``op:`` / ``all`` reach them, positions count in the main graph). Pass
options declare ``Option(str, "", "…", parse=Selector.parse)`` (validated before any pass
runs) and read the value with :meth:`Selector.coerce` (Python callers may give a text, a list
or a Selector). :func:`exclusions` gives a pass the nodes its own ``exclude=`` and the global
``--exclude`` keep out, each with its counted skip reason:

    E(own, glob) = {v ↦ r_glob : v ∈ glob.nodes(must_match=False)}
                 ∪ {v ↦ r_own  : v ∈ own.nodes(must_match=True) ∖ glob.nodes(…)}

(with ``own_wins`` the own reason takes the intersection). This module is core: it imports no pass.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Iterable

from .errors import UserError

KINDS = ("name", "re", "op", "first", "last", "all")
_COUNTED = re.compile(r"([A-Za-z0-9_.*]+):(\d+)")
OWN_REASON = "excluded (exclude=)"
GLOBAL_REASON = "excluded (--exclude)"
_HELP = "use NAME, re:REGEX, op:TYPE, first:TYPE:N, last:TYPE:N or all, separated by ';'"



SYNTAX = "NAME;re:REGEX;op:TYPE;first:TYPE:N;last:TYPE:N;all"
"""The selector syntax in one line, for option help texts (``--list-passes``)."""

@dataclass(frozen=True)
class Term:
    """One term: ``kind`` in :data:`KINDS`, ``value`` the name / regex / op type, ``count`` for first/last."""

    kind: str
    value: str = ""
    count: int = 0

    def __str__(self) -> str:
        if self.kind == "name":
            return self.value
        if self.kind == "all":
            return "all"
        if self.kind in ("first", "last"):
            return f"{self.kind}:{self.value}:{self.count}"
        return f"{self.kind}:{self.value}"

    def pick(self, nodes: list) -> list:
        """The nodes this term selects among ``nodes`` (in topological order)."""
        if self.kind == "all":
            return list(nodes)
        if self.kind == "name":
            return [n for n in nodes if n.name == self.value]
        if self.kind == "re":
            pattern = re.compile(self.value)
            return [n for n in nodes if pattern.search(n.name or "")]
        same = [n for n in nodes if self.value in ("*", _op(n))]
        if self.kind == "op":
            return same
        if self.count == 0:
            return []
        return same[: self.count] if self.kind == "first" else same[-self.count:]

    def closest(self, nodes: list) -> list:
        """Up to three node names (or op types, for op-type terms) closest to this term's value."""
        if self.kind in ("op", "first", "last"):
            pool = sorted({_op(n) for n in nodes})
        else:
            pool = sorted({n.name for n in nodes if n.name})
        probe = self.value
        if self.kind == "re":  # compare with the literal part of the pattern
            probe = re.sub(r"[\^$\\.*+?()\[\]{}|]", "", self.value) or self.value
        return difflib.get_close_matches(probe, pool, n=3, cutoff=0.0)


def _op(node) -> str:
    op = getattr(node, "op", None)
    return op if isinstance(op, str) else node.op_type


def _parse_term(item: str, where: str) -> Term:
    if item == "all":
        return Term("all")
    if ":" not in item:
        return Term("name", item)
    kind, _, rest = item.partition(":")
    kind, rest = kind.strip(), rest.strip()
    if kind in ("re", "name") and rest:
        try:
            re.compile(rest)
        except re.error as exc:
            raise UserError(f"{where}: bad regular expression {rest!r} ({exc})") from None
        return Term("re", rest)
    if kind == "op" and rest and ":" not in rest:
        return Term("op", rest)
    if kind in ("first", "last"):
        counted = _COUNTED.fullmatch(rest.replace(" ", ""))
        if counted:
            return Term(kind, counted.group(1), int(counted.group(2)))
    raise UserError(f"{where}: cannot read {item!r}; {_HELP}")


def _main_nodes(graph) -> list:
    nodes = getattr(graph, "nodes", None)
    if nodes is None:  # onnx.GraphProto (or ModelProto)
        nodes = getattr(graph, "node", None)
        if nodes is None and hasattr(graph, "graph"):
            nodes = graph.graph.node
    if nodes is None:
        raise TypeError(f"Selector.select needs a gs.Graph or onnx.GraphProto, got {type(graph).__name__}")
    return list(nodes)


@dataclass(frozen=True)
class Selector:
    """A parsed selector: a tuple of :class:`Term` (see the module docstring)."""

    terms: tuple = ()

    EMPTY = None  # set below: the selector that selects nothing

    # --- building -----------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | None, where: str = "selector") -> "Selector":
        """Read ``'op:Conv; re:^head/; last:Gemm:1'``; a bad term is a UserError naming ``where``."""
        if text is None:
            return cls.EMPTY
        if not isinstance(text, str):
            raise UserError(f"{where}: expected a selector text, got {type(text).__name__}")
        terms = []
        for item in (p.strip() for p in text.split(";")):
            if item:
                term = _parse_term(item, where)
                if term not in terms:
                    terms.append(term)
        return cls(tuple(terms)) if terms else cls.EMPTY

    @classmethod
    def parse_option(cls, text: str) -> "Selector":
        """One-argument form for ``Option(Selector.parse_option, "", …)`` (``where`` unknown here)."""
        return cls.parse(text, "selector")

    @classmethod
    def coerce(cls, value: Any, where: str = "selector") -> "Selector":
        """A Selector from an option value: a Selector, a text, ``None`` or a list of texts / Selectors."""
        if isinstance(value, Selector):
            return value
        if value is None or isinstance(value, str):
            return cls.parse(value, where)
        if isinstance(value, (list, tuple, set, frozenset)):
            return cls.union(*(cls.coerce(v, where) for v in value))
        raise UserError(f"{where}: expected a selector text, got {type(value).__name__}")

    @classmethod
    def union(cls, *selectors: "Selector") -> "Selector":
        """The selector selecting what any of ``selectors`` selects (duplicate terms dropped)."""
        terms = []
        for sel in selectors:
            for term in cls.coerce(sel).terms:
                if term not in terms:
                    terms.append(term)
        return cls(tuple(terms)) if terms else cls.EMPTY

    def __or__(self, other: "Selector") -> "Selector":
        return Selector.union(self, other)

    # --- reading ------------------------------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self.terms)

    def __str__(self) -> str:
        return ";".join(str(t) for t in self.terms)

    def __repr__(self) -> str:
        return f"Selector({str(self)!r})"

    def select(self, graph, where: str = "selector", must_match: bool = True,
               among: Iterable | None = None) -> set:
        """Names of the main-graph nodes this selector selects (see :meth:`nodes`)."""
        return {n.name for n in self.nodes(graph, where, must_match, among)}

    def nodes(self, graph, where: str = "selector", must_match: bool = True,
              among: Iterable | None = None) -> list:
        """The main-graph nodes this selector selects, in graph order (unnamed ones included:
        ``op:`` / ``first:`` / ``last:`` / ``all`` select them too).

        ``graph``: a ``gs.Graph`` or ``onnx.GraphProto``. ``among``: optional candidate nodes
        (a subset of the graph's, e.g. a pass's eligible layers): terms select only among them
        and ``first`` / ``last`` count among them. ``must_match``: a term selecting no node of
        the whole graph raises a UserError with the closest names (see the module docstring).
        """
        if not self.terms:
            return []
        nodes = _main_nodes(graph)
        if among is None:
            candidates = nodes
        else:
            wanted = {id(n) for n in among}
            candidates = [n for n in nodes if id(n) in wanted]
        chosen = set()
        for term in self.terms:
            picked = term.pick(candidates)
            if must_match and not picked and (candidates is nodes or not term.pick(nodes)):
                self._no_match(term, nodes, where)
            chosen.update(id(n) for n in picked)
        return [n for n in nodes if id(n) in chosen]

    def nodes_in(self, graphs: Iterable, where: str = "selector", must_match: bool = True) -> list:
        """The selected nodes of a model's graphs: ``graphs[0]`` the main graph, the others its
        If/Loop/Scan bodies. ``NAME`` / ``re:`` / ``op:`` / ``all`` select in every graph;
        ``first`` / ``last`` count in the main graph only. ``must_match``: a term selecting no
        node of any graph is a UserError (closest names from every graph)."""
        graphs = [_main_nodes(g) for g in graphs]
        if not self.terms or not graphs:
            return []
        main, every = graphs[0], [n for g in graphs for n in g]
        chosen = []
        for term in self.terms:
            pool = main if term.kind in ("first", "last") else every
            picked = term.pick(pool)
            if must_match and not picked:
                self._no_match(term, pool, where)
            chosen.extend(picked)
        unique = {id(n): n for n in chosen}
        return [n for n in every if id(n) in unique]

    @staticmethod
    def _no_match(term: Term, nodes: list, where: str) -> None:
        if not nodes:
            raise UserError(f"{where}: {str(term)!r} matches no node; the graph has no nodes")
        if term.kind in ("first", "last") and term.value in {"*"} | {_op(n) for n in nodes}:
            return  # first:T:0 selects nothing by definition; T itself is there
        closest = term.closest(nodes)
        what = "closest op types" if term.kind in ("op", "first", "last") else "closest"
        raise UserError(f"{where}: {str(term)!r} matches no node; {what}: {', '.join(closest) or 'none'}")

    @staticmethod
    def matches(node, names: set) -> bool:
        """Whether ``node`` (gs.Node or NodeProto) is among ``names`` (the result of :meth:`select`)."""
        return node.name in names


Selector.EMPTY = Selector(())


def exclusions(graph, own: Any, glob: Any, where: str, reasons: tuple = (OWN_REASON, GLOBAL_REASON),
               own_wins: bool = False) -> dict:
    """``{id(node): skip reason}`` of the nodes a pass's own ``exclude=`` (``own``: every term
    must match, errors name ``where``) and the global ``--exclude`` (``glob``: terms matching
    nothing are ignored) select; ``reasons`` = (own reason, global reason). A node both select
    gets the global reason, or the own one with ``own_wins``. ``graph``: the main graph (a
    ``gs.Graph`` / ``onnx.GraphProto``: :meth:`Selector.nodes`, unnamed nodes included) or a
    list of a model's graphs, main graph first (:meth:`Selector.nodes_in`: bodies too)."""
    own, glob = Selector.coerce(own, where), Selector.coerce(glob, "--exclude")
    if isinstance(graph, (list, tuple)):
        picked_glob = glob.nodes_in(graph, "--exclude", must_match=False)
        picked_own = own.nodes_in(graph, where, must_match=True)
    else:
        picked_glob = glob.nodes(graph, "--exclude", must_match=False)
        picked_own = own.nodes(graph, where, must_match=True)
    first, second = (picked_glob, reasons[1]), (picked_own, reasons[0])
    if own_wins:
        first, second = second, first
    out = dict.fromkeys(map(id, first[0]), first[1])
    for node in second[0]:
        out.setdefault(id(node), second[1])
    return out
