"""``compact`` — lossless: shorter names, so small models' files carry weights, not text.

An exported graph names every tensor and node after the framework's module path
(``If_0_else_branch__Inline_0__/stft/padding/Constant_4_output_0``); each name is stored once
per definition and once per use. On a model of a few thousand parameters that text is a
large share of the file (MTCNN P-Net: 1.9 KB of graph beside 26.5 KB of weights), and it stays
when the weights shrink (``fp16``, ``cluster``), so the file ratio cannot reach the weights'.

The pass renames every tensor except the main graph's inputs and outputs (the model's
interface; If/Loop/Scan body inputs and outputs are positional and get renamed too) to a
short identifier — ``a``, ``b``, …, ``z``, ``a0``, … — the most referenced tensors first, so
the most frequent names are the shortest. A name already as short as the fresh one it would
get is kept, and reserved: no later fresh name is it, and an object whose name was handed out
(or kept) before is renamed even where that is not shorter — so no two tensors, and no two
nodes, end up with one name (onnx's ``light_densenet121`` names its tensors ``r0``, ``r1``, …).
Node names become short identifiers as well
(``node_names=short``), are removed (``drop``: ONNX allows unnamed nodes, but ONNX Runtime's
profiles and errors then name nodes by position) or stay (``keep``). Body graphs are named ``g``; doc
strings go. Nothing else changes: outputs are bit-identical and the pipeline checks that.

Run it last: later passes and your own tooling may look nodes up by their original names
(the ``int8``/``fp16`` name regexes, for instance).
"""

from __future__ import annotations

import itertools
import string
from collections import Counter

from onnxslim_kit.errors import UserError
from onnxslim_kit.api import Option, Pass, PassResult, register_pass

NODE_NAMES = ("short", "drop", "keep")
_FIRST = string.ascii_lowercase
_REST = string.ascii_lowercase + string.digits


def short_names(taken: set):
    """Identifiers in order of length (``a`` … ``z``, ``aa`` … ``z9``, …), skipping ``taken``."""
    for length in itertools.count(1):
        for head in _FIRST:
            for tail in itertools.product(_REST, repeat=length - 1):
                name = head + "".join(tail)
                if name not in taken:
                    yield name


class Namer:
    """Final names for objects taken one by one: each object's own name where no fresh one is
    shorter and nobody holds it yet, else the next fresh name; every name given is reserved."""

    def __init__(self, taken=()):
        self.taken = set(taken)
        self._fresh = short_names(self.taken)  # skips names reserved after it started, too
        self._next = None

    def name_for(self, old: str) -> str:
        if self._next is None or self._next in self.taken:
            self._next = next(self._fresh)
        new = self._next
        if old in self.taken or len(new) < len(old):
            self._next = None
        else:
            new = old
        self.taken.add(new)
        return new


def tensor_uses(model) -> list:
    """(tensor, count) for every named tensor object, count = its definition plus every use
    (how often its name is written in the file), most written first."""
    tensors: dict = {}
    uses: Counter = Counter()
    for graph in model.all_graphs():
        for tensor in list(graph.inputs) + list(graph.outputs) + [
                t for node in graph.nodes for t in list(node.inputs) + list(node.outputs)]:
            tensors[id(tensor)] = tensor
            uses[id(tensor)] += 1
    return [(tensors[key], count) for key, count in uses.most_common()]


@register_pass
class CompactPass(Pass):
    name = "compact"
    summary = "shorten internal tensor and node names, drop doc strings (lossless; run it last)"
    lossless = True
    options = {
        "node_names": Option(str, "short", "short | drop | keep"),
    }

    def run(self, model, ctx) -> PassResult:
        node_names = ctx.options["node_names"]
        if node_names not in NODE_NAMES:
            raise UserError(f"compact: node_names must be one of {', '.join(NODE_NAMES)}, not {node_names!r}")
        result = PassResult()
        interface = {id(t) for t in list(model.graph.inputs) + list(model.graph.outputs)}
        tensor_names = Namer(t.name for t in list(model.graph.inputs) + list(model.graph.outputs))
        saved = 0
        for tensor, count in tensor_uses(model):
            if id(tensor) in interface or not tensor.name:
                continue
            new = tensor_names.name_for(tensor.name)
            if new != tensor.name:
                saved += (len(tensor.name) - len(new)) * count
                tensor.name = new
                result.rewrite("tensor renamed")
        nodes = [node for graph in model.all_graphs() for node in graph.nodes]
        node_namer = Namer()
        for node in nodes:
            if node_names == "keep" or not node.name:
                continue
            new = "" if node_names == "drop" else node_namer.name_for(node.name)
            if new != node.name:
                saved += len(node.name) - len(new)
                node.name = new
                result.rewrite("node renamed" if new else "node name dropped")
        for graph in model.all_graphs():
            if graph is not model.graph and len(graph.name) > 1:  # the checker wants a name
                saved += len(graph.name) - 1
                graph.name = "g"
            if graph.doc_string:
                saved += len(graph.doc_string)
                graph.doc_string = ""
                result.rewrite("doc string dropped")
        result.notes.append(f"names: about {saved:,} bytes of text fewer (main-graph inputs/outputs kept)")
        result.metrics["name_bytes_saved"] = saved
        return result
