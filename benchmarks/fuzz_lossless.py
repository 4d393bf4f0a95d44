"""Fuzz the lossless passes with random valid graphs and write the counts (issue 15).

    python benchmarks/fuzz_lossless.py --graphs 5000 [--seed 0] [--all-passes] [--dtype float32] [--out FILE]
    python benchmarks/fuzz_lossless.py --merge A.json B.json … --out FILE   # shards run in parallel

Graphs come from ``tests/fuzz_graphs.py`` (the strategy the CI test ``tests/core/test_fuzz_lossless.py``
uses on about 200 of them); each goes through one pass list of ``fuse``, ``fuse,compact``, ``prune``
in turn (``--all-passes``: all three), with verification off (result checked: full checker,
output names/dtypes/shapes, ONNX Runtime outputs within the lossless rule) and on (no pass may
be rolled back). Counts by finding kind, pass list, opset, dtype and op go to
``benchmarks/results/fuzz-<date>.md`` with the command, and the smallest failing graph of each
kind as ONNX text; a finding's kind says whether the graph computes in float16 anywhere. The
file (and a JSON of the counts beside it, for ``--merge``) is rewritten every 250 graphs, so a
stopped run leaves its counts. Exit 1 when anything was found.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import logging
import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fuzz_graphs import KNOWN, PASS_LISTS, check_lossless, check_valid, computes_in_float16, graphs  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402


class Tally:
    def __init__(self, args):
        self.args, self.start = args, time.time()
        self.graphs = 0
        self.distinct = set()
        self.runs = collections.Counter()  # pass list -> runs
        self.kinds = collections.Counter()  # (pass list, kind) -> graphs with that finding
        self.failed_graphs = collections.Counter()  # pass list -> graphs with any finding
        self.opsets, self.dtypes, self.ops = collections.Counter(), collections.Counter(), collections.Counter()
        self.invalid = 0
        self.rewrites = collections.Counter()  # "fuse modified", "fuse: <label>" ...
        self.smallest = {}  # kind -> (node count, passes, message, text)

    def record(self, model):
        self.graphs += 1
        self.distinct.add(hashlib.sha256(model.SerializeToString()).hexdigest())
        self.opsets[model.opset_import[0].version] += 1
        dtype = "float16" if computes_in_float16(model) else "float32"
        self.dtypes[dtype] += 1
        if self.args.dtype not in ("all", dtype):  # the same graphs are drawn; only these are run
            return
        self.ops.update(n.op_type for n in model.graph.node)
        try:
            reference = check_valid(model)
        except Exception as exc:  # noqa: BLE001 -- a generator bug, counted apart
            self.invalid += 1
            self.keep("generator-invalid", model, "-", f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        lists = PASS_LISTS if self.args.all_passes else [PASS_LISTS[(self.graphs - 1) % len(PASS_LISTS)]]
        for passes in lists:
            self.runs[passes] += 1
            findings = check_lossless(model, passes, reference, self.rewrites)
            self.failed_graphs[passes] += bool(findings)
            for base in sorted({k for k, _ in findings}):
                kind = f"{base} [{dtype}]"
                self.kinds[(passes, kind)] += 1
                self.keep(kind, model, passes, "; ".join(m for k, m in findings if k == base))
        if self.graphs % 250 == 0:
            self.write()

    def keep(self, kind, model, passes, message):
        size = len(model.graph.node)
        if kind not in self.smallest or size < self.smallest[kind][0]:
            self.smallest[kind] = (size, passes, message[:1500], onnx.printer.to_text(model))

    def dump(self) -> dict:
        return {"graphs": self.graphs, "distinct": sorted(self.distinct), "invalid": self.invalid,
                "runs": dict(self.runs), "kinds": [[p, k, n] for (p, k), n in self.kinds.items()],
                "failed_graphs": dict(self.failed_graphs), "opsets": dict(self.opsets), "dtypes": dict(self.dtypes),
                "ops": dict(self.ops), "rewrites": dict(self.rewrites), "smallest": self.smallest,
                "seconds": time.time() - self.start}

    def load(self, data: dict):
        """Add the counts of another run (``--merge``: shards run as separate processes)."""
        self.graphs += data["graphs"]
        self.distinct.update(data["distinct"])
        self.invalid += data["invalid"]
        for name in ("runs", "failed_graphs", "opsets", "dtypes", "ops", "rewrites"):
            getattr(self, name).update({(int(k) if name == "opsets" else k): v for k, v in data[name].items()})
        self.kinds.update({(p, k): n for p, k, n in data["kinds"]})
        for kind, item in data["smallest"].items():
            if kind not in self.smallest or item[0] < self.smallest[kind][0]:
                self.smallest[kind] = tuple(item)
        self.start -= data["seconds"]

    def write(self):
        if not self.args.merge:  # a shard's counts, for --merge
            Path(self.args.out).with_suffix(".json").write_text(json.dumps(self.dump()))
        a = self.args
        minutes = (time.time() - self.start) / 60
        lines = [f"# Fuzzing the lossless passes — {datetime.date.today()}", "",
                 (f"Command: `python benchmarks/fuzz_lossless.py --graphs {a.graphs} --seed {a.seed}"
                  f"{' --all-passes' if a.all_passes else ''}{'' if a.dtype == 'all' else ' --dtype ' + a.dtype}`" if not a.merge else
                  f"Command: `python benchmarks/fuzz_lossless.py --merge {' '.join(Path(m).name for m in a.merge)}` "
                  "(shards, each run as `--graphs N --seed S --out FILE`)") + f" ({minutes:.1f} CPU-process min)", "",
                 f"Graphs: {self.graphs} generated ({len(self.distinct)} distinct), {self.invalid} invalid "
                 "(generator bugs, not counted as pass runs)", "",
                 "| pass list | runs | graphs with a finding | findings by kind |", "|---|---|---|---|"]
        for passes in PASS_LISTS:
            kinds = ", ".join(f"{k} ×{n}" for (p, k), n in sorted(self.kinds.items()) if p == passes) or "—"
            lines.append(f"| `{passes}` | {self.runs[passes]} | {self.failed_graphs[passes]} | {kinds} |")
        lines += ["", "Known kinds (bugs under fix elsewhere): " + "; ".join(f"`{k}`: {v}" for k, v in KNOWN.items()), "",
                  "Opsets: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.opsets.items())),
                  "", "Graphs computing in: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.dtypes.items())),
                  "", "Runs that changed the graph (verification on, before any rollback): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(self.rewrites.items()) if k.endswith(" modified")),
                  "", "Rewrites: " + ", ".join(f"{k} ×{v}" for k, v in self.rewrites.most_common() if not k.endswith(" modified")),
                  "", "Nodes generated by op: " + ", ".join(f"{k} {v}" for k, v in self.ops.most_common()), ""]
        for kind, (size, passes, message, text) in sorted(self.smallest.items()):
            lines += [f"## Smallest `{kind}` ({size} nodes, passes `{passes}`)", "", message, "", "```", text.strip(), "```", ""]
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-ops", type=int, default=8)
    parser.add_argument("--dtype", choices=["all", "float32", "float16"], default="all",
                        help="run the passes only on graphs computing in this precision (the same graphs are drawn)")
    parser.add_argument("--all-passes", action="store_true", help="every pass list on every graph")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="only merge the counts of earlier runs (shards)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"fuzz-{datetime.date.today()}.md"))
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    tally = Tally(args)
    if args.merge:
        for path in args.merge:
            tally.load(json.loads(Path(path).read_text()))
        tally.write()
        print(Path(args.out).read_text().split("\n## ")[0])
        return 0 if not tally.kinds and not tally.invalid else 1

    @seed(args.seed)
    @settings(max_examples=args.graphs, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(graphs(max_ops=args.max_ops))
    def run(model):
        tally.record(model)

    run()
    tally.write()
    print(Path(args.out).read_text().split("\n## ")[0])
    return 0 if not tally.kinds and not tally.invalid else 1


if __name__ == "__main__":
    sys.exit(main())
