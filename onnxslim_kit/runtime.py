"""ONNX Runtime sessions for verification, calibration and benchmarking.

One place decides how a ModelProto becomes a session: a skeleton proto plus the weights
handed over as arrays (never serialized, any size); graph optimisation level and thread
counts are explicit arguments, never global settings.

Pre-packing: by default ORT copies every constant MatMul / Conv weight into a packed layout
it keeps for the session's life (the deployed behaviour, and what :mod:`.bench` times). A
session that only verifies, calibrates or runs a few samples passes ``prepack=False``
(:data:`NO_PREPACK`). ORT 1.32, anonymous memory a session adds: one 64 MB MatMul weight,
+64 MB packed, +0.1 MB not (``tests/core/test_runtime_prepack.py``); issue 16's 2.78 GB model,
2.64 GB against 26 MB. MLAS rounds the unpacked path differently in the last bits (a chain's
output: −8.990326 packed, −8.990236 not, ``benchmarks/results/memory-2026-11-29-s2.md``), so
sessions whose outputs are compared with each other should agree on it. Such a session also
runs without :data:`MEMORY_OPTIMIZERS`: at levels ``extended`` / ``all`` ORT stores a float32
copy of every float16 weight a float32 kernel reads through a Cast it inserted (float16
MatMul on CPU) — 2× the float16 weights more (a 466 MB float16 decoder: 1551 MB of anonymous
memory against 472 MB); float16 → float32 is exact, so the Cast run per layer gives the same
values. And where the model holds float16 weights it runs its nodes in priority order (``ExecutionOrder.PRIORITY_BASED``): ORT's
default order runs the Casts it inserts for float16 weights, which depend on no input, all
before the first layer, every float32 copy alive at once (the same model: a run's peak
RSS 1258 MB against 627 MB in priority order, the same outputs; a float32 model's int8
calibration in priority order: ~10 % slower, 24 % more peak, so not there).

Tensors left on disk (anchored, :mod:`.streaming`) carry absolute locations, which ORT refuses
("Absolute path not allowed for external data location"): every session goes through
:func:`make_session` (their files become its external-data folder) or, for a session with a
folder of its own, :func:`map_anchored`.

A Model's in-memory weights (``arrays``, :meth:`.model.Model.session_proto`): how ORT 1.32 takes
an array, the memory a session adds over the caller's arrays (``benchmarks`` decoder of 480 MB,
all 2-D weights in memory; 64 MB MatMul weight in ``tests/core/test_runtime_prepack.py``):

=====================================  ==========================================  ============
way                                    what ORT does                               480 MB model
=====================================  ==========================================  ============
spill file (written, ORT maps it)      reads the file's pages: a second copy       +467 MB
``add_external_initializers``          copies each array                           +458 MB
``add_initializer`` (an OrtValue)      runs on the caller's buffer                 +2 MB
the weight as a graph input, fed       reads the fed array in place                +1 MB (64 MB)
=====================================  ==========================================  ============

``add_initializer`` keeps the weight an initializer (kernels that need a constant input get
one), so sessions at level ``disable`` (verification, calibration) take arrays that way. ORT's
graph optimizers, though, read such an initializer from the file its stub names, not from the
buffer (a Transpose folded at level ``all`` from a sparse stand-in file gave zeros): at other
levels the arrays go to the spill file. The stubs of initializers given in place name an
*empty* stand-in file, so a read ORT would make of it fails loudly instead of reading zeros.
One folder holds both the anchored weights and the session's temporary files (ORT takes one
external-data folder): their deepest common folder, the locations relative to it.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

from .streaming import (NUMPY_DTYPES, copy_fields, copy_fields_except_data, is_anchored, relocate_anchored,
                        set_location, tensor_array, tensor_nbytes)

OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


try:
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim  # glibc
except (OSError, AttributeError):  # other C libraries: nothing to give back
    _MALLOC_TRIM = None


def give_back() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; a no-op elsewhere).

    Sessions with ORT's arena off return each run's intermediates to malloc — which keeps
    them: blocks freed under the top of the heap stay resident (int8's MiniLM gated ranking:
    +66 MB over 47 runs, none of it in use; the verifier's sessions: the process held ≈ 50 MB
    more after each one was gone)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


NO_PREPACK = "session.disable_prepacking"  # session config key: "1" = no packed weight copies
# graph transformers that only trade memory for speed (module docstring): off without pre-packing
MEMORY_OPTIMIZERS = ("FuseFp16InitializerToFp32NodeTransformer",)
CONSTANT_FOLDING = "ConstantFolding"  # ORT's transformer computing constant subgraphs at session creation
DECODERS = ("Gather", "GatherElements")  # table look-ups: a weight decoded from a codebook and labels


def session_options(opt_level: str = "disable", threads: int = 0, prepack: bool = True) -> ort.SessionOptions:
    """Options with the optimisation level, intra-op ``threads`` (0: ORT's default) and, with
    ``prepack=False``, no pre-packed weight copies (see the module docstring)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[opt_level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # failures reach the user as exceptions, not as ORT log lines
    if not prepack:
        so.add_session_config_entry(NO_PREPACK, "1")
    return so


def make_session(
    model: onnx.ModelProto | str | Path,
    opt_level: str = "disable",
    threads: int = 0,
    providers: list | None = None,
    extra_outputs: list | None = None,
    arena: bool = True,
    arrays: dict | None = None,
    prepack: bool = True,
    profile: str | None = None,
    extra_nodes: list | None = None,
    fold: bool = True,
) -> ort.InferenceSession:
    """A session for a proto or a file path; ``extra_outputs``: intermediate tensors the
    session also returns (proto only, see :func:`add_outputs`).

    A proto's weights are never serialized with it (that would hold them three times at once:
    Python bytes, ORT's parsed proto, ORT's tensors). ORT gets a skeleton proto whose large
    initializers are external data (:func:`split_weights`) in a file it maps itself: the
    model's own data files for weights left on disk (:mod:`.streaming`), else a temporary file
    written one tensor at a time and unlinked once the session holds it. MiniLM (88 MB):
    a session costs ≈ 1× the weights instead of 3×. ``arena=False``: ORT's CPU arena off — it
    keeps a run's peak of intermediates for the session's life; without it they go back to
    malloc as they are freed (see :func:`give_back`). For sessions that run a few samples.
    ``arrays``: the values of the proto's ``in-memory`` stubs (:meth:`.model.Model.session_proto`):
    at ``opt_level="disable"`` ORT runs on them where they lie (nothing copied, the session holds
    them), at other levels they are written to the spill file like the weights of a whole proto
    (module docstring). ``extra_nodes``: NodeProtos added to the skeleton's graph, each right
    after the nodes making its inputs, the session run in the list's order
    (:func:`place_after_producers`); their outputs named in ``extra_outputs``
    (:func:`.activations.iter_activations`' ``absmax``). ``prepack=False``: no packed weight
    copies and no :data:`MEMORY_OPTIMIZERS` — for sessions that verify, calibrate or run a few
    samples, never for timing
    (module docstring). ``profile``: a file prefix; ORT profiles the session's runs
    (``end_profiling`` returns the file). ``fold=False``: ORT's constant folding off (weights
    computed from constants, :func:`weight_decoders`, are computed by each run instead).
    """
    so = session_options(opt_level, threads, prepack)
    so.enable_cpu_mem_arena = arena
    if profile is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile)
    providers = providers or ["CPUExecutionProvider"]
    disabled = ([] if prepack else list(MEMORY_OPTIMIZERS)) + ([] if fold else [CONSTANT_FOLDING])
    kwargs = {"disabled_optimizers": disabled} if disabled else {}
    if isinstance(model, (str, Path)):
        return ort.InferenceSession(str(model), so, providers=providers, **kwargs)
    skeleton, moved, folder = split_weights(model, arrays)
    if extra_outputs:
        add_outputs(skeleton, extra_outputs)
    # module docstring: Casts of weights; not with decoders unfolded (weight_decoders: ORT's own
    # order is the lighter one there — issue 16's decoder after fuse,cluster, one run: 1810 MB
    # peak RSS against 2464 MB in priority order, the same outputs)
    if not prepack and fold and _has_float16_weights(skeleton.graph):
        defer_sourceless(skeleton.graph)
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if extra_nodes:
        place_after_producers(skeleton.graph, extra_nodes)
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED  # the node list's order (see there)
    if not moved:
        if folder is not None:  # weights left on disk: ORT maps them from their files
            so.add_session_config_entry(EXTERNAL_FOLDER, folder)
        return ort.InferenceSession(skeleton.SerializeToString(), so, providers=providers, **kwargs)
    in_place = opt_level == "disable"  # module docstring: ORT's optimizers would read the stand-in
    with tempfile.TemporaryDirectory(prefix="slim-ort-", ignore_cleanup_errors=True) as tmp:
        root = shared_root(skeleton, folder, tmp)
        if root is None:  # no folder holds both (Windows drives): ORT copies the arrays
            so.add_session_config_entry(EXTERNAL_FOLDER, folder)
            held = _copied(moved, arrays, so)
        else:
            so.add_session_config_entry(EXTERNAL_FOLDER, root)
            held = _hand_over(moved, arrays, in_place, so, tmp, os.path.relpath(tmp, root))
        session = ort.InferenceSession(skeleton.SerializeToString(), so, providers=providers, **kwargs)
    session._slim_weights = held  # ORT runs on these buffers: alive as long as the session
    return session


def place_after_producers(graph: onnx.GraphProto, nodes: list) -> None:
    """Insert ``nodes`` (in topological order among themselves) into ``graph.node``, each right
    after the last node making one of its inputs (first when only graph inputs or initializers
    feed it), so a session that follows the list runs it as soon as it can, and the tensor it
    reads can go. ORT's default order (a walk up from the outputs) runs nodes appended at the end
    last, every tensor they read alive till then (eight observed 16 MB tensors: 160 MB at the
    run's peak); its priority-based order follows the list (48 MB), with the same results."""
    position = {t: i for i, node in enumerate(graph.node) for t in node.output}
    after: dict = {}
    for node in nodes:
        slot = max((position.get(t, -1) for t in node.input if t), default=-1)
        after.setdefault(slot, []).append(node)
        position.update((t, slot) for t in node.output)
    old = list(graph.node)
    del graph.node[:]
    graph.node.extend(after.get(-1, []))
    for i, node in enumerate(old):
        graph.node.append(node)
        graph.node.extend(after.get(i, []))


def _has_float16_weights(graph: onnx.GraphProto) -> bool:
    """Whether the main graph holds a float16 initializer (priority order pays only there: it
    costs ~10 % time on a float32 model's int8 calibration and changes nothing else)."""
    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer)


def weight_decoders(graph: onnx.GraphProto) -> int:
    """Bytes of the initializers that the main graph's ``Gather`` / ``GatherElements`` nodes reading
    constants only (initializers, ``Constant`` nodes and what other such nodes compute from them)
    decode: ``cluster``'s decoders, ``codebook[labels]`` — its labels, codebooks and scales.
    ORT's constant folding turns each decoder into a float initializer at session creation and
    holds every folded intermediate until it ends — the int32 indices alone are 4 bytes per
    label (issue 16's 2.75 GB decoder: its ``fuse,cluster`` output verified at 1.39× the model's
    size); a session with folding off (:func:`make_session`'s ``fold``) decodes each weight when a
    run reaches it, with the same values (a look-up is exact)."""
    sizes = {t.name: tensor_nbytes(t) or 0 for t in graph.initializer}
    sources = {name: (name,) for name in sizes}  # constant tensor -> the initializers it is made of
    decoded: set = set()
    for node in graph.node:  # topological order (a committed model's)
        inputs = [t for t in node.input if t]
        if (inputs or node.op_type == "Constant") and all(t in sources for t in inputs):
            made = tuple({name for t in inputs for name in sources[t]})
            sources.update((t, made) for t in node.output)
            if node.op_type in DECODERS:
                decoded.update(made)
    return sum(sizes[name] for name in decoded)


def defer_sourceless(graph: onnx.GraphProto) -> int:
    """Move each node that reads no other node's output (a ``Cast`` of a weight, a
    ``DequantizeLinear`` of a constant) right before the first node reading its outputs, in
    place; returns how many moved. A session in priority order (:func:`session_options` without
    pre-packing) follows the list, and onnx-graphsurgeon's toposort lists all such nodes first:
    every float32 copy of a float16 weight would be made before the first layer runs (fp16's
    trial emulations: 1.7 GB at the run's peak for a 933 MB decoder, one layer's worth so)."""
    nodes = list(graph.node)
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute):
        return 0  # bodies read outer tensors without naming them as inputs: left as they are
    made = {t for node in nodes for t in node.output}
    deferred = {i for i, node in enumerate(nodes) if node.output and not any(t in made for t in node.input if t)}
    if not deferred:
        return 0
    readers: dict = {}
    for i, node in enumerate(nodes):
        for t in node.input:
            readers.setdefault(t, i)
    before: dict = {}
    for i in sorted(deferred):
        first = min((readers[t] for t in nodes[i].output if t in readers), default=len(nodes))
        before.setdefault(first, []).append(i)
    order = []
    def place(j):
        for i in before.pop(j, []):
            place(i)  # a deferred node read by another deferred node goes before it
            order.append(nodes[i])
    for j, node in enumerate(nodes):
        if j not in deferred:
            place(j)
            order.append(node)
    place(len(nodes))
    del graph.node[:]
    graph.node.extend(order)
    return len(deferred)


STAND_IN = "stand-in"  # an empty file the stubs of initializers given in place name (ORT checks it exists)


def shared_root(skeleton: onnx.ModelProto, folder: str | None, tmp: str) -> str | None:
    """The external-data folder of a session whose weights lie in ``folder`` (the anchored ones,
    named relative to it) and in ``tmp``: the deepest folder holding both — ``skeleton``'s
    anchored tensors are renamed relative to it (never with ``..``, which ORT refuses).
    None when there is none (paths on different drives)."""
    if folder is None:
        return tmp
    try:
        root = os.path.commonpath([os.path.abspath(folder), os.path.abspath(tmp)])
    except ValueError:
        return None
    for tensor in _get_all_tensors(skeleton):
        if uses_external_data(tensor):
            info = ExternalDataInfo(tensor)
            where = os.path.relpath(os.path.join(folder, info.location), root)
            set_location(tensor, where, info.offset or 0, info.length or 0)
    return root


def _hand_over(moved: list, arrays: dict | None, in_place: bool, so: ort.SessionOptions, tmp: str,
               prefix: str) -> list:
    """Give ORT the tensors ``split_weights`` moved: with ``in_place``, those whose values are in
    ``arrays`` (a Model's own, in memory) as initializers it reads where they lie
    (``add_initializer``; their stubs name an empty stand-in file); the others written one at a
    time, page-aligned, to a spill file in ``tmp`` it maps. Returns the buffers the session runs on."""
    held = []
    with open(Path(tmp) / SPILL, "wb") as fh:
        for stub, tensor in moved:
            if in_place and arrays and tensor.name in arrays and tensor.data_location == onnx.TensorProto.EXTERNAL:
                array = _values(tensor, arrays)
                if not array.flags.aligned:  # ORT's kernels want aligned buffers
                    array = np.array(array)
                value = ort.OrtValue.ortvalue_from_numpy(array)
                so.add_initializer(tensor.name, value)
                held.append((array, value))
                set_location(stub, os.path.join(prefix, STAND_IN), 0, array.nbytes)
                continue
            start = -(-fh.tell() // 4096) * 4096  # page-aligned: ORT maps instead of reading
            fh.write(b"\0" * (start - fh.tell()))
            data = _values(tensor, arrays)
            fh.write(memoryview(data.reshape(-1).view(np.uint8)))
            set_location(stub, os.path.join(prefix, SPILL), start, data.nbytes)
    if held:
        open(Path(tmp) / STAND_IN, "wb").close()
    return held


def _copied(moved: list, arrays: dict | None, so: ort.SessionOptions) -> list:
    """``add_external_initializers``: ORT copies each array (+1× the moved weights)."""
    held = [_values(t, arrays) for _, t in moved]
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in held]
    for stub, _ in moved:
        set_location(stub, "in-memory", 0, 0)
    so.add_external_initializers([t.name for _, t in moved], values)
    return list(zip(held, values))


def add_outputs(proto: onnx.ModelProto, names: Iterable[str]) -> None:
    """Make ``proto``'s graph also output ``names`` (in place)."""
    existing = {o.name for o in proto.graph.output}
    known = {v.name: v for v in list(proto.graph.value_info) + list(proto.graph.input)}
    for name in names:
        if name in existing:
            continue
        if name in known:
            proto.graph.output.append(known[name])
        else:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
        existing.add(name)


EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
SPILL = "weights.bin"
SPLIT_MIN_BYTES = 1024


def _values(tensor: onnx.TensorProto, arrays: dict | None) -> np.ndarray:
    """The values of a tensor ``split_weights`` moved: from ``arrays`` for an in-memory stub."""
    source = arrays.get(tensor.name) if arrays and tensor.data_location == onnx.TensorProto.EXTERNAL else None
    if source is None:
        return np.ascontiguousarray(numpy_helper.to_array(tensor))
    if hasattr(source, "load"):  # onnx-graphsurgeon's lazy values: read from the source proto
        source = source.load()
    return np.ascontiguousarray(source)


def split_weights(proto: onnx.ModelProto, arrays: dict | None = None) -> tuple:
    """(skeleton, moved, folder): a copy of ``proto`` built field by field, whose large in-memory
    main-graph initializers are empty stubs — ``moved`` pairs each stub with its source tensor —
    and whose tensors left on disk (anchored, :mod:`.streaming`) name their files relative to
    ``folder`` (None when there are none).

    Initializers that are also graph inputs (overridable at run time), and types numpy cannot
    hold exactly, are copied as they are. ``arrays``: see :func:`make_session` (its stubs are
    always moved).
    """
    skeleton = onnx.ModelProto()
    copy_fields(proto, skeleton, skip=("graph",))
    copy_fields(proto.graph, skeleton.graph, skip=("initializer",))
    inputs = {i.name for i in proto.graph.input}
    moved = []
    for init in proto.graph.initializer:
        if arrays and init.name in arrays and init.data_location == onnx.TensorProto.EXTERNAL:
            stub = skeleton.graph.initializer.add()
            copy_fields_except_data(init, stub)
            moved.append((stub, init))
            continue
        if (is_anchored(init) or init.data_type not in NUMPY_DTYPES or init.name in inputs
                or tensor_nbytes(init) < SPLIT_MIN_BYTES):
            skeleton.graph.initializer.append(init)
            continue
        stub = skeleton.graph.initializer.add()
        copy_fields_except_data(init, stub)
        moved.append((stub, init))
    return skeleton, moved, relocate_anchored(skeleton)


def map_anchored(proto: onnx.ModelProto, location: str) -> dict:
    """Make ``proto`` (in place) loadable by a session whose external-data folder is not its
    weights' folder: returns {name: (array, OrtValue)} for its anchored main-graph initializers,
    read-only maps of their files (:func:`.streaming.tensor_array`: nothing read, nothing
    copied) to hand ORT with ``SessionOptions.add_initializer``; their stubs now name
    ``location`` in that folder (ORT checks the file exists; the initializer given replaces it
    unread). The caller keeps the arrays alive as long as the session. Anchored tensors that
    cannot be given so (in If/Loop bodies, Constant attributes, types numpy cannot map) get
    their bytes copied into the proto."""
    mapped = {}
    for init in proto.graph.initializer:
        if not is_anchored(init) or init.data_type not in NUMPY_DTYPES:
            continue
        array = tensor_array(init)
        if not array.flags.aligned:  # a map at an odd offset: ORT's kernels want aligned buffers
            array = np.array(array)
        mapped[init.name] = (array, ort.OrtValue.ortvalue_from_numpy(array))
        set_location(init, location, 0, array.nbytes)
    for tensor in _get_all_tensors(proto):
        if is_anchored(tensor):
            _embed(tensor)
    return mapped


def _embed(tensor: onnx.TensorProto) -> None:
    """Read an anchored tensor's bytes into its ``raw_data`` (no longer external)."""
    info = ExternalDataInfo(tensor)
    with open(info.location, "rb") as fh:
        fh.seek(info.offset or 0)
        data = fh.read(info.length if info.length else tensor_nbytes(tensor))
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = data


_FLOAT_INPUTS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}
# metadata key of models with integer inputs/outputs (int8 pass, io=uint8|int8): JSON
# {"inputs": {name: [scale, zero point]}, "outputs": {name: [scale, zero point]}}
INTEGER_IO_KEY = "onnxslim_kit.integer_io"


def integer_io(session: ort.InferenceSession) -> dict:
    """The integer input/output encodings a model declares (empty for ordinary models)."""
    cached = getattr(session, "_slim_integer_io", None)
    if cached is None:
        text = session.get_modelmeta().custom_metadata_map.get(INTEGER_IO_KEY)
        cached = json.loads(text) if text else {}
        session._slim_integer_io = cached
    return cached


def prepare_feed(session: ort.InferenceSession, sample: dict) -> dict:
    """The feed ``session.run`` accepts for one sample; extra keys in ``sample`` are ignored.

    Float arrays are cast to the float type the session declares for that input (a float16
    model with float16 inputs runs on the same float32 samples as the original). A model
    with integer inputs (``INTEGER_IO_KEY``) gets float samples quantized,
    ``q = clip(round(x / s) + z)``.
    """
    io = integer_io(session)
    feed = {}
    for spec in session.get_inputs():
        if spec.name not in sample:
            continue
        value = sample[spec.name]
        want = _FLOAT_INPUTS.get(spec.type)
        if want is not None and isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.dtype != want:
            value = value.astype(want)
        if spec.name in io.get("inputs", {}) and np.asarray(value).dtype.kind == "f":
            scale, zero = io["inputs"][spec.name]
            dtype = np.uint8 if spec.type == "tensor(uint8)" else np.int8
            info = np.iinfo(dtype)
            value = np.clip(np.round(np.asarray(value, np.float64) / scale) + zero, info.min, info.max).astype(dtype)
        feed[spec.name] = value
    return feed


def run(session: ort.InferenceSession, sample: dict) -> dict:
    """Run one sample (prepared by :func:`prepare_feed`); returns {output name: array}.

    A model with integer outputs (``INTEGER_IO_KEY``) returns them dequantized,
    ``(q − z) · s``, so it compares with the float model on the same samples.
    """
    io = integer_io(session)
    feed = prepare_feed(session, sample)
    outputs = [o.name for o in session.get_outputs()]
    values = dict(zip(outputs, session.run(outputs, feed)))
    for name, (scale, zero) in io.get("outputs", {}).items():
        if name in values:
            values[name] = ((values[name].astype(np.float32) - np.float32(zero)) * np.float32(scale))
    return values


TIMINGS_ENV = "ONNXSLIM_KIT_TIMINGS"  # a file: the default timing cache of the passes (``plan --timing-cache`` sets it)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what :mod:`platform` says: part of every timing
    cache key (the plan's and int8's layer timings)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
