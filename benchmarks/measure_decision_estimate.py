"""Does a decision view's agreement predict what many more samples show? (issue 18)

    python benchmarks/measure_decision_estimate.py --model ddddocr --calib 128 --fresh 256
    python benchmarks/measure_decision_estimate.py --model mtcnn_pnet --calib 128 --fresh 256

A view's decisions are the strings a CTC recognizer reads (``onnxslim_kit/fidelity/strings.py``)
or the arg-max of a Softmax / logits output (``onnxslim_kit/fidelity/margins.py``). Counting
changed decisions on 32 held-out samples cannot tell a change rate of 0 from 1 in 30, so the
view's agreement is the lower of the counted share and an estimate from the margins and how
far the candidate closed them, pooled with the margins of the fit samples. This script puts
the two beside the truth: the share of decisions kept on ``--fresh`` samples the candidate
never saw (fresh draws of the evaluation stream, seeds 11, 12, …, 64 samples each).

Candidates, each judged against the original (ORT, CPU, 1 thread, optimizations on: int8
candidates run on the fused kernels):

* ``weights``: every Conv / Gemm weight rounded to int8's per-output-channel grid (symmetric,
  scale max|w| / 127), compute in float — the mildest rung of ``int8``'s ladder, made in numpy here;
* each ``--pipelines`` entry, written by ``onnxslim_kit.optimize`` with the ``--calib`` samples
  (seed 0, as ``measure_fidelity.py`` does).

``--without-softmax`` cuts the model's last Softmax off first (the output becomes the raw logits
before it, as a classifier exported without its Softmax reads): candidates are made from and
judged against that model.

Per candidate and decision view (kind ``ctc`` or ``probs``): the counted share and the
agreement (the estimate bound) on the held-out calibration samples with the fit samples'
margins pooled (what the pass is judged by), on the first 32 fresh samples without a pool
(what ``bench`` reports on an evaluation set), then the counted share on all fresh samples;
and the share of the candidate's MACs that ORT runs in int8 kernels (``onnxslim_kit.executed``
on its optimized graph, at the first fresh sample's shapes). Results: ``benchmarks/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402
import onnxslim_kit  # noqa: E402
from onnxslim_kit.executed import executed_summary  # noqa: E402
from onnxslim_kit.fidelity import Target, find_views, judge  # noqa: E402
from onnxslim_kit.fidelity.context import MAX_POOL_SAMPLES, held_out, held_out_of  # noqa: E402
from onnxslim_kit.fidelity.judge import reference_margins  # noqa: E402
from onnxslim_kit.passes._quant.qdq import quantize_weight, weight_scales  # noqa: E402
from onnxslim_kit.runtime import make_session, run  # noqa: E402
from onnxslim_kit.zoo import fetch  # noqa: E402

PIPELINES = ["fuse,int8(speed=off)", "fuse,int8(speed=off,target=none)",
             "fuse,int8(speed=off,target=none,exclude=op:Gemm)"]
DRAW = 64  # fresh samples per seed
BENCH_SAMPLES = 32


def weights_rounded(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every Conv / Gemm weight on int8's symmetric per-output-channel grid
    (``_quant.qdq.weight_scales`` / ``quantize_weight``, codes in ±127), dequantized."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    axes = {node.input[1]: 1 if node.op_type == "Gemm" and not any(a.name == "transB" and a.i for a in node.attribute)
            else 0 for node in model.graph.node if node.op_type in ("Conv", "Gemm")}
    for init in model.graph.initializer:
        if init.name in axes:
            w, axis = numpy_helper.to_array(init), axes[init.name]
            scales = weight_scales(w, axis)
            shape = [-1 if i == axis else 1 for i in range(w.ndim)]
            rounded = quantize_weight(w, scales, axis).astype(np.float32) * scales.reshape(shape)
            init.CopyFrom(numpy_helper.from_array(rounded.astype(w.dtype), init.name))
    return model


def outputs(model, samples: list) -> list:
    """Each sample's outputs, ORT's optimizations on: an int8 candidate runs on the fused int8
    kernels, as deployed (at ``disable`` its Q/DQ graph would run as float emulation)."""
    session = make_session(model, "all", threads=1)
    return [run(session, sample) for sample in samples]


DECISIONS = ("ctc", "probs")


def decision_scores(verdict, cut: bool = False) -> dict:
    """View name → counted share, agreement and worst cosine of every decision view judged by
    margins (with ``cut``, of every view: the cut output may be judged by its values alone)."""
    return {s.view: {"kind": s.kind, "observed": s.observed, "agreement": s.agreement, "cosine": s.cosine}
            for s in verdict.scores if cut or (s.kind in DECISIONS and s.observed is not None)}


def argmax_kept(reference: list, candidate: list, output: str) -> float:
    """The share of rows (last axis: classes) whose arg-max the candidate keeps."""
    ref = np.concatenate([np.asarray(r[output]).reshape(-1, np.shape(r[output])[-1]) for r in reference])
    got = np.concatenate([np.asarray(c[output]).reshape(-1, np.shape(c[output])[-1]) for c in candidate])
    return float(np.mean(ref.argmax(axis=1) == got.argmax(axis=1)))


def without_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its last Softmax removed: what read its probabilities reads its logits."""
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][-1]
    model.graph.node.remove(softmax)
    for node in model.graph.node:
        node.input[:] = [softmax.input[0] if i == softmax.output[0] else i for i in node.input]
    for out in model.graph.output:
        if out.name == softmax.output[0]:
            out.name = softmax.input[0]
    return model


def measure(name: str, pipelines: list, n_calib: int, n_fresh: int, cut: bool = False) -> dict:
    source = str(fetch(name))
    original = onnx.load(source)
    if cut:
        original = without_softmax(original)
    calib = inputs.BUILDERS[name](name, Path(source), "calib", n_calib, 0)[0]
    held = held_out_of(calib)
    fit = [s for i, s in enumerate(calib) if not held_out(i)][:MAX_POOL_SAMPLES]
    fresh = [s for seed in range(11, 11 + -(-n_fresh // DRAW))
             for s in inputs.BUILDERS[name](name, Path(source), "eval", DRAW, seed)[0]][:n_fresh]
    views = find_views(original)
    pool = reference_margins(views, outputs(original, fit), None)
    reference = {"held": outputs(original, held), "fresh": outputs(original, fresh)}
    candidates = [("weights (numpy, per channel, float compute)", weights_rounded(original))]
    for pipeline in pipelines:
        model, report = onnxslim_kit.optimize(onnx.ModelProto.FromString(original.SerializeToString()) if cut
                                              else source, pipeline, calib=calib)
        candidates.append((pipeline, model, report.passes[-1].metrics.get("layers_int8")))
    rows = []
    for label, model, *layers in candidates:
        macs = executed_summary(model, fresh[0]).get("int8_mac_share")
        got = {"held": outputs(model, held), "fresh": outputs(model, fresh)}
        parts = {}
        for part, ref, out in (("held", reference["held"], got["held"]),
                               ("bench", reference["fresh"][:BENCH_SAMPLES], got["fresh"][:BENCH_SAMPLES]),
                               ("fresh", reference["fresh"], got["fresh"])):
            verdict = judge(views, ref, out, Target.parse("cos:0.99"), None, None, pool if part == "held" else None)
            parts[part] = decision_scores(verdict, cut)
        for view in parts["fresh"]:
            row = {"candidate": label, "layers_int8": layers[0] if layers else None, "int8_mac_share": macs, "view": view,
                   "kind": parts["fresh"][view]["kind"], **{part: parts[part].get(view) for part in parts}}
            row["truth"] = row["fresh"]["observed"]
            if row["truth"] is None:  # judged by its values: the arg-max a user reads, counted here
                row["truth"] = argmax_kept(reference["fresh"], got["fresh"], view)
            rows.append(row)
            judged = {k: v if v is not None else float("nan") for k, v in (row["held"] or {}).items()}
            print(f"  {label} {view}: held {judged.get('agreement', np.nan):.3f} "
                  f"(counted {judged.get('observed', np.nan):.3f}, cos {judged.get('cosine', np.nan):.4f}), "
                  f"truth {row['truth']:.3f} on {len(fresh)}", flush=True)
    return {"model": name + (" without its Softmax" if cut else ""), "calib": n_calib, "held": len(held),
            "fresh": len(fresh), "pool": len(fit), "rows": rows}


def markdown(result: dict, command: str, started: str) -> str:
    lines = [f"# Decision agreement: estimate vs many samples — {started}", "", f"`{command}`", "",
             f"Model {result['model']}: {result['calib']} calibration samples (the pass fits "
             f"{result['calib'] - result['held']}, judges {result['held']} held out; the estimate pools the "
             f"margins of {result['pool']} fit samples), {result['fresh']} fresh evaluation samples (seeds 11…). "
             "Agreement = min(counted, estimate), as the report and `bench` print it; truth = the counted share "
             "on all fresh samples (strings for a `ctc` view, arg-max rows for `probs`).", "",
             "| candidate | int8 layers | MACs in int8 kernels | view (kind) | held-out: counted / agreement | bench (32 fresh): counted / "
             "agreement | truth (all fresh) | agreement − truth (held-out) |", "|---|---|---|---|---|---|---|---|"]

    def pair(part):
        if part and part["observed"] is None:
            return f"cosine {part['cosine']:.4f} only"
        return f"{part['observed']:.3f} / {part['agreement']:.3f}" if part else "—"
    for row in result["rows"]:
        gap = f"{row['held']['agreement'] - row['truth']:+.3f}" if row["held"] and row["held"]["agreement"] else "—"
        share = row.get("int8_mac_share")
        lines.append(f"| `{row['candidate']}` | {row['layers_int8'] if row['layers_int8'] is not None else '—'} | "
                     f"{'—' if share is None else f'{100 * share:.1f}%'} | "
                     f"{row['view']} ({row['kind']}) | {pair(row['held'])} | {pair(row['bench'])} | "
                     f"{row['truth']:.4f} | {gap} |")
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ddddocr")
    parser.add_argument("--calib", type=int, default=128)
    parser.add_argument("--fresh", type=int, default=256)
    parser.add_argument("--pipelines", nargs="*", default=PIPELINES)
    parser.add_argument("--without-softmax", action="store_true", help="cut the last Softmax off first")
    parser.add_argument("--name", default=f"decision-estimate-{datetime.now(timezone.utc):%Y-%m-%d}")
    args = parser.parse_args(argv)
    started = datetime.now(timezone.utc).isoformat(timespec="minutes")
    command = "python benchmarks/measure_decision_estimate.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = measure(args.model, args.pipelines, args.calib, args.fresh, args.without_softmax)
    out = HERE / "results" / args.name
    out.with_suffix(".json").write_text(json.dumps({"command": command, "started": started, **result}, indent=1))
    out.with_suffix(".md").write_text(markdown(result, command, started))
    print(f"wrote {out}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
