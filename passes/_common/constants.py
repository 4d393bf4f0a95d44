"""Equal constants made one: grouped by (element type, shape); in a group of two or more each
is hashed (BLAKE2b, 128 bits) and a digest seen before is confirmed byte for byte. Both read the
bytes in 1 MiB pieces (:func:`onnxslim_kit.streaming.value_chunks`): a weight left on disk
through a buffer, from its file, never mapped and never loaded into the constant — on a 480 MB
decoder the check had kept every weight's pages mapped (+0.95× the model in RSS at fuse's peak).

Used by ``fuse`` (its rule 5, every constant) and by ``int8`` (its own encodings: a weight that
several layers read is encoded once per layer, into equal arrays — an unrolled LSTM reads each
weight in every step; kept apart, captcha-whisperer's CRNN held 80 copies of 4 weights, and
ORT's QGemm read a different copy at every step).
"""

from __future__ import annotations

import hashlib
from itertools import zip_longest

import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.shapes import elem_type
from onnxslim_kit.streaming import value_chunks


def _token(tensor) -> object:
    """What a digest of ``tensor`` stays valid for: its file's tensor while it is a weight left
    on disk (read or not), else its values object (passes assign new arrays, never edit one)."""
    values = tensor._values
    for attribute in ("_slim_source", "tensor"):  # a map's file tensor; lazy values' tensor
        source = getattr(values, attribute, None)
        if source is not None:
            return source
    return values


def constant_digest(tensor, cache: dict) -> bytes | None:
    """BLAKE2b-128 of the constant's bytes, read in pieces (module docstring); None when
    its bytes cannot be read without converting them. ``cache``: id(constant) → (token, digest)."""
    token = _token(tensor)
    hit = cache.get(id(tensor))
    if hit is not None and hit[0] is token:
        return hit[1]
    chunks = value_chunks(tensor._values)
    if chunks is None:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for piece in chunks:
        digest.update(piece)
    cache[id(tensor)] = (token, digest.digest())
    return cache[id(tensor)][1]


def same_bytes(a, b) -> bool:
    """Whether constants ``a`` and ``b`` hold the same bytes, compared piece by piece."""
    first, second = value_chunks(a._values), value_chunks(b._values)
    if first is None or second is None:
        return False
    return all(x is not None and y is not None and x == y for x, y in zip_longest(first, second))


def merge_equal_constants(graph, digests: dict, select=None) -> int:
    """Constants read by ``graph``'s nodes with the same element type, shape and bytes become one
    (module docstring); ``select(constant)``: only those it accepts take part (all when None).
    ``digests``: id(constant) → (token, digest), kept across calls. Returns how many went."""
    by_type = {}
    for node in graph.nodes:
        for tensor in node.inputs:
            if isinstance(tensor, gs.Constant) and (select is None or select(tensor)):
                group = by_type.setdefault((elem_type(tensor), tuple(tensor.shape)), [])
                if not any(t is tensor for t in group):
                    group.append(tensor)
    replace = {}
    for group in by_type.values():
        if len(group) < 2:
            continue
        kept = {}
        for tensor in group:
            digest = constant_digest(tensor, digests)
            if digest is None:
                continue
            first = kept.setdefault(digest, tensor)
            if first is not tensor and same_bytes(first, tensor):
                replace[id(tensor)] = first
    if not replace:
        return 0
    for node in graph.nodes:
        for i, tensor in enumerate(node.inputs):
            if id(tensor) in replace and isinstance(tensor, gs.Constant):
                node.inputs[i] = replace[id(tensor)]
    return len(replace)
