"""Per-layer speed decision of the ``int8`` pass (``speed=layers``, what the default ``auto``
means unless ``$ONNXSLIM_KIT_SPEED`` names another: :func:`resolve_speed`): int8 only where it pays.

ONNX Runtime's int8 kernels are not faster everywhere: on this project's CPUs a depthwise
QLinearConv measured 4.5–7× its float Conv, so ``fuse,int8`` of ppocr_cls_v2 ran 1.6× slower
than ``fuse`` alone although every MAC ran in int8. The rule (issue 14): never slower than
``fuse`` alone — a layer whose int8 kernel is slower than its float op stays float.

For every static-int8 candidate layer, its *kind* (op, the input and weight shapes at the
calibration sample's shapes, the attributes, bias, the fused activation, activation type,
per-channel weights) gets two one-node models, the float op and its int8 form as ORT runs it
after its QDQ fusion::

    float:  x ──▶ Conv(W, b) ──▶ [Relu|Clip] ──▶ y
    int8:   x_q ─▶ DQ ─▶ Conv(DQ(W_q), DQ(b_q)) ─▶ [Relu|Clip] ─▶ Q ─▶ y_q   (→ QLinearConv)

(MatMul → QLinearMatMul, Gemm → QGemm), integer input and output, so that only the kernel is
timed: inside an int8 chain no Q/DQ runs between layers. With ``activations=int8`` the int8
form has float input and output (a Q in front, a DQ behind): ORT runs int8 activations as
uint8 on x86 and only converts a Q/DQ pair it sees, so that form includes two element-wise
passes the chain would not run (the decision then leans to float). Both are timed in ORT, CPU, graph
optimizations on, 1 intra-op thread, interleaved: in round ``r`` each model runs ``reps``
times (``reps`` set once so that a batch of the float model lasts ≥ :data:`BATCH_S`), the
model going first alternating, and::

    ratio = median_r  t_int8(r) / t_float(r)        spread = [P10, P90] of the per-round ratios

The layer stays float when ``ratio > margin`` (``speed_margin``, default 1: "not slower"),
with the reason ``int8 slower here: 4.8× float (measured)``. Rounds: at least
:data:`MIN_ROUNDS`, at most :data:`MAX_ROUNDS`, stopping once :data:`BUDGET_S` is spent.

Determinism: every timing goes to a timing cache (JSON, the format of
:mod:`onnxslim_kit.plan.timing_cache`, so one file can hold both) under the key::

    int8-layer | op | shape and attribute fields | provider | threads | ORT version | CPU model

at ``timing_cache=PATH``, ``$ONNXSLIM_KIT_TIMINGS``, or ``$ONNXSLIM_KIT_CACHE/timings.json`` (else
``~/.cache/onnxslim_kit/timings.json``); ``plan --timing-cache FILE`` points the variable at
FILE while its candidates run, so the plan's cache holds their layer timings too. A kind found there is not timed again, so the same
machine and cache give byte-identical output, and a cache shipped with a recipe replays its
decisions; a machine with another CPU or ORT misses the cache and measures its own (the
decision is machine-dependent, and the report says so). The file is merged with what is on
disk and replaced atomically (several runs may share it).

Layers without an int8 compute kernel of their own (Gather tables) are not timed.

The per-layer timings miss what joins the layers: where an int8 layer meets a float one, a
Q or DQ runs over the tensor, and a hard-swish between int8 layers runs as a float detour. So
``speed=layers`` ends with the whole-model guard of ``speed=model``: the int8 candidate (the
fallback's choice, slow layers float) is timed against the float model and kept only when
its ratio ≤ ``speed_margin``; that timing is cached too, under the sha256 of both models
(:func:`model_ratio`), so the guard also replays without timing. Above
:data:`MODEL_CHECK_MAX_BYTES` of float layer weights (:func:`layer_weight_bytes`) the guard is
skipped: two whole sessions and a serialized copy of each model would double the memory.

Replay without timing: the run's report records the decision (``speed=off``, ``speed_decided``),
so a recipe repeats it on any machine with no cache (:mod:`onnxslim_kit.passes.int8.speed_decision`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxslim_kit.errors import UserError
from onnxslim_kit.passes._common.graph import attr, const_value, consumers
from onnxslim_kit.runtime import TIMINGS_ENV, cpu_model

KEY_PREFIX = "int8-layer"
FORMAT = 1  # the plan's timing cache format: {"format": 1, "entries": {key: entry}}
PROVIDER = "CPUExecutionProvider"
THREADS = 1
MIN_ROUNDS, MAX_ROUNDS, BUDGET_S, BATCH_S = 5, 15, 0.4, 0.002
TIMED_OPS = ("Conv", "MatMul", "Gemm")
SPEEDS = ("auto", "layers", "model", "off")  # the ``speed`` option's choices
SPEED_ENV = "ONNXSLIM_KIT_SPEED"  # what ``speed=auto`` means when set (else ``layers``)
MODEL_CHECK_MAX_BYTES = 1 << 30  # float weights of the timed layers above which the whole-model check is skipped


def resolve_speed(option: str) -> str:
    """``auto`` → ``$ONNXSLIM_KIT_SPEED`` when it names a speed, else ``layers``; any other value as is.

    The environment variable is the switch for builds that must not depend on the building
    machine's timings (``ONNXSLIM_KIT_SPEED=off``: the output is the same on every machine)."""
    if option != "auto":
        return option
    env = os.environ.get(SPEED_ENV, "").strip().lower()
    if env and env not in SPEEDS[1:]:
        raise UserError(f"${SPEED_ENV}={env!r}: use one of {', '.join(SPEEDS[1:])}")
    return env or "layers"


def default_cache_path() -> Path:
    """``$ONNXSLIM_KIT_TIMINGS`` (a file: ``plan --timing-cache`` points it at its own cache),
    else ``timings.json`` under ``$ONNXSLIM_KIT_CACHE`` or ``~/.cache/onnxslim_kit``."""
    if os.environ.get(TIMINGS_ENV):
        return Path(os.environ[TIMINGS_ENV])
    env = os.environ.get("ONNXSLIM_KIT_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "onnxslim_kit") / "timings.json"


def machine() -> dict:
    """What besides the layer makes a timing: provider, threads, ORT version, CPU model."""
    import onnxruntime

    return {"provider": PROVIDER, "threads": THREADS, "onnxruntime": onnxruntime.__version__, "cpu": cpu_model()}


def layer_key(fields: dict, where: dict) -> str:
    parts = [KEY_PREFIX, fields["op"]] + [f"{k}={fields[k]}" for k in sorted(fields) if k != "op"]
    return "|".join(parts + [where["provider"], f"threads={where['threads']}", f"ort={where['onnxruntime']}",
                             f"cpu={where['cpu']}"])


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def _activation(node, spec_output: str) -> str:
    """The Relu / Clip fused into the layer (its output is the layer's Q point), or ``none``."""
    if node.outputs[0].name == spec_output:
        return "none"
    user = consumers(node.outputs[0])[0]
    if user.op == "Relu":
        return "Relu"
    bounds = [const_value(t) for t in user.inputs[1:3] if t is not None]
    return "Clip(" + ",".join(f"{float(np.asarray(b).reshape(-1)[0]):g}" for b in bounds) + ")"


def describe(spec, node, shapes: dict, activations: str, per_channel: bool) -> dict | None:
    """The key fields of a layer's kind, or None when it is not timed (module docstring)."""
    if spec.op not in TIMED_OPS or any(not _known(shapes.get(t)) for t in spec.inputs):
        return None
    fields = {"op": spec.op, "x": _dims(shapes[spec.inputs[0]]), "act": _activation(node, spec.output),
              "a": activations, "per_channel": int(bool(per_channel) and spec.weight_index is not None)}
    if spec.weight_index is None:  # activation × activation MatMul
        return {**fields, "b": _dims(shapes[spec.inputs[1]])}
    fields["w"] = _dims(node.inputs[spec.weight_index].shape)
    fields["bias"] = int(spec.bias_index is not None)
    if spec.op == "Conv":
        rank = len(node.inputs[1].shape) - 2
        fields.update(group=int(attr(node, "group", 1)), strides=_dims(attr(node, "strides", [1] * rank)),
                      dilations=_dims(attr(node, "dilations", [1] * rank)),
                      pads=_dims(attr(node, "pads", [0] * 2 * rank)), auto_pad=str(attr(node, "auto_pad", "NOTSET")))
    elif spec.op == "Gemm":
        fields["transB"] = int(attr(node, "transB", 0))
    return fields


def _known(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d > 0 for d in shape)


# --- the two one-node models -----------------------------------------------------------------

def _shape(text: str) -> list:
    return [int(d) for d in text.split("x")]


def _layer_attrs(fields: dict) -> dict:
    if fields["op"] == "Conv":
        out = {"group": fields["group"], "strides": _shape(fields["strides"]), "dilations": _shape(fields["dilations"])}
        if fields["auto_pad"] != "NOTSET":
            return {**out, "auto_pad": fields["auto_pad"]}
        return {**out, "pads": _shape(fields["pads"])}
    return {"transB": fields["transB"]} if fields["op"] == "Gemm" else {}


def _act_nodes(fields: dict, src: str, dst: str, inits: list) -> list:
    act = fields["act"]
    if act == "none":
        return [helper.make_node("Identity", [src], [dst])]
    if act == "Relu":
        return [helper.make_node("Relu", [src], [dst])]
    bounds = [b for b in act[len("Clip("):-1].split(",") if b]
    names = [f"clip{i}" for i in range(len(bounds))]
    inits += [numpy_helper.from_array(np.array(float(b), np.float32), n) for b, n in zip(bounds, names)]
    return [helper.make_node("Clip", [src] + names, [dst])]


def build_pair(fields: dict) -> tuple:
    """(float model, int8 model, float feed, integer feed) for a layer kind (module docstring)."""
    rng = np.random.default_rng(0)
    qtype = TensorProto.UINT8 if fields["a"] == "uint8" else TensorProto.INT8
    qdtype = np.uint8 if fields["a"] == "uint8" else np.int8
    zero = np.array(128 if fields["a"] == "uint8" else 0, qdtype)
    names = ["x", "b"] if "b" in fields else ["x"]
    shapes = {n: _shape(fields[n]) for n in names}
    f_inits, q_inits = [], [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
                            numpy_helper.from_array(zero, "z")]
    q_nodes = [helper.make_node("DequantizeLinear", [f"{n}_q", "s", "z"], [f"{n}_dq"]) for n in names]
    f_in, q_in = list(names), [f"{n}_dq" for n in names]
    if "w" in fields:
        wshape = _shape(fields["w"])
        axis = 0 if fields["op"] == "Conv" or fields.get("transB") else 1
        weight = (rng.standard_normal(wshape) * 0.1).astype(np.float32)
        channels = wshape[axis]
        ws = np.full(channels if fields["per_channel"] else (), 0.001, np.float32)
        q_inits += [numpy_helper.from_array(np.clip(np.round(weight / 0.001), -127, 127).astype(np.int8), "w_q"),
                    numpy_helper.from_array(ws, "w_s"), numpy_helper.from_array(np.zeros(ws.shape, np.int8), "w_z")]
        f_inits.append(numpy_helper.from_array(weight, "w"))
        q_nodes.append(helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], axis=axis))
        f_in.append("w")
        q_in.append("w_dq")
        if fields["bias"]:
            f_inits.append(numpy_helper.from_array(np.zeros(channels, np.float32), "bias"))
            q_inits += [numpy_helper.from_array(np.zeros(channels, np.int32), "b_q"),
                        numpy_helper.from_array(np.full(channels, 0.02 * 0.001, np.float32), "b_s"),
                        numpy_helper.from_array(np.zeros(channels, np.int32), "b_z")]
            q_nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b_dq"], axis=0))
            f_in.append("bias")
            q_in.append("b_dq")
    attrs = _layer_attrs(fields)
    f_nodes = [helper.make_node(fields["op"], f_in, ["t"], **attrs)] + _act_nodes(fields, "t", "y", f_inits)
    q_nodes += [helper.make_node(fields["op"], q_in, ["t"], **attrs)] + _act_nodes(fields, "t", "y", q_inits)
    q_inits += _output_params(fields, qdtype)
    q_nodes.append(helper.make_node("QuantizeLinear", ["y", "y_s", "y_z"], ["y_q"]))
    f_model = _model(f_nodes, [(n, TensorProto.FLOAT, shapes[n]) for n in names], ("y", TensorProto.FLOAT), f_inits)
    f_feed = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in names}
    if fields["a"] == "int8":  # ORT runs int8 activations as uint8 (x86): only between a Q and a DQ of its own
        q_nodes = [helper.make_node("QuantizeLinear", [n, "s", "z"], [f"{n}_q"]) for n in names] + q_nodes
        q_nodes.append(helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y_f"]))
        q_model = _model(q_nodes, [(n, TensorProto.FLOAT, shapes[n]) for n in names], ("y_f", TensorProto.FLOAT),
                         q_inits)
        return f_model, q_model, f_feed, dict(f_feed)
    q_model = _model(q_nodes, [(f"{n}_q", qtype, shapes[n]) for n in names], ("y_q", qtype), q_inits)
    q_feed = {f"{n}_q": rng.integers(np.iinfo(qdtype).min, np.iinfo(qdtype).max, shapes[n]).astype(qdtype)
              for n in names}
    return f_model, q_model, f_feed, q_feed


def _output_params(fields: dict, qdtype) -> list:
    """The output Q's scale and zero point: over the activation's range when there is one, so
    that ORT drops the Relu / Clip into the Q as it does in the quantized model."""
    info = np.iinfo(qdtype)
    act, lo, hi = fields["act"], -2.56, 2.54
    if act == "Relu":
        lo = 0.0
    elif act.startswith("Clip("):
        bounds = [float(b) for b in act[len("Clip("):-1].split(",") if b]
        lo, hi = (bounds + [hi])[:2] if bounds else (lo, hi)
    scale = (hi - lo) / (info.max - info.min)
    zero = int(np.clip(round(info.min - lo / scale), info.min, info.max))
    return [numpy_helper.from_array(np.array(scale, np.float32), "y_s"), numpy_helper.from_array(np.array(zero, qdtype), "y_z")]


def _model(nodes, inputs, output, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(output[0], output[1], None)], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                                               ir_version=8))


# --- timing ----------------------------------------------------------------------------------

def time_pair(fields: dict) -> dict:
    """The paired timing of a layer kind's float and int8 forms (module docstring)."""
    from onnxslim_kit.runtime import make_session

    f_model, q_model, f_feed, q_feed = build_pair(fields)
    runners = []
    for proto, feed in ((f_model, f_feed), (q_model, q_feed)):
        session = make_session(proto, "all", threads=THREADS)
        runners.append(lambda s=session, f=feed: s.run(None, f))
    for fn in runners:  # warm-up: first runs allocate
        fn()
        fn()
    t0 = time.perf_counter()
    runners[0]()
    reps = max(1, int(BATCH_S / max(time.perf_counter() - t0, 1e-7)))
    ratios, best, start = [], [float("inf"), float("inf")], time.perf_counter()
    for r in range(MAX_ROUNDS):
        times = [0.0, 0.0]
        for m in (r % 2, 1 - r % 2):
            times[m] = _fastest(runners[m], reps)
        ratios.append(times[1] / max(times[0], 1e-12))
        best = [min(a, b) for a, b in zip(best, times)]
        if r + 1 >= MIN_ROUNDS and time.perf_counter() - start > BUDGET_S:
            break
    return {"ratio": round(float(np.median(ratios)), 4),
            "spread": [round(float(np.percentile(ratios, q)), 4) for q in (10, 90)],
            "float_ms": round(1e3 * best[0], 5), "int8_ms": round(1e3 * best[1], 5),
            "rounds": len(ratios), "reps": reps}


def _fastest(fn, reps: int) -> float:
    """The fastest of ``reps`` timed runs: a run preempted by another process only gets slower."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class LayerTimings:
    """The layer timings of a timing cache file (module docstring); ``timed`` / ``cached`` count."""

    def __init__(self, path):
        self.path = Path(path)
        self.entries = _read(self.path)
        self.new = {}
        self.timed = self.cached = 0

    def get(self, fields: dict, where: dict, timer) -> dict:
        key = layer_key(fields, where)
        if key in self.entries:
            self.cached += 1
            return self.entries[key]
        entry = {**timer(fields), **{k: fields[k] for k in sorted(fields)}, **where}
        self.entries[key] = self.new[key] = entry
        self.timed += 1
        return entry

    def save(self) -> None:
        """Merge the new entries into the file as it is now and replace it atomically."""
        if not self.new:
            return
        entries = {**_read(self.path), **self.new}
        text = json.dumps({"format": FORMAT, "entries": dict(sorted(entries.items()))}, indent=2, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".timings-", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(text + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise UserError(f"int8(timing_cache={self.path}): cannot write it ({exc.strerror or exc})") from None


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"int8(timing_cache={path}): cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"int8(timing_cache={path}): not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise UserError(f"int8(timing_cache={path}): not an onnxslim_kit timing cache (format {FORMAT})")
    return data["entries"]


# --- the whole-model guard ---------------------------------------------------------------------

def model_ratio(candidate: onnx.ModelProto, reference: onnx.ModelProto, sample: dict, path, timer=None) -> tuple:
    """(ratio, spread, rounds) of the whole int8 candidate against the float model
    (:func:`onnxslim_kit.passes.int8.speed.latency_ratio`), through the timing cache under
    ``int8-model | sha256(candidate) | sha256(reference) | machine`` (a rerun times nothing)."""
    from onnxslim_kit.passes.int8.speed import latency_ratio

    where = machine()
    shas = [hashlib.sha256(p.SerializeToString(deterministic=True)).hexdigest() for p in (candidate, reference)]
    key = "|".join(["int8-model"] + shas + [where["provider"], f"threads={where['threads']}",
                                            f"ort={where['onnxruntime']}", f"cpu={where['cpu']}"])
    cache = LayerTimings(path)
    if key not in cache.entries:
        ratio, spread, rounds = (timer or latency_ratio)(candidate, reference, sample)
        cache.new[key] = {"ratio": round(ratio, 4), "spread": [round(v, 4) for v in spread], "rounds": rounds,
                          "candidate_sha256": shas[0], "reference_sha256": shas[1], **where}
        cache.save()
        return cache.new[key]["ratio"], cache.new[key]["spread"], rounds
    entry = cache.entries[key]
    return entry["ratio"], entry["spread"], entry["rounds"]


# --- the decision ----------------------------------------------------------------------------

def slow_layers(model, plan, candidates: set, sample: dict, opts: dict, result, timer=None) -> dict:
    """``{layer: "float"}`` for the ``candidates`` whose int8 kernel is slower than
    ``speed_margin`` × float (module docstring), reported in ``result``."""
    shapes = _layer_shapes(model, plan, candidates, sample)
    nodes = {node.name: node for node in model.graph.nodes}
    cache = LayerTimings(opts["timing_cache"] or default_cache_path())
    where, margin, slow, untimed = machine(), opts["speed_margin"], {}, 0
    for spec in plan.layers:
        fields = describe(spec, nodes[spec.name], shapes, opts["activations"], plan.per_channel) \
            if spec.name in candidates and spec.name in nodes else None
        if fields is None:
            untimed += spec.name in candidates
            continue
        entry = cache.get(fields, where, timer or time_pair)
        if entry["ratio"] > margin:
            slow[spec.name] = entry["ratio"]
            result.skip(f"int8 slower here: {entry['ratio']:.2f}× float (measured)")
    cache.save()
    result.metrics.update(speed_timed=cache.timed, speed_cached=cache.cached, layers_float_speed=len(slow),
                          layers_speed_untimed=untimed)
    if untimed:
        result.notes.append(f"speed: {untimed} layer(s) not timed (shapes unknown at the sample's; they stay int8)")
    if slow:
        listed = ", ".join(f"{n} {r:.2f}×" for n, r in list(slow.items())[:8]) + (" …" if len(slow) > 8 else "")
        result.notes.append(f"kept float for speed (int8 kernel > {margin:g}× float; ORT {where['onnxruntime']}, "
                            f"{THREADS} thread, {where['cpu']}: machine-dependent, timing cache {cache.path}, "
                            f"{cache.timed} kinds timed, {cache.cached} cached): {listed}")
    return {name: "float" for name in slow}


def _layer_shapes(model, plan, candidates: set, sample: dict) -> dict:
    """``{tensor: shape}`` at the sample's input shapes: inferred, and what inference leaves
    open measured by one ORT run. Above :data:`MODEL_CHECK_MAX_BYTES` of the candidates'
    weights, the graph's own shapes only (:func:`_graph_shapes`; no export, no run): exporting
    the model for inference touched every weight page (the 2.75 GB decoder peaked at 3.2× its
    size), so layers whose shapes stay unknown are not timed (:func:`slow_layers` says how many)."""
    return sample_shapes(model, sample, layer_weight_bytes(model, plan, candidates) > MODEL_CHECK_MAX_BYTES)


def sample_shapes(model, sample: dict, from_graph: bool, measure: bool = True) -> dict:
    """``{tensor: shape}`` at ``sample``'s input shapes: with ``from_graph`` the graph's own
    (:func:`_graph_shapes`: no export, no run), else inferred on an export of the model, and with
    ``measure`` what inference leaves open measured by one ORT run on ``sample``."""
    from onnxslim_kit.bench_macs import main_shapes

    if from_graph:
        return _graph_shapes(model.graph, sample)
    proto, arrays = model.session_proto()  # the weights stay where they are (a whole export: ddddocr +180 MB)
    del proto.graph.value_info[:]  # the committed shapes hold -1 / symbolic dims: inferred again at the sample's
    return main_shapes(proto, {k: list(np.shape(v)) for k, v in sample.items()}, feed=sample if measure else None,
                       arrays=arrays)


def _graph_shapes(graph, sample: dict) -> dict:
    """``{tensor: shape}`` of the graph's tensors whose dims are numbers, or symbols that a
    graph input names with the sample's size there (``batch``, ``seq``: 1, 32)."""
    sizes = {}
    for tensor in graph.inputs:
        if tensor.name in sample and tensor.shape is not None:
            for dim, size in zip(tensor.shape, np.shape(sample[tensor.name])):
                if isinstance(dim, str) and dim:
                    sizes[dim] = int(size)
    out = {}
    for name, tensor in graph.tensors().items():
        dims = [sizes.get(d, d) if isinstance(d, str) else d for d in (tensor.shape or [None])]
        if tensor.shape is not None and all(isinstance(d, int) and d >= 0 for d in dims):
            out[name] = dims
    return out


def layer_weight_bytes(model, plan, names: set) -> int:
    """Bytes of the float weights of the ``names`` layers (their constant weight inputs at 4 bytes
    an element: the size of the float model the whole-model check would time)."""
    nodes = {node.name: node for node in model.graph.nodes}
    total = 0
    for spec in plan.layers:
        node = nodes.get(spec.name)
        if spec.name in names and node is not None and spec.weight_index is not None:
            total += 4 * int(np.prod(node.inputs[spec.weight_index].shape or [0]))
    return total

