"""Where the time and the bytes go, by op type: ORT's profiler and the weights' consumers.

Latency by op (:func:`op_latency`): one session at ``opt_level="all"`` (what ``bench`` times, so
the op types are those ORT runs after its fusions: ``FusedConv``, ``QLinearConv``, …) with
ORT's profiler on; ``warmup`` untimed runs and ``runs`` profiled runs on the samples in turn.
The profile's events with ``cat == "Node"`` and a name ending in ``_kernel_time`` are the
kernels; with d(e) their duration in µs and R the profiled runs::

    us_per_run[op] = Σ_{e : op_name(e) = op, e in the profiled runs} d(e) / R

The warm-up runs are the first ``warmup`` ``model_run`` events; kernels inside them are dropped
(by their timestamp). The profile's file is removed.

Size by op (:func:`size_by_op`): every initializer (and Constant node's tensor) counted once, in
bytes of its values (:func:`onnxslim_kit.streaming.tensor_nbytes`), under the op type that
consumes it. A consumer that only converts the weight (``DequantizeLinear``, ``Cast``,
``Identity``, ``Transpose``, ``Reshape``, ``Unsqueeze``) is looked through to the op consuming its
output (up to 4 deep) when the tensor is its data (first) input — or any input of a
``DequantizeLinear``, whose scale and zero point belong to the weight. A Reshape's shape counts
under ``Reshape``. A tensor whose (looked-through) consumers have different op types goes to ``shared``; one
with no consumer to ``unused``. What the file holds besides the values (the graph, names,
metadata) is ``graph``: serialized size − Σ values.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

PASS_THROUGH = ("DequantizeLinear", "Cast", "Identity", "Transpose", "Reshape", "Unsqueeze")


def op_latency(model, samples: list, provider: str, threads: int, runs: int = 5, warmup: int = 1) -> dict:
    """``{"us_per_run": {op: µs}, "runs": R, "total_us": Σ}`` for ``model`` (proto or path)."""
    from ..runtime import make_session, prepare_feed

    with tempfile.TemporaryDirectory(prefix="slim-profile-") as tmp:
        providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
        session = make_session(model, "all", threads, providers, profile=os.path.join(tmp, "plan"))
        feeds = [prepare_feed(session, s) for s in samples]
        for r in range(warmup + runs):
            session.run(None, feeds[r % len(feeds)])
        events = json.loads(Path(session.end_profiling()).read_text())
    return aggregate(events, warmup, runs)


def aggregate(events: list, warmup: int, runs: int) -> dict:
    """The module docstring's sum over kernel events after the first ``warmup`` runs."""
    model_runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                        key=lambda e: e["ts"])
    start = model_runs[warmup]["ts"] if len(model_runs) > warmup else 0
    totals = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time") or e["ts"] < start:
            continue
        totals[e.get("args", {}).get("op_name") or "?"] += float(e.get("dur", 0))
    per_run = {op: round(us / max(runs, 1), 3) for op, us in sorted(totals.items())}
    return {"us_per_run": per_run, "runs": runs, "total_us": round(sum(per_run.values()), 3)}


def _consumers(graph) -> dict:
    found = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            if name:
                found[name].append(node)
    return found


def _final_ops(name: str, consumers: dict, depth: int = 0) -> set:
    ops = set()
    for node in consumers.get(name, []):
        # a DequantizeLinear's scale and zero point belong to its weight; a Reshape's shape does not
        converts = node.op_type in PASS_THROUGH and (node.op_type == "DequantizeLinear" or node.input[0] == name)
        if converts and depth < 4 and node.output and consumers.get(node.output[0]):
            ops |= _final_ops(node.output[0], consumers, depth + 1)
        else:
            ops.add(node.op_type)
    return ops


def size_by_op(proto) -> dict:
    """``{op type: bytes}`` of the model's tensors by consumer (module docstring), main graph."""
    import onnx

    from ..model import model_size_bytes
    from ..streaming import tensor_nbytes

    graph = proto.graph
    consumers = _consumers(graph)
    tensors = [(t.name, t) for t in graph.initializer]
    tensors += [(n.output[0], a.t) for n in graph.node if n.op_type == "Constant"
                for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    sizes = defaultdict(int)
    for name, tensor in tensors:
        ops = _final_ops(name, consumers)
        key = "unused" if not ops else ops.pop() if len(ops) == 1 else "shared"
        sizes[key] += tensor_nbytes(tensor) or 0
    values = sum(sizes.values())
    sizes["graph"] = max(model_size_bytes(proto) - values, 0)
    return dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])))


MEASURE = "profile"


def cached_latency(model, sha256: str, samples: list, machine: dict, cache, runs: int = 5) -> dict:
    """:func:`op_latency` of ``model`` through the timing cache (key: ``sha256`` and the machine,
    plus ``|profile``), ``cached`` saying where it came from."""
    found = cache.get(sha256, machine, None, measure=MEASURE)
    if found is not None:
        return {k: found[k] for k in ("us_per_run", "runs", "total_us")} | {"cached": True}
    result = op_latency(model, samples, machine["provider"], machine["threads"], runs=runs)
    cache.put(sha256, machine, None, result, measure=MEASURE)
    return {**result, "cached": False}
