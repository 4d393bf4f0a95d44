"""The ``svd`` pass's layer statistics, a group of layers at a time.

:func:`onnxslim_kit.passes._common.layer_stats.collect` keeps, per distinct layer input of
``k`` values, three ``k × k`` float64 Gram matrices (all rows, and each half of the samples for
the cross-fitting): ``24 k²`` bytes — 400 MB for one 4096-wide down projection, and every
layer's at once took a 219 MB decoder to 2.1 GB of anonymous memory (``benchmarks/results/
large-model-2026-12-02-l4h1024.md``). So :func:`groups`:

1. runs one streamed pass without Gram matrices (rows per sample and shapes, for every layer;
   :func:`onnxslim_kit.api.iter_activations` under ``collect``). A layer whose Gram matrix
   could not reach ``MIN_ROWS_PER_INPUT · k`` rows — at most ``min(rows, MAX_ROWS)`` a sample
   enter it — is factorised plainly anyway (:mod:`.plan`), so it needs none: its statistics
   are final (``gram_rows`` set to that bound, which is exact without a ``mask``);
2. yields the others in groups whose Gram matrices take at most ``budget`` bytes (a larger
   one alone), each collected by one more streamed pass; the caller decides the group's
   layers, then :func:`release` drops their matrices (rows and shapes stay, for the report).

``need_all``: every non-batched layer gets its Gram matrix (``alloc``: candidates need the
halves whatever their row count).
"""

from __future__ import annotations

from onnxslim_kit.passes._common.layer_stats import MAX_ROWS, collect

GRAM_BUDGET = 192 << 20  # bytes of Gram matrices (24 k² per distinct input) held at once
MIN_ROWS_PER_INPUT = 2  # as plan.MIN_ROWS_PER_INPUT: whiten only with at least 2·k rows


def _input_key(layer) -> tuple:
    return layer.input_name, layer.kind, layer.k


def groups(proto, layers: list, samples: list, aware: bool, mask: str = "", need_all: bool = False,
           budget: int = GRAM_BUDGET):
    """Yield ``(layers, {layer.key: InputStats})``, every layer in exactly one group."""
    light = collect(proto, layers, samples, want_gram=False, mask=mask)
    if not aware:
        yield layers, light
        return
    plain, heavy = [], []
    for layer in layers:
        entry = light[layer.key]
        bound = entry.samples * min(entry.rows_per_sample, MAX_ROWS)
        if layer.kind == "batched" or (not need_all and bound < MIN_ROWS_PER_INPUT * layer.k):
            entry.gram_rows = max(entry.gram_rows, bound)
            plain.append(layer)
        else:
            heavy.append(layer)
    if plain:
        yield plain, {layer.key: light[layer.key] for layer in plain}
    for group in _split(heavy, budget):
        yield group, collect(proto, group, samples, want_gram=True, mask=mask)


def _split(layers: list, budget: int) -> list:
    """Groups of at most ``budget`` bytes of Gram matrices; layers reading one input together."""
    by_input = {}
    for layer in layers:
        by_input.setdefault(_input_key(layer), []).append(layer)
    out, current, held, seen = [], [], 0, set()
    for layer in (layer for same in by_input.values() for layer in same):
        size = 0 if _input_key(layer) in seen else 24 * layer.k * layer.k
        if current and size and held + size > budget:
            out.append(current)
            current, held, seen = [], 0, set()
            size = 24 * layer.k * layer.k
        seen.add(_input_key(layer))
        current.append(layer)
        held += size
    if current:
        out.append(current)
    return out


def release(stats: dict) -> None:
    """Drop the Gram matrices of ``stats`` (their row counts and shapes stay)."""
    for entry in stats.values():
        entry.gram = None
        entry.halves = [[None, h[1], h[2]] for h in entry.halves]
        entry.pending = [[], []]
