"""The data feed: one re-iterable source of input samples for calibration, importance
scoring, re-fitting and verification.

Sources (``CalibrationFeed(specs, source)``):

* ``None`` — samples generated from the input spec, deterministic (seeded): float inputs
  ~ N(0, 1), integer inputs uniform in [0, 16) — or [0, n) when they index a constant table
  of n rows through Gather (token-type ids of a BERT have n = 2),
  booleans fair coin flips, strings short ASCII words (the strings a LabelEncoder /
  CategoryMapper / DictVectorizer of the graph reads the input against when it has them, else
  :data:`.value_types.WORDS`), drawn with the same seed.
* a ``.npz`` file — keys are input names; an array whose rank is the input's rank + 1 is a
  stack of samples along axis 0, otherwise the file is one sample.
* a ``.npy`` file — the same, for single-input models.
* a folder — every ``.npz``/``.npy`` in it, in sorted name order.
* a Python sequence of ``{input name: array}`` dicts, or a callable returning an iterable
  of them (called again on each pass over the data).
* an ONNX Runtime ``CalibrationDataReader`` (any object with ``get_next()`` returning a dict,
  then ``None`` at the end): with a ``rewind()`` method it is rewound and read again on each
  pass over the data; without one it is read once into memory (the log says so).

Inputs that are not plain tensors (sequences, maps, optionals, and their nestings —
:func:`.value_types.input_layout`) are described by the spec's ``wrappers`` around the innermost
tensor its ``dtype`` / ``shape`` describe (a shape unknown for an element type without one:
generated as a 1-D of one value, any rank accepted); a sample holds them as ORT's Python API
takes them (a list, a dict, the element or ``None``), generated and read from ``.npz`` files as
:mod:`.value_types` says (``NAME/0``, ``NAME/1``, … for a sequence). ``--input-shape`` of such
an input fixes its tensors' shape. String inputs given as numpy ``U`` / ``S`` arrays (what
``.npz`` stores) become the object arrays of ``str`` ORT takes (``S`` decoded as UTF-8).

Every sample is checked as it is read: the input names, ranks, fixed dimensions and dtype
kinds; and, for float inputs, that no value is NaN and that the cast to the input's dtype
makes no inf (a float64 1e6 fed to a float16 input). Those are refused with the source, the
sample's index (0-based: its position along a file's stacking axis, in a list, or in a
function's / reader's sequence) and the counts — NaN would make every min/max/histogram NaN,
and a quantization scale computed from it quantizes nothing. An inf the data itself holds is
kept (an attention mask's −inf: 24 of ONNX's attention backend tests) and logged once per input.
``allow_nan=True`` (``--allow-nan``) keeps NaN too, for models where NaN is a legitimate input
value ("missing": tree ensembles, IsNaN, Cast / Mod edge cases); it is meant for lossless passes,
whose verification compares NaN positions as equal (:func:`.metrics.compare`); ``nan_reason``
replaces the refusal's reason (:func:`onnxslim_kit.optimize` refuses NaN for lossy passes even
with ``allow_nan``: a min/max, histogram or Hessian statistic over NaN is NaN).

``transform`` (as ``nncf.Dataset(data, transform_fn)``): applied to every item of a given
source before it is checked, so the source may hold anything (``(image, label)`` pairs, file
names) and ``transform(item)`` returns the ``{input name: array}`` dict.

Dynamic dimensions are fixed by ``input_shapes`` (``{"x": [1, 3, 224, 224]}``); when not
given, a leading symbolic dimension is taken as batch 1 and any other as 64 (a ``dim_value``
of 0 is a fixed, empty dimension: ORT refuses any other size).

Generated integer inputs take the values the graph implies where one node reads them
(:data:`VALUE_ROLES`, through Cast / Identity): indices uniform below the size of the axis
they index (a constant's or another input's), a Reshape target ``[1, …, 1, -1]``, Expand /
Tile ``1`` s, Unsqueeze / Reduce axes ``0 … k-1``, Slice starts 0, ends 2³¹-1, steps 1,
Split sizes adding up to the axis, a Div / Mod divisor in [1, 16), Range 0 → 8 step 1; and
float inputs with a valid range: Resize / Upsample scales 1, a Dropout ratio 0, an NMS IoU
threshold 0.5 and score threshold 0, a OneHot depth 16.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import onnx

from .errors import UserError
from .value_types import MAP_SIZE, WORDS, check_value, describe, generate_value, input_layout, npz_value

logger = logging.getLogger("onnxslim_kit")

DEFAULT_DYNAMIC_DIM = 64
DEFAULT_INT_HIGH = 16
INDEX_PASS_THROUGH = ("Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity")


# what the graph implies about an integer input's values, by (op type, input index): an
# input read there gets data it can run on (see :func:`_int_role` and :func:`_role_values`)
VALUE_ROLES = {
    ("Reshape", 1): "reshape", ("Expand", 1): "ones", ("Tile", 1): "ones", ("ConstantOfShape", 0): "ones",
    ("Unsqueeze", 1): "range", ("Slice", 1): "zeros", ("Slice", 2): "large", ("Slice", 3): "range",
    ("Slice", 4): "ones", ("TopK", 1): "ones", ("Pad", 1): "zeros", ("Pad", 3): "range",
    ("Range", 0): "zeros", ("Range", 1): "eight", ("Range", 2): "ones", ("CumSum", 1): "zeros",
    ("OneHot", 1): "sixteen", ("Trilu", 1): "zeros", ("Div", 1): "nonzero", ("Mod", 1): "nonzero",
    ("Gather", 1): "index", ("GatherElements", 1): "index", ("ScatterElements", 1): "index", ("Split", 1): "split",
    ("SplitToSequence", 1): "split", ("Col2Im", 1): "eight", ("Col2Im", 2): "ones",
    # float inputs with a valid range: scales > 0, a dropout ratio in [0, 1), thresholds
    ("Resize", 2): "ones", ("Upsample", 1): "ones", ("Dropout", 1): "zeros",
    ("NonMaxSuppression", 3): "half", ("NonMaxSuppression", 4): "zeros",
    **{(op, 1): "range" for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                   "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
VALUE_PASS_THROUGH = ("Cast", "Identity")


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple  # ints, or str/None for dynamic dimensions
    int_high: int = DEFAULT_INT_HIGH  # generated integer data is uniform in [0, int_high)
    # what the graph implies for a generated integer input: () none, else (kind, data, axis) —
    # kind from VALUE_ROLES; data/axis: the tensor (input name or constant dims) an index or
    # split input refers to
    role: tuple = ()
    # an input that is not a plain tensor: the chain of "optional" / "sequence" / "map" around
    # the innermost tensor that dtype / shape describe (:func:`.value_types.input_layout`)
    wrappers: tuple = ()
    key_dtype: np.dtype | None = None  # a map's keys
    rank_known: bool = True  # False: an element type without a shape (any rank accepted)
    words: tuple = ()  # strings / map keys the graph reads the input against (generated from them)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def kind_text(self) -> str:
        return describe(self.wrappers, self.dtype)


def input_specs(proto: onnx.ModelProto) -> list:
    """The graph inputs that are real inputs (initializers listed as inputs excluded)."""
    initializers = {t.name for t in proto.graph.initializer}
    return [_input_spec(proto.graph, value) for value in proto.graph.input if value.name not in initializers]


def _dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)) if elem_type else np.dtype(np.float32)


def _input_spec(graph: onnx.GraphProto, value: onnx.ValueInfoProto) -> InputSpec:
    layout = input_layout(value.type)
    if layout is None:
        raise UserError(f"input {value.name!r} is of type {value.type.WhichOneof('value')}, "
                        "which the data feed cannot give (tensors, sequences, maps and optionals only)")
    wrappers, elem_type, dims, key_type = layout
    dtype = _dtype(elem_type)
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims or [])
    words = _vocabulary(graph, value.name)
    if wrappers:
        return InputSpec(value.name, dtype, shape if dims is not None else (None,), wrappers=wrappers,
                         key_dtype=_dtype(key_type) if key_type else None, rank_known=dims is not None, words=words)
    integer = dtype.kind in "iu"
    high = _index_bound(graph, value.name) if integer else None
    role = _int_role(graph, value.name) if (integer or dtype.kind == "f") and high is None else ()
    return InputSpec(value.name, dtype, shape, min(high or DEFAULT_INT_HIGH, DEFAULT_INT_HIGH), role, words=words)


# (op type, attribute): the strings / integer keys a node compares its first input with
VOCABULARY = (("LabelEncoder", "keys_strings"), ("CategoryMapper", "cats_strings"),
              ("DictVectorizer", "string_vocabulary"), ("DictVectorizer", "int64_vocabulary"))


def _vocabulary(graph: onnx.GraphProto, name: str) -> tuple:
    """The strings (or a DictVectorizer's integer keys) the first node reading ``name`` directly
    compares it with, from :data:`VOCABULARY`; () when none."""
    for node in graph.node:
        if not node.input or node.input[0] != name:
            continue
        for attribute in node.attribute:
            if (node.op_type, attribute.name) in VOCABULARY:
                found = onnx.helper.get_attribute_value(attribute)
                return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else int(v) for v in found)
    return ()


def _int_role(graph: onnx.GraphProto, name: str) -> tuple:
    """What the first node that reads integer (or float) input ``name`` (directly or through Cast /
    Identity) needs of its values: ``(kind, data, axis)``, kind from :data:`VALUE_ROLES`;
    for ``index`` / ``split`` the tensor they refer to (a graph input's name, or a constant's
    dims) and the axis. ``()`` when nothing is implied."""
    tables = {t.name: tuple(t.dims) for t in graph.initializer}
    todo, seen = [name], set()
    while todo:
        tensor = todo.pop(0)
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in graph.node:
            for index, read in enumerate(node.input):
                if read != tensor:
                    continue
                kind = VALUE_ROLES.get((node.op_type, index))
                if kind is not None:
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    data = node.input[0]
                    return kind, tables.get(data, data), int(axis)
                if node.op_type in VALUE_PASS_THROUGH:
                    todo.extend(node.output)
    return ()


def _index_bound(graph: onnx.GraphProto, name: str) -> int | None:
    """Smallest table size among the constant ``Gather`` tables that ``name`` indexes
    (directly or through Cast / Unsqueeze / Reshape …): generated ids must stay below it."""
    tables = {t.name: t.dims for t in graph.initializer}
    readers = {}
    for node in graph.node:
        for i, tensor in enumerate(node.input):
            readers.setdefault(tensor, []).append((node, i))
    bounds, todo, seen = [], [name], set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, index in readers.get(tensor, []):
            if node.op_type == "Gather" and index == 1 and node.input[0] in tables:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                dims = tables[node.input[0]]
                if dims:
                    bounds.append(int(dims[axis]))
            elif node.op_type in INDEX_PASS_THROUGH and index == 0:
                todo.extend(node.output)
    return min(bounds) if bounds else None


def parse_input_shapes(items: Iterable[str]) -> dict:
    """``["x:1,3,224,224", "ids:1,128"]`` → ``{"x": [1, 3, 224, 224], "ids": [1, 128]}``."""
    shapes = {}
    for item in items or []:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise UserError(f"--input-shape {item!r}: expected name:d1,d2,... (e.g. x:1,3,224,224)")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()] if dims.strip() else []
        except ValueError:
            raise UserError(f"--input-shape {item!r}: dimensions must be integers") from None
    return shapes


def take(samples, n: int) -> list:
    """The first ``n`` samples of a re-iterable feed (no more are read)."""
    out = []
    for sample in samples:
        if len(out) >= n:
            break
        out.append(sample)
    return out


class CalibrationFeed:
    """Re-iterable samples (``dict`` of input name → array)."""

    def __init__(
        self,
        specs: list,
        source=None,
        input_shapes: dict | None = None,
        num_samples: int = 8,
        seed: int = 0,
        transform: Callable | None = None,
        role: str = "calibration",
        allow_nan: bool = False,
        nan_reason: str = "",
    ):
        self.role = role  # "calibration" or "evaluation": the word the error messages use
        self.specs = list(specs)
        self.input_shapes = dict(input_shapes or {})
        unknown = set(self.input_shapes) - {s.name for s in self.specs}
        if unknown:
            raise UserError(
                f"--input-shape names {', '.join(sorted(unknown))} which are not inputs; "
                f"inputs: {', '.join(s.name for s in self.specs)}"
            )
        for spec in self.specs:
            if spec.name in self.input_shapes and spec.rank_known and len(self.input_shapes[spec.name]) != spec.rank:
                raise UserError(
                    f"--input-shape {spec.name}: rank {len(self.input_shapes[spec.name])}, "
                    f"the model's input has rank {spec.rank}"
                )
        self.num_samples = num_samples
        self.seed = seed
        self.generated = source is None
        if transform is not None and source is None:
            raise UserError("transform= needs a data source (calib=...) to transform")
        if transform is not None and not callable(transform):
            raise UserError(f"transform= must be a function of one sample, not {type(transform).__name__}")
        self.transform = transform
        self.allow_nan, self.nan_reason = bool(allow_nan), nan_reason
        self.int_fill = {}  # input name → constant value of generated integer data (a variant)
        self._factory = self._make_factory(source)

    # --- public ------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        return iter(self._factory())

    def take(self, n: int) -> list:
        return take(self, n)

    def count(self) -> int:
        """Number of samples (iterates once; not ``__len__``, which ``list()`` would call)."""
        return sum(1 for _ in self)

    def concrete_shape(self, spec: InputSpec) -> list:
        if spec.name in self.input_shapes:
            return list(self.input_shapes[spec.name])
        return [  # a dim_value of 0 is a size ORT holds the input to (an empty tensor), not a free one
            d if isinstance(d, int) and d >= 0 else (1 if i == 0 else DEFAULT_DYNAMIC_DIM)
            for i, d in enumerate(spec.shape)
        ]

    # --- sources -----------------------------------------------------------------
    def _make_factory(self, source) -> Callable[[], Iterable[dict]]:
        if source is None:
            return self._generated
        if callable(getattr(source, "get_next", None)):
            return self._reader_factory(source)
        if callable(source):
            return lambda: (self._item(s, i) for i, s in enumerate(source()))
        if isinstance(source, (str, Path)):
            samples = [self._transformed(s, i) for i, s in enumerate(self._load_path(Path(source)))]
            return lambda: iter(samples)
        if isinstance(source, dict) and self.transform is None:
            samples = self._split(source, f"{self.role} dict")
            return lambda: iter(samples)
        try:
            items = iter(source)
        except TypeError:
            raise UserError(
                f"{self.role} data: a {type(source).__name__} is not a source; give a path, a list of "
                "{input: array} dicts, a function returning them, or an object with get_next()"
            ) from None
        samples = [self._item(s, i) for i, s in enumerate(items)]
        return lambda: iter(samples)

    def _reader_factory(self, reader) -> Callable[[], Iterable[dict]]:
        """An ONNX Runtime ``CalibrationDataReader``: ``get_next()`` until ``None``."""
        def read() -> Iterator[dict]:
            index = 0
            while (item := reader.get_next()) is not None:
                yield self._item(item, index)
                index += 1

        rewind = getattr(reader, "rewind", None)
        if callable(rewind):
            def again() -> Iterator[dict]:
                rewind()
                return read()
            return again
        samples = list(read())
        logger.info(f"{self.role} reader {type(reader).__name__} has no rewind(): "
                    f"its {len(samples)} samples were read once into memory")
        return lambda: iter(samples)

    def _item(self, item, index: int | None = None) -> dict:
        if self.transform is not None:
            item = self.transform(item)
        if not isinstance(item, dict):
            raise UserError(f"{self.role} sample: expected a dict of input name → array, got {type(item).__name__}"
                            + ("" if self.transform is None else " from transform"))
        return self._checked(item, f"{self.role} sample" if index is None else f"{self.role} sample {index}")

    def _transformed(self, sample: dict, index: int | None = None) -> dict:
        return sample if self.transform is None else self._item(sample, index)

    def _generated(self) -> Iterator[dict]:
        rng = np.random.default_rng(self.seed)
        for _ in range(self.num_samples):
            sample = {}
            for spec in self.specs:
                shape = self.concrete_shape(spec)
                if spec.wrappers:
                    keys = list(spec.words[:MAP_SIZE]) or (
                        list(WORDS[:MAP_SIZE]) if spec.key_dtype is not None and spec.key_dtype.kind in "OSU"
                        else list(range(MAP_SIZE)))
                    sample[spec.name] = generate_value(spec.wrappers, lambda: self._tensor(spec, shape, rng), keys)
                else:
                    sample[spec.name] = self._tensor(spec, shape, rng)
            yield sample

    def _tensor(self, spec: InputSpec, shape: list, rng) -> np.ndarray:
        """One generated tensor of ``spec``'s dtype and ``shape`` (the module docstring's rules)."""
        kind = spec.dtype.kind
        values = _role_values(spec.role, shape, self._dims, rng) if spec.role and kind == "f" else None
        if values is not None:
            return np.asarray(values, dtype=spec.dtype).reshape(shape)
        if kind == "f":
            return np.asarray(rng.standard_normal(shape), dtype=spec.dtype)
        if kind in "iu":
            return self._integers(spec, shape, rng)
        if kind == "b":
            return np.asarray(rng.random(shape) < 0.5)
        if kind in "OSU" and spec.dtype == np.dtype(object):  # ONNX strings
            words = [w for w in spec.words if isinstance(w, str)] or list(WORDS)
            return np.array(words, dtype=object)[rng.integers(0, len(words), size=shape)]
        raise UserError(f"cannot generate data for input {spec.name!r} of type {spec.dtype}; pass --calib")

    def _integers(self, spec: InputSpec, shape: list, rng) -> np.ndarray:
        """Generated integer data: what the graph implies (``spec.role``), the fill of a derived
        variant (``int_fill``), else uniform in [0, int_high)."""
        fill = self.int_fill.get(spec.name)
        if fill is None and spec.role:
            values = _role_values(spec.role, shape, self._dims, rng)
            if values is not None:
                return np.asarray(values, dtype=spec.dtype).reshape(shape)
        if fill is not None:
            return np.full(shape, fill, dtype=spec.dtype)
        return np.asarray(rng.integers(0, spec.int_high, size=shape), dtype=spec.dtype)

    def _dims(self, name: str) -> list | None:
        """The generated shape of input ``name`` (None when it is no input)."""
        spec = next((s for s in self.specs if s.name == name), None)
        return None if spec is None else self.concrete_shape(spec)

    def variant(self, input_shapes: dict | None = None, int_fill: dict | None = None) -> "CalibrationFeed":
        """The same generated feed with other shapes for some inputs and constant values for
        some integer inputs (the bounded search of :func:`.verify.fit_generated`)."""
        feed = CalibrationFeed(self.specs, None, {**self.input_shapes, **(input_shapes or {})},
                               num_samples=self.num_samples, seed=self.seed, allow_nan=self.allow_nan)
        feed.int_fill = {**self.int_fill, **(int_fill or {})}
        return feed

    def dynamic_dims(self) -> list:
        """(input, axis) of the generated dimensions not fixed by the model or ``input_shapes``:
        every dynamic axis but a leading one (batch 1) — of a rank-1 input too (samples)."""
        out = []
        for spec in self.specs:
            if spec.name in self.input_shapes or not spec.rank_known:
                continue
            out.extend((spec.name, i) for i, d in enumerate(spec.shape)
                       if not (isinstance(d, int) and d >= 0) and (i > 0 or spec.rank == 1))
        return out

    def _load_path(self, path: Path) -> list:
        if not path.exists():
            raise UserError(f"--calib {path}: no such file or folder")
        files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy")) if path.is_dir() else [path]
        if not files:
            raise UserError(f"--calib {path}: the folder holds no .npz or .npy files")
        samples = []
        for file in files:
            samples.extend(self._split(self._read(file), str(file)))
        return samples

    def _read(self, file: Path) -> dict:
        try:
            if file.suffix == ".npz":
                with np.load(file, allow_pickle=False) as data:
                    return {key: data[key] for key in data.files}
            if file.suffix == ".npy":
                if len(self.specs) != 1:
                    raise UserError(
                        f"--calib {file}: a .npy file can only feed a single-input model; "
                        f"this model has inputs {', '.join(s.name for s in self.specs)} (use .npz)"
                    )
                return {self.specs[0].name: np.load(file, allow_pickle=False)}
        except (OSError, ValueError) as exc:
            raise UserError(f"--calib {file}: unreadable ({exc})") from None
        raise UserError(f"--calib {file}: expected a .npz or .npy file")

    def _split(self, arrays: dict, where: str) -> list:
        """One sample, or a stack of samples (rank + 1) split along axis 0."""
        arrays = dict(arrays)
        for spec in self.specs:
            if spec.wrappers and spec.name not in arrays:
                try:
                    arrays[spec.name] = npz_value(arrays, spec.name, spec.wrappers)
                except KeyError:
                    continue
                except UserError as exc:
                    raise UserError(f"{where}: {exc}") from None
        names = {s.name for s in self.specs}
        missing = names - set(arrays)
        if missing:
            raise UserError(
                f"{where}: missing inputs {', '.join(sorted(missing))}; keys must be the input names "
                f"({', '.join(s.name for s in self.specs)})"
            )
        stacked = {s.name: not s.wrappers and np.asarray(arrays[s.name]).ndim == s.rank + 1 for s in self.specs}
        if all(stacked.values()) and self.specs:
            count = len(arrays[self.specs[0].name])
            return [self._checked({s.name: arrays[s.name][i] for s in self.specs}, f"{where}: sample {i}")
                    for i in range(count)]
        return [self._checked({s.name: arrays[s.name] for s in self.specs}, where)]

    def _checked(self, sample: dict, where: str = "calibration sample") -> dict:
        out = {}
        for spec in self.specs:
            if spec.name not in sample:
                raise UserError(f"{where}: no value for input {spec.name!r}")
            label = f"{where}: input {spec.name!r}"
            if spec.wrappers:
                key_kind = "O" if spec.key_dtype is not None and spec.key_dtype.kind in "OSU" else "i"
                out[spec.name] = check_value(sample[spec.name], spec.wrappers,
                                             lambda v, text, spec=spec: self._checked_tensor(v, spec, text),
                                             key_kind, label)
            else:
                out[spec.name] = self._checked_tensor(sample[spec.name], spec, label)
        return out

    def _checked_tensor(self, value, spec: InputSpec, label: str) -> np.ndarray:
        """One tensor of a sample checked against ``spec`` (``label``: "where: input 'x' …")."""
        value = np.asarray(value)
        if spec.rank_known and value.ndim != spec.rank:
            raise UserError(f"{label} has rank {value.ndim}, the model expects {spec.rank}")
        for axis, (got, want) in enumerate(zip(value.shape, spec.shape if spec.rank_known else ())):
            if isinstance(want, int) and want > 0 and got != want:
                raise UserError(f"{label} dimension {axis} is {got}, the model expects {want}")
        if spec.dtype == np.dtype(object) and value.dtype.kind in "US":
            return _strings(value, label)
        given_inf = int(np.count_nonzero(np.isinf(value))) if value.dtype.kind == "f" else 0
        if value.dtype != spec.dtype:
            if value.dtype.kind != spec.dtype.kind and not (value.dtype.kind in "iu" and spec.dtype.kind in "iu"):
                raise UserError(f"{label} is {value.dtype}, the model expects {spec.kind_text()}")
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, as inf
                value = value.astype(spec.dtype)
        if value.dtype.kind == "f":
            _check_finite(value, spec, label, given_inf, self.allow_nan, self.nan_reason)
        return value


def _strings(value: np.ndarray, label: str) -> np.ndarray:
    """A ``U`` / ``S`` array (``.npz`` stores strings so) as the object array of ``str`` ORT takes."""
    if value.dtype.kind == "S":
        try:
            value = np.char.decode(value, "utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{label}: bytes that are not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return value.astype(object)


def _role_values(role: tuple, shape: list, dims: Callable, rng) -> np.ndarray | None:
    """Values an integer input of ``shape`` can run with, for its role ``(kind, data, axis)``
    (:func:`_int_role`): a Reshape target ``[1, …, 1, -1]`` (any size fits), Expand / Tile
    ``1`` s, Unsqueeze / Reduce axes ``0 … k-1``, Slice starts 0 / ends "to the end" / steps 1,
    Range 0 → 8 step 1, a divisor ≥ 1, indices below the referred axis' size, split sizes
    adding up to it. None when the data it refers to has no known size."""
    kind, data, axis = role
    count = int(np.prod(shape)) if shape else 1
    simple = {"ones": 1, "zeros": 0, "half": 0.5, "eight": 8, "sixteen": 16, "large": 2**31 - 1}
    if kind in simple:
        return np.full(count, simple[kind])
    if kind == "range":
        return np.arange(count)
    if kind == "reshape":
        return np.array([1] * (count - 1) + [-1]) if count else np.zeros(0)
    if kind == "nonzero":
        return rng.integers(1, DEFAULT_INT_HIGH, size=count)
    size = _axis_size(data, axis, dims)
    if size is None:
        return None
    if kind == "index":
        return rng.integers(0, max(size, 1), size=count)
    if kind == "split" and count and size >= count:
        return np.array([size // count] * (count - 1) + [size - (size // count) * (count - 1)])
    return None


def _axis_size(data, axis: int, dims: Callable) -> int | None:
    """The size of ``axis`` of ``data``: a constant's dims (tuple) or a graph input's generated shape."""
    shape = list(data) if isinstance(data, tuple) else dims(data)
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    return int(shape[axis])


_INF_LOGGED: set = set()  # (source, input) whose kept inf was logged


NAN_REFUSED = ("calibration and evaluation data must not be NaN (where NaN is a legitimate input value, "
               "--allow-nan keeps it for lossless passes)")


def _check_finite(value: np.ndarray, spec: InputSpec, label: str, given_inf: int = 0, allow_nan: bool = False,
                  nan_reason: str = "") -> None:
    """A :class:`UserError` naming the input (``label``: "where: input 'x'") and the counts when a
    value is NaN (unless ``allow_nan``) or the cast to the input's dtype overflowed; the
    ``given_inf`` infinities the data held are kept (logged once per input), NaN too with
    ``allow_nan``. ``nan_reason``: the refusal's reason instead of :data:`NAN_REFUSED`."""
    finite = np.isfinite(value)
    if finite.all():
        return
    nan = int(np.count_nonzero(np.isnan(value)))
    inf = int(value.size - np.count_nonzero(finite)) - nan
    if (not nan or allow_nan) and inf == given_inf:
        key = (label.split(":")[0], spec.name)  # once per source file and input
        if key not in _INF_LOGGED:
            _INF_LOGGED.add(key)
            counts = f"{inf} inf" + (f" and {nan} NaN" if nan else "")
            logging.getLogger("onnxslim_kit").info("%s holds %s of %d values (kept: %s)", label, counts, value.size,
                                                   "NaN allowed" if nan else "a mask's -inf is data")
        return
    counts = " and ".join(text for n, text in ((nan, f"{nan} NaN"), (inf, f"{inf} inf")) if n)
    cause = "" if inf == given_inf else f" ({inf - given_inf} from the cast to {spec.dtype})"
    reason = (nan_reason or NAN_REFUSED) if nan and not allow_nan else "the cast must not overflow"
    raise UserError(f"{label} ({spec.dtype}) has {counts} of {value.size} values{cause}; {reason}")
