"""Weights that stay on disk: models whose tensors live in external data.

A model saved with external data is loaded without its weights (``load_proto(path,
lazy=True)``): every external tensor's location is rewritten to the absolute path of its data
file (checked to exist and to hold ``offset + length`` bytes) — an *anchored* tensor. From
there on no whole-model copy of the weights is made:

1. :class:`MappedValues` — the graph's constants read an anchored tensor as a read-only
   ``np.memmap`` of its bytes (file pages, shared with the page cache, nothing copied); a
   pass that reads a weight touches that weight only;
2. ``Model.to_proto`` exports an unchanged mapped constant as its anchored stub again
   (:func:`unmap_constants`), so a proto of a model larger than memory stays small;
3. ONNX Runtime sessions (:func:`onnxslim_kit.runtime.make_session`) map anchored tensors
   from their own files (the session's external-initializer folder), so nothing is copied;
4. :func:`write_external` writes the output tensor by tensor: anchored tensors are copied
   from their source file in chunks, in-memory ones one at a time — the output's data file
   grows incrementally, no serialized copy of the model is ever built;
5. :class:`ScratchArrays` — values a pass makes and needs all at once for a session's runs
   (int4's emulation of its mixed-precision choice feeds every layer's dequantized weight)
   are written to an unlinked scratch file and read back as maps: file pages, not heap.

The input files are only ever opened for reading.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data
from onnx_graphsurgeon.ir.tensor import LazyValues

COPY_CHUNK = 64 << 20
ALIGN_FROM = 1 << 20


def has_external_data(proto: onnx.ModelProto) -> bool:
    return any(uses_external_data(t) for t in _get_all_tensors(proto))


def anchor_external_data(proto: onnx.ModelProto, base_dir) -> int:
    """Point every external tensor at the absolute path of its data file; returns the number of
    tensors. Raises ``OSError`` when a file is missing or shorter than a tensor's extent."""
    base_dir = Path(base_dir).resolve()
    sizes: dict = {}
    count = 0
    for tensor in _get_all_tensors(proto):
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        if os.path.isabs(info.location) or ".." in Path(info.location).parts:
            raise OSError(f"tensor {tensor.name!r}: external data location {info.location!r} leaves the model folder")
        target = base_dir / info.location
        if target not in sizes:
            if not target.is_file():
                raise OSError(f"tensor {tensor.name!r}: {target} does not exist")
            sizes[target] = target.stat().st_size
        length = info.length if info.length else tensor_nbytes(tensor)
        if length is None or (info.offset or 0) + length > sizes[target]:
            raise OSError(f"tensor {tensor.name!r}: {target} is shorter than the tensor's extent")
        set_location(tensor, str(target), info.offset or 0, length)
        count += 1
    return count


def is_anchored(tensor: onnx.TensorProto) -> bool:
    if not uses_external_data(tensor):
        return False
    return os.path.isabs(ExternalDataInfo(tensor).location)


def has_anchored(proto: onnx.ModelProto) -> bool:
    return any(is_anchored(t) for t in _get_all_tensors(proto))


def checker_view(proto: onnx.ModelProto, folder) -> onnx.ModelProto:
    """What the onnx checker needs of ``proto``, without its weights: a copy whose large
    main-graph tensors (and every anchored one) are external-data stubs into a sparse file of
    zeros written in ``folder`` (no disk blocks, no memory), where the checker must run.

    The checker reads names, types, shapes and the data file's extent; shape inference reads
    the values of integer tensors only (shape arithmetic), which stay in the copy. The
    serialization and parse the checker does cost kilobytes instead of two copies of the model.
    """
    view = onnx.ModelProto()
    copy_fields(proto, view, skip=("graph",))
    copy_fields(proto.graph, view.graph, skip=("initializer",))
    stubs = []
    for tensor in proto.graph.initializer:
        size = tensor_nbytes(tensor)
        if is_anchored(tensor) or (size is not None and size >= 1024 and tensor.data_type not in _SHAPE_TYPES):
            stub = view.graph.initializer.add()
            copy_fields_except_data(tensor, stub)
            stubs.append((stub, size if size is not None else ExternalDataInfo(tensor).length))
        else:
            view.graph.initializer.append(tensor)
    stubs += [(t, ExternalDataInfo(t).length or tensor_nbytes(t) or 0) for t in _get_all_tensors(view)
              if is_anchored(t)]
    offset = 0
    for stub, size in stubs:
        set_location(stub, CHECKER_STUB, offset, size)
        offset += size
    with open(Path(folder) / CHECKER_STUB, "wb") as fh:
        fh.truncate(offset)
    return view


CHECKER_STUB = "weights.stub"
_SHAPE_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def relocate_anchored(proto: onnx.ModelProto) -> str | None:
    """Make ``proto``'s anchored tensors name their data files relative to their common folder,
    which is returned (None: no anchored tensor) — the form the onnx checker (run from that
    folder) and ONNX Runtime (``session.model_external_initializers_file_folder_path``) read."""
    anchored = [t for t in _get_all_tensors(proto) if is_anchored(t)]
    if not anchored:
        return None
    folder = os.path.commonpath([os.path.dirname(ExternalDataInfo(t).location) for t in anchored])
    for tensor in anchored:
        info = ExternalDataInfo(tensor)
        set_location(tensor, os.path.relpath(info.location, folder), info.offset or 0, info.length or 0)
    return folder


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The tensor's values as a contiguous array: a read-only map of the file for an anchored
    tensor, a copy of the bytes otherwise."""
    if is_anchored(tensor):
        info = ExternalDataInfo(tensor)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        shape = tuple(tensor.dims)
        if int(np.prod(shape, dtype=np.int64)) == 0:
            return np.zeros(shape, dtype)
        return np.memmap(info.location, dtype=dtype, mode="r", offset=info.offset or 0, shape=shape)
    return np.ascontiguousarray(numpy_helper.to_array(tensor))


READ_CHUNK = 1 << 20


def value_chunks(values, chunk: int | None = None):
    """The C-order bytes of a constant's values (``Constant._values``: an array, lazy values or
    a map of a file) in pieces of ``chunk`` bytes (the last one shorter), never loading them:
    a tensor left on disk — :class:`MappedValues` not read yet, or the unchanged map of one —
    is read from its file through one ``chunk``-byte buffer (``readinto``: the file's pages go
    through the page cache, never into the process's mappings, so its RSS grows by the buffer
    and not by the tensor; the page cache is not dropped: the verification session reads the
    same pages next); an in-memory array is sliced where it lies; lazy values over an in-memory
    tensor are converted once (one tensor's transient copy, not kept by the constant).
    The bytes are little-endian as ONNX stores them (numpy's order on x86 and ARM).

    None when its bytes cannot be had so: object / string arrays, types numpy cannot hold
    exactly (bfloat16, int4 … still lazy), sparse tensors, external data not anchored.
    Each piece is valid until the next one is asked for. ``chunk``: :data:`READ_CHUNK` if None."""
    chunk = chunk or READ_CHUNK
    source = _file_source(values)
    if source is not None:
        return _file_chunks(*source, chunk)
    if isinstance(values, LazyValues):
        tensor = values.tensor
        if not isinstance(tensor, onnx.TensorProto) or tensor.data_type not in NUMPY_DTYPES \
                or uses_external_data(tensor):
            return None
        values = numpy_helper.to_array(tensor)
    if not isinstance(values, np.ndarray) or values.dtype.kind in "OUSV":
        return None
    flat = memoryview(np.ascontiguousarray(values).reshape(-1).view(np.uint8))
    return (flat[i:i + chunk] for i in range(0, max(len(flat), 1), chunk))


def release_pages(values) -> bool:
    """Drop the resident pages of a read-only file map (``np.memmap`` of a weight left on disk)
    from the process (``madvise(MADV_DONTNEED)``): its RSS falls by what was read, the values
    stay readable (the next read maps them again from the page cache or the file). For a pass
    that reads weights one at a time: each weight's pages can go once it is done with it, or a
    pass over every weight ends with the whole model resident. Returns whether pages were
    released (False: not a file map, or no ``madvise`` on this platform)."""
    handle = getattr(values, "_mmap", None) if isinstance(values, np.memmap) else None
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if handle is None or advice is None or getattr(handle, "closed", False) or values.flags.writeable:
        return False
    handle.madvise(advice)
    return True


class ScratchArrays:
    """Arrays written once to an unlinked temporary file (``folder``: the system's temporary
    folder if None) and read back as read-only maps (:meth:`put`): for values a step needs all
    at once across a session's runs — fed as graph inputs, which ONNX Runtime reads where they
    lie — held as file pages (clean: the kernel drops them under pressure; a map's pages count
    in the process's RSS only while read, :meth:`release` drops them) instead of heap. The file
    goes with :meth:`close` or the process, whichever is first."""

    PAGE = 4096

    def __init__(self, folder=None):
        self._fh = tempfile.TemporaryFile(prefix="slim-scratch-", dir=folder)
        self._end = 0
        self._maps: list = []

    def put(self, array) -> np.ndarray:
        """A read-only map of a copy of ``array`` in the file (an empty array as it is)."""
        array = np.ascontiguousarray(array)
        if array.size == 0:
            return array
        start = -(-self._end // self.PAGE) * self.PAGE
        self._fh.seek(start)
        self._fh.write(memoryview(array.reshape(-1).view(np.uint8)))
        self._fh.flush()
        self._end = start + array.nbytes
        mapped = np.memmap(self._fh, dtype=array.dtype, mode="r", offset=start, shape=array.shape)
        self._maps.append(mapped)
        return mapped

    def release(self) -> None:
        """Drop the resident pages of every map from the process (:func:`release_pages`)."""
        for mapped in self._maps:
            release_pages(mapped)

    def close(self) -> None:
        self._maps = []
        self._fh.close()


def _file_source(values) -> tuple | None:
    """(path, offset, length) of values that are a tensor left on disk, unchanged."""
    tensor = getattr(values, "_slim_source", None) if isinstance(values, np.memmap) else None
    if tensor is not None and values.shape != tuple(tensor.dims):
        return None
    if isinstance(values, MappedValues):
        tensor = values.tensor
    if tensor is None or not is_anchored(tensor) or tensor.data_type not in NUMPY_DTYPES:
        return None
    info = ExternalDataInfo(tensor)
    return info.location, info.offset or 0, tensor_nbytes(tensor)


def _file_chunks(path: str, offset: int, length: int, chunk: int):
    buffer = bytearray(min(chunk, max(length, 1)))
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        fh.seek(offset)
        left = length
        while True:
            n = fh.readinto(view[:min(len(buffer), left)]) if left else 0
            if left and not n:
                raise OSError(f"{path}: ended {left} bytes before the tensor's end")
            yield view[:n]
            left -= n
            if not left:
                return


class MappedValues(LazyValues):
    """Lazy values of a constant whose bytes stay in an external-data file (see module doc)."""

    def load(self):
        array = tensor_array(self.tensor)
        if isinstance(array, np.memmap):
            array._slim_source = self.tensor  # lets unmap_constants export the stub again
        return array


def map_constants(graph) -> int:
    """Give the graph's constants over anchored tensors :class:`MappedValues`; returns the count."""
    count = 0
    for tensor in graph.tensors().values():
        lazy = getattr(tensor, "_values", None)
        if type(lazy) is LazyValues and isinstance(lazy.tensor, onnx.TensorProto) and is_anchored(lazy.tensor):
            tensor._values = MappedValues(lazy.tensor)
            tensor.data_location = None  # else gs marks a new value of this constant EXTERNAL on export
            count += 1
    return count


def unmap_constants(graph) -> None:
    """Constants still holding the unchanged map of their anchored tensor go back to lazy
    values, so export writes the small stub, not the bytes."""
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        source = getattr(values, "_slim_source", None)
        if source is not None and isinstance(values, np.memmap) and values.shape == tuple(source.dims):
            tensor._values = MappedValues(source)


def proto_size(proto: onnx.ModelProto) -> int:
    """``proto.ByteSize()``, exactly, without serializing the weights: upb's ByteSize encodes
    the message (for an 88 MB model: two transient copies, half a second, and on a tensor the
    buffer stays in the model's arena). Main-graph initializers are sized field by field."""
    if not proto.HasField("graph") or not len(proto.graph.initializer):
        return proto.ByteSize()
    rest, graph = onnx.ModelProto(), onnx.GraphProto()
    copy_fields(proto, rest, skip=("graph",))
    copy_fields(proto.graph, graph, skip=("initializer",))
    tag = 1  # field numbers 5 (GraphProto.initializer), 7 (ModelProto.graph), 9 (raw_data): one byte
    graph_size = graph.ByteSize() + sum(_field_size(tag, _tensor_size(t)) for t in proto.graph.initializer)
    return rest.ByteSize() + _field_size(tag, graph_size)


def _tensor_size(tensor: onnx.TensorProto, exact: bool = False) -> int:
    """The tensor's ByteSize; the raw_data length from dims and type unless ``exact`` (then
    read, a transient copy of this tensor's bytes: a malformed tensor's stated size may lie)."""
    if not tensor.HasField("raw_data"):
        return tensor.ByteSize()  # values in typed fields: small tensors in practice
    stub = onnx.TensorProto()
    copy_fields(tensor, stub, skip=("raw_data",))
    dtype = NUMPY_DTYPES.get(tensor.data_type)
    if exact or dtype is None:
        n = len(tensor.raw_data)
    else:
        n = int(np.prod(tensor.dims, dtype=np.int64)) * dtype.itemsize
    return stub.ByteSize() + _field_size(1, n)


NUMPY_DTYPES = {getattr(onnx.TensorProto, n): np.dtype(d) for n, d in (
    ("FLOAT", np.float32), ("FLOAT16", np.float16), ("DOUBLE", np.float64), ("INT8", np.int8),
    ("UINT8", np.uint8), ("INT16", np.int16), ("UINT16", np.uint16), ("INT32", np.int32),
    ("UINT32", np.uint32), ("INT64", np.int64), ("UINT64", np.uint64), ("BOOL", np.bool_))}


def _field_size(tag_bytes: int, size: int) -> int:
    varint = 1
    while size >= 128 ** varint:
        varint += 1
    return tag_bytes + varint + size


@contextlib.contextmanager
def weightless(graphs, min_bytes: int = 4096, floats_only: bool = True):
    """While open, constants of ``min_bytes`` or more in ``graphs`` (only float ones with
    ``floats_only``) hold lazy values over empty external-data stubs (location ``in-memory``),
    so an export copies no weights. Yields the list of (constant, its real values)."""
    swapped, seen = [], set()
    for graph in graphs:
        for tensor in graph.tensors().values():
            values = getattr(tensor, "_values", None)
            if id(tensor) in seen or values is None or not hasattr(tensor, "export_dtype") \
                    or isinstance(values, MappedValues):
                continue
            seen.add(id(tensor))  # a constant read by a subgraph is listed by it too
            try:
                dtype = np.dtype(tensor.dtype)
                data_type = onnx.helper.np_dtype_to_tensor_dtype(dtype)
            except (TypeError, ValueError, KeyError):
                continue
            if (floats_only and dtype.kind != "f") or getattr(values, "nbytes", 0) < min_bytes:
                continue
            if getattr(tensor, "export_dtype", None) not in (None, tensor.dtype):
                continue  # exported as another type (bfloat16…): left as it is
            stub = onnx.TensorProto(name=tensor.name, data_type=data_type, dims=list(tensor.shape))
            set_location(stub, "in-memory", 0, 0)
            swapped.append((tensor, values))
            tensor._values = LazyValues(stub)
    try:
        yield swapped
    finally:
        for tensor, values in swapped:
            tensor._values = values


def fill_weights(proto: onnx.ModelProto, swapped: list) -> None:
    """Put the real tensors of ``swapped`` (from :func:`weightless`, values restored) in place of
    their stubs among ``proto``'s main-graph initializers, one tensor at a time, exactly as
    onnx-graphsurgeon exports them."""
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    by_name = {tensor.name: tensor for tensor, _ in swapped}
    for slot in proto.graph.initializer:
        tensor = by_name.get(slot.name)
        if tensor is not None and slot.data_location == onnx.TensorProto.EXTERNAL:
            slot.CopyFrom(OnnxExporter.export_tensor_proto(tensor))


def external_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the tensors that live in external data files."""
    total = 0
    for tensor in _get_all_tensors(proto):
        if uses_external_data(tensor):
            total += ExternalDataInfo(tensor).length or (tensor_nbytes(tensor) or 0)
    return total


def write_serialized(proto: onnx.ModelProto, fh) -> None:
    """Write ``proto.SerializeToString()`` to ``fh`` — the same bytes, fields in number order —
    without building the whole serialization: the main graph's initializers are encoded one
    at a time (a standalone copy each, so the buffer is freed with it)."""
    if not proto.HasField("graph") or not len(proto.graph.initializer):
        fh.write(proto.SerializeToString())
        return
    graph_no = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
    init_no = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
    head, tail = onnx.ModelProto(), onnx.ModelProto()
    for msg, keep in ((head, lambda n: n < graph_no), (tail, lambda n: n > graph_no)):
        copy_fields(proto, msg, skip=tuple(f.name for f in onnx.ModelProto.DESCRIPTOR.fields if not keep(f.number)))
    g_head, g_tail = onnx.GraphProto(), onnx.GraphProto()
    for msg, keep in ((g_head, lambda n: n < init_no), (g_tail, lambda n: n > init_no)):
        copy_fields(proto.graph, msg, skip=tuple(f.name for f in onnx.GraphProto.DESCRIPTOR.fields if not keep(f.number)))
    fh.write(head.SerializeToString())
    size = g_head.ByteSize() + g_tail.ByteSize() + sum(_field_size(1, _tensor_size(t, exact=True))
                                                       for t in proto.graph.initializer)
    fh.write(_key(graph_no) + _varint(size))
    fh.write(g_head.SerializeToString())
    for tensor in proto.graph.initializer:
        _write_tensor(tensor, init_no, fh)
    fh.write(g_tail.SerializeToString())
    fh.write(tail.SerializeToString())


def _write_tensor(tensor: onnx.TensorProto, field_no: int, fh) -> None:
    """Field ``field_no`` holding ``tensor``, as protobuf encodes it, with its raw bytes
    copied out once (no serialization buffer of the tensor)."""
    if not tensor.HasField("raw_data"):
        data = tensor.SerializeToString()
        fh.write(_key(field_no) + _varint(len(data)) + data)
        return
    raw_no = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
    head, tail = onnx.TensorProto(), onnx.TensorProto()
    names = [(f.name, f.number) for f in onnx.TensorProto.DESCRIPTOR.fields]
    copy_fields(tensor, head, skip=tuple(n for n, no in names if no >= raw_no))
    copy_fields(tensor, tail, skip=tuple(n for n, no in names if no <= raw_no))
    raw = tensor.raw_data
    raw_field = _key(raw_no) + _varint(len(raw))
    head_bytes, tail_bytes = head.SerializeToString(), tail.SerializeToString()
    fh.write(_key(field_no) + _varint(len(head_bytes) + len(raw_field) + len(raw) + len(tail_bytes)))
    fh.write(head_bytes + raw_field)
    fh.write(raw)
    fh.write(tail_bytes)


def _key(number: int) -> bytes:
    return _varint(number << 3 | 2)  # wire type 2: length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def write_external(proto: onnx.ModelProto, path: Path, data_name: str, size_threshold: int = 1024) -> bool:
    """Write ``proto`` to ``path`` with its tensors in ``path.parent / data_name``, one tensor at a
    time; the proto is not modified. Returns whether the data file was created (no tensor at or
    over ``size_threshold`` bytes, and none anchored: no data file)."""
    skeleton = onnx.ModelProto()
    copy_fields(proto, skeleton, skip=("graph",))
    copy_fields(proto.graph, skeleton.graph, skip=("initializer",))
    data_path = path.parent / data_name
    writer = _DataWriter(data_path, data_name, size_threshold)
    try:
        for tensor in proto.graph.initializer:
            stub = writer.stub(tensor)
            skeleton.graph.initializer.append(stub if stub is not None else tensor)
        for tensor in _get_all_tensors(skeleton):  # subgraph and attribute tensors (copies already)
            if tensor.data_location != onnx.TensorProto.EXTERNAL or is_anchored(tensor):
                stub = writer.stub(tensor)
                if stub is not None:
                    tensor.CopyFrom(stub)
    finally:
        writer.close()
    onnx.save_model(skeleton, str(path))
    return writer.used


class _DataWriter:
    def __init__(self, data_path: Path, data_name: str, size_threshold: int):
        self.data_path, self.data_name, self.threshold = data_path, data_name, size_threshold
        self.fh = None
        self.offset = 0
        self.used = False

    def _open(self):
        if self.fh is None:
            self.fh = open(self.data_path, "wb")
            self.used = True
        return self.fh

    def stub(self, tensor: onnx.TensorProto) -> onnx.TensorProto | None:
        """The tensor as a stub pointing into the data file (its bytes written), or None to keep it."""
        if is_anchored(tensor):
            info = ExternalDataInfo(tensor)
            length = info.length or tensor_nbytes(tensor) or 0
            fh = self._open()
            start = self._align(fh, length)
            with open(info.location, "rb") as src:
                src.seek(info.offset or 0)
                left = length
                while left:
                    chunk = src.read(min(COPY_CHUNK, left))
                    if not chunk:
                        raise OSError(f"{info.location}: ended before tensor {tensor.name!r}")
                    fh.write(chunk)
                    left -= len(chunk)
        elif tensor.HasField("raw_data") and sys.getsizeof(data := tensor.raw_data) >= self.threshold:
            length = len(data)
            fh = self._open()
            start = self._align(fh, length)
            fh.write(data)
        else:
            return None
        out = onnx.TensorProto()
        copy_fields_except_data(tensor, out)
        set_location(out, self.data_name, start, length)
        self.offset = start + length
        return out

    def _align(self, fh, length: int, alignment: int = 4096) -> int:
        """Tensors of 1 MiB or more start on page boundaries, so they can be mapped directly
        (ONNX Runtime and numpy do); smaller ones are packed (no padding overhead)."""
        if length < ALIGN_FROM:
            return self.offset
        start = -(-self.offset // alignment) * alignment
        if start != self.offset:
            fh.write(b"\0" * (start - self.offset))
        return start

    def close(self):
        if self.fh is not None:
            self.fh.close()


def copy_fields(src, dst, skip: tuple = ()) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` except those in ``skip``
    (whose values are never touched: reading ``raw_data`` would copy the bytes)."""
    for fd in src.DESCRIPTOR.fields:
        if fd.name in skip:
            continue
        if fd.is_repeated:
            values = getattr(src, fd.name)
            if len(values):
                getattr(dst, fd.name).extend(values)
        elif src.HasField(fd.name) if fd.has_presence else getattr(src, fd.name) != fd.default_value:
            if fd.type == fd.TYPE_MESSAGE:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))


def copy_fields_except_data(tensor: onnx.TensorProto, out: onnx.TensorProto) -> None:
    copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location", "float_data", "int32_data",
                                   "string_data", "int64_data", "double_data", "uint64_data"))


def set_location(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="offset", value=str(offset))
    tensor.external_data.add(key="length", value=str(length))


def tensor_nbytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of the tensor's values (None for types numpy cannot hold)."""
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    except (KeyError, ValueError, TypeError):
        return None
    return int(np.prod(tensor.dims, dtype=np.int64)) * dtype.itemsize
