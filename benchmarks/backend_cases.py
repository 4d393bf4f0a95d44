"""ONNX's own backend test cases as an oracle for the lossless passes (issue 15, the sweep).

The onnx wheel ships the *definitions* of its node tests (``onnx.backend.test.case.node``: each
``export_*`` builds a one-node model, its inputs and the expected outputs, and the op's function
expansion when the schema has one) and the *data* of a few model tests
(``backend/test/data/{simple,pytorch-converted,pytorch-operator}``: ``model.onnx`` +
``test_data_set_0/{input,output}_N.pb``; ``light``: a model and its expected output for the
input ``arange(n)/n`` that onnx's runner feeds it). This module turns both into :class:`Case`
objects and runs one case through a pass list:

1. **ORT reference**: ONNX Runtime (CPU, graph optimisations off) runs the original on the
   case's inputs; the case counts only if ORT passes the test itself, i.e. every output
   satisfies ``|got - expected| <= atol + rtol·|expected|`` elementwise (the case's own
   tolerances, as ``onnx.backend.test.runner`` checks them; NaN equal to NaN; exact for
   strings and booleans). Otherwise the case is *ORT-refused*, with ORT's reason.
2. **The tool**: ``onnxslim_kit.optimize(model, passes, calib=[inputs], verify=True)``
   in-process, under a per-case timeout; with ``allow_nan=True`` where the test's inputs hold
   NaN (28 tests feed NaN by design: IsNaN, Cast edge cases, a tree ensemble's "missing" value),
   the default (NaN refused) everywhere else. Inputs that are sequences or optionals go as the
   test gives them (lists, ``None``). Outcomes:

   * ``ok`` — ran, nothing rolled back, the written model reproduces the expected outputs
     under the same rule as (1);
   * ``refused`` — the tool raised an error with exit code 2 (a user error), reason kept;
   * ``crash`` — any other exception (exit 1: a bug);
   * ``rollback`` — verification undid a lossless pass (a bug: a rewrite changed outputs);
   * ``mismatch`` — the written model does not run, or disagrees with the expected outputs
     where the original did not (a bug: a wrong model was written);
   * ``input-modified`` — the caller's ModelProto changed (a bug);
   * ``timeout`` — over the per-case limit.

Reasons are reduced to *kinds* for counting (:func:`reason_kind`: quoted names and numbers
replaced) so ``Could not find an implementation for X(7)`` counts once per op family.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import signal
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nph

PASS_LISTS = ("fuse", "fuse,compact", "prune(target=none)")  # prune's lossless strip
DATA_KINDS = ("simple", "pytorch-converted", "pytorch-operator", "light")
BUG_STATUSES = ("crash", "rollback", "mismatch", "input-modified", "timeout")


@dataclasses.dataclass
class Case:
    name: str
    kind: str  # node, simple, pytorch-converted, pytorch-operator, light
    model: onnx.ModelProto
    feeds: dict
    expected: list
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclasses.dataclass
class Outcome:
    case: str
    passes: str
    status: str  # ok, refused, crash, rollback, mismatch, input-modified, timeout
    reason: str = ""

    @property
    def kind(self) -> str:
        return reason_kind(self.reason)


# --- collecting cases ---------------------------------------------------------------------


def _normalize(value):
    if isinstance(value, onnx.TensorProto):
        return nph.to_array(value)
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, np.generic):  # some cases give a numpy scalar for a 0-d input
        return np.asarray(value)
    return value


def _feeds(model: onnx.ModelProto, inputs) -> dict:
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return {n: _normalize(v) for n, v in zip(names, inputs)}


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")
    return ctx


def node_cases(modules=None) -> list:
    """The node tests onnx generates: all of them, or those of ``modules`` (names under
    ``onnx.backend.test.case.node``, e.g. ``"gemm"``), in onnx's order."""
    ctx = _quiet()
    try:
        import onnx.backend.test.case.node as node_pkg

        if modules is None:
            cases = list(node_pkg.collect_testcases())
        else:
            cases = []
            for mod in modules:
                full = f"{node_pkg.__name__}.{mod}"
                if full in sys.modules:  # generated before (e.g. by collect_testcases): find them again
                    cases.extend(_already_generated(node_pkg, sys.modules[full]))
                    continue
                start = len(node_pkg._NodeTestCases)
                importlib.import_module(full)
                cases.extend(node_pkg._NodeTestCases[start:])
    finally:
        ctx.__exit__(None, None, None)
    return [Case(t.name, "node", t.model, _feeds(t.model, t.data_sets[0][0]),
                 [_normalize(v) for v in t.data_sets[0][1]], t.rtol, t.atol) for t in cases]


def _already_generated(node_pkg, module) -> list:
    from onnx.backend.test.case.base import Base

    ops = {v.__name__ for v in vars(module).values()
           if isinstance(v, type) and issubclass(v, Base) and v is not Base}
    plain = {t.name for t in node_pkg._NodeTestCases
             if len(t.model.graph.node) == 1 and t.model.graph.node[0].op_type in ops}
    return [t for t in node_pkg._NodeTestCases
            if t.name in plain or t.name.split("_expanded")[0] in plain]


def _data_root() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def _read_value(path: Path, type_proto: onnx.TypeProto):
    data = path.read_bytes()
    which = type_proto.WhichOneof("value")
    if which == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return nph.to_list(proto)
    if which == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return nph.to_optional(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return nph.to_array(proto)


def _dir_case(kind: str, folder: Path) -> Case:
    model = onnx.load(str(folder / "model.onnx"))
    inits = {t.name for t in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    data = folder / "test_data_set_0"
    feeds = {vi.name: _read_value(data / f"input_{k}.pb", vi.type) for k, vi in enumerate(ins)
             if (data / f"input_{k}.pb").exists()}
    expected = [_read_value(data / f"output_{k}.pb", vi.type) for k, vi in enumerate(model.graph.output)]
    return Case(f"{kind}/{folder.name}", kind, model, feeds, expected)


def _light_case(path: Path) -> Case:
    """As ``onnx.backend.test.runner`` feeds a light model: ``arange(n)/n`` (float32, free dims 1)."""
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    expected = []
    for k in range(len(model.graph.output)):
        out = path.with_name(f"{path.stem}_output_{k}.pb")
        expected.append(_read_value(out, model.graph.output[k].type))
    tol = 2e-3 if "densenet" in path.stem else 1e-3  # onnx's own (backend/test/case/model)
    return Case(f"light/{path.stem}", "light", model, feeds, expected, tol, 1e-7)


def data_cases(kinds=DATA_KINDS, names=None) -> list:
    """The model tests whose data the wheel ships; ``names`` keeps only those case names."""
    root, cases = _data_root(), []
    for kind in kinds:
        if kind == "light":
            paths = sorted((root / "light").glob("light_*.onnx"))
            found = [(f"light/{p.stem}", p) for p in paths]
            cases += [_light_case(p) for n, p in found if names is None or n in names]
        else:
            found = [(f"{kind}/{d.name}", d) for d in sorted((root / kind).iterdir()) if (d / "model.onnx").exists()]
            cases += [_dir_case(kind, d) for n, d in found if names is None or n in names]
    return cases


# --- comparing -------------------------------------------------------------------------------


def _close(expected, got, rtol: float, atol: float) -> str:
    """'' when ``got`` matches ``expected`` (the backend runner's rule), else why not."""
    if isinstance(expected, list) or isinstance(got, list):
        if not isinstance(expected, list) or not isinstance(got, list) or len(expected) != len(got):
            return "sequence length or kind differs"
        return next((w for w in (_close(e, g, rtol, atol) for e, g in zip(expected, got)) if w), "")
    if expected is None or got is None:
        return "" if expected is None and got is None else "optional presence differs"
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        return f"shape {got.shape} != expected {expected.shape}"
    if expected.dtype.kind in "OUSb" or got.dtype.kind in "OUSb":
        return "" if np.array_equal(expected.astype(object), got.astype(object)) else "values differ"
    if expected.dtype != got.dtype and not (expected.dtype.kind == got.dtype.kind):
        return f"dtype {got.dtype} != expected {expected.dtype}"
    e, g = expected.astype(np.float64), got.astype(np.float64)
    bad = ~((np.abs(e - g) <= atol + rtol * np.abs(e)) | (np.isnan(e) & np.isnan(g)) | (e == g))
    if bad.any():
        return f"{int(bad.sum())}/{bad.size} elements off, max |diff| {float(np.nanmax(np.abs(e - g))):.3g}"
    return ""


def compare(expected: list, got: list, rtol: float, atol: float) -> str:
    with _quiet_numpy():
        return _compare(expected, got, rtol, atol)


def _compare(expected: list, got: list, rtol: float, atol: float) -> str:
    if len(expected) != len(got):
        return f"{len(got)} outputs != expected {len(expected)}"
    for k, (e, g) in enumerate(zip(expected, got)):
        why = _close(e, g, rtol, atol)
        if why:
            return f"output {k}: {why}"
    return ""


def run_ort(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def reason_kind(reason: str) -> str:
    """A reason with its particulars removed, for counting."""
    text = reason.splitlines()[0] if reason else ""
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : ", "", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\(\d+\)", "(N)", text)
    text = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", text)
    text = re.sub(r"(for|implementation for) [A-Z]\w+\(N\)", r"\1 <op>(N)", text)
    text = re.sub(r"/[\w./-]+:N", "<src>", text)
    return text[:140]


def ort_reference(case: Case) -> str:
    """'' when ORT passes ``case`` itself, else ORT's reason (its failure or the mismatch)."""
    try:
        with _quiet_numpy():
            got = run_ort(case.model, case.feeds)
    except Exception as exc:  # noqa: BLE001 — any ORT failure is the reason
        return f"ORT: {type(exc).__name__}: {exc}".splitlines()[0]
    why = compare(case.expected, got, case.rtol, case.atol)
    return f"ORT disagrees with the expected outputs: {why}" if why else ""


@contextlib.contextmanager
def _quiet_numpy():
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --- running the tool ------------------------------------------------------------------------


class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):  # noqa: ARG001
        raise CaseTimeout(f"over {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _crash_text(exc: BaseException) -> str:
    root = exc.__cause__ or exc
    frames = traceback.extract_tb(root.__traceback__)
    ours = [f for f in frames if "onnxslim_kit" in f.filename or "/passes/" in f.filename] or frames
    where = f" at {Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else ""
    return f"{type(root).__name__}: {root}".splitlines()[0][:300] + where


def holds_nan(value) -> bool:
    """Whether a feed value (an array, or a list / dict / optional of them) holds a NaN."""
    if isinstance(value, dict):
        return any(holds_nan(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_nan(v) for v in value)
    return isinstance(value, np.ndarray) and value.dtype.kind == "f" and bool(np.isnan(value).any())


def run_case(case: Case, passes: str, timeout: float = 60.0) -> Outcome:
    """One pass list on one case that ORT passes (see the module docstring for the outcomes)."""
    import onnxslim_kit

    before = case.model.SerializeToString()
    try:
        with _time_limit(timeout), _quiet_numpy():
            proto, report = onnxslim_kit.optimize(
                case.model, passes, calib=[case.feeds], verify=True, verify_samples=1, num_samples=1,
                allow_nan=holds_nan(case.feeds))
    except CaseTimeout as exc:
        return Outcome(case.name, passes, "timeout", str(exc))
    except Exception as exc:  # noqa: BLE001 — classified, not hidden
        if getattr(exc, "exit_code", 1) == 2:
            return Outcome(case.name, passes, "refused", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return Outcome(case.name, passes, "crash", _crash_text(exc))
    if case.model.SerializeToString() != before:
        return Outcome(case.name, passes, "input-modified", "the caller's model changed")
    rolled = [p for p in report.passes if p.rolled_back]
    if rolled:
        p = rolled[0]
        v = p.verification or {}
        return Outcome(case.name, passes, "rollback", f"{p.name}: {v.get('message') or v.get('status')}"[:300])
    try:
        with _quiet_numpy():
            got = run_ort(proto, case.feeds)
    except Exception as exc:  # noqa: BLE001
        return Outcome(case.name, passes, "mismatch", f"written model does not run: {exc}".splitlines()[0][:300])
    why = compare(case.expected, got, case.rtol, case.atol)
    return Outcome(case.name, passes, "mismatch", why) if why else Outcome(case.name, passes, "ok")
