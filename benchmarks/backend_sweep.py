"""The ONNX backend suite as a sweep of the lossless passes (issue 15).

    python benchmarks/backend_sweep.py                         # everything (~1,900 node tests + the wheel's data models)
    python benchmarks/backend_sweep.py --only 'gemm|conv' --passes fuse
    python benchmarks/backend_sweep.py --every 10              # every 10th case, a smoke run

Every node test onnx generates from its own definitions (``collect_testcases()``) and every
model test whose data the wheel ships (``simple``, ``pytorch-converted``, ``pytorch-operator``,
``light``) goes through ``fuse``, ``fuse,compact`` and ``prune`` (strip) with the test's inputs
as calibration and verification on; the written model is compared with the test's expected
outputs (:mod:`backend_cases` has the rules and the outcome classes). Cases ONNX Runtime itself
does not pass are not run through the tool; they are counted by ORT's reason.

Writes ``results/backend-sweep-<date>.md``: the command, versions, the counts per pass list,
the reasons counted by kind, and the list of bugs (crash, rollback, mismatch, input modified,
timeout), one row per case and pass list. Exit status 1 when there is a bug, else 0.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import re
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backend_cases as bc  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="node," + ",".join(bc.DATA_KINDS),
                    help="node and/or the data folders: simple, pytorch-converted, pytorch-operator, light")
    ap.add_argument("--passes", nargs="+", default=list(bc.PASS_LISTS), help="pass lists (default: %(default)s)")
    ap.add_argument("--only", default=None, help="regular expression a case name must contain")
    ap.add_argument("--every", type=int, default=1, help="keep every Nth case (smoke runs)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case and pass list")
    ap.add_argument("--out", default=None, help="output .md (default results/backend-sweep-<date>.md)")
    return ap.parse_args(argv)


def collect(kinds, only=None, every=1) -> list:
    cases = []
    if "node" in kinds:
        cases += bc.node_cases()
    data = [k for k in kinds if k != "node"]
    if data:
        cases += bc.data_cases(data)
    if only:
        cases = [c for c in cases if re.search(only, c.name)]
    return cases[::every]


def sweep(cases, pass_lists, timeout, progress=None) -> dict:
    ort_refused, outcomes, t0 = {}, [], time.time()
    for k, case in enumerate(cases):
        why = bc.ort_reference(case)
        if why:
            ort_refused[case.name] = why
        else:
            for passes in pass_lists:
                outcomes.append(bc.run_case(case, passes, timeout))
        if progress and (k + 1) % 100 == 0:
            progress(f"{k + 1}/{len(cases)} cases, {time.time() - t0:.0f} s")
    return {"ort_refused": ort_refused, "outcomes": outcomes, "seconds": time.time() - t0}


def _counter_rows(counter: collections.Counter, limit=60) -> list:
    rows = [f"| {n} | {kind or '(none)'} |" for kind, n in counter.most_common(limit)]
    if len(counter) > limit:
        rows.append(f"| … | {len(counter) - limit} more kinds |")
    return rows


def render(result: dict, cases, pass_lists, command: str) -> str:
    import onnx
    import onnxruntime

    import onnxslim_kit

    outcomes, ort_refused = result["outcomes"], result["ort_refused"]
    by_kind = collections.Counter(c.kind for c in cases)
    ran = len(cases) - len(ort_refused)
    lines = [
        f"# Backend sweep {datetime.date.today().isoformat()}", "",
        f"Command: `{command}`", "",
        f"onnxslim_kit {onnxslim_kit.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"Python {platform.python_version()}; {result['seconds']:.0f} s wall on a shared 2-core machine.", "",
        f"Cases: {len(cases)} ({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))}); "
        f"ORT passes {ran} of them itself, and those go through each pass list.", "",
        "## Counts per pass list", "",
        "| passes | " + " | ".join(("ok", "refused") + bc.BUG_STATUSES) + " |",
        "|---" * (3 + len(bc.BUG_STATUSES)) + "|",
    ]
    for passes in pass_lists:
        c = collections.Counter(o.status for o in outcomes if o.passes == passes)
        lines.append(f"| `{passes}` | " + " | ".join(str(c[s]) for s in ("ok", "refused") + bc.BUG_STATUSES) + " |")
    bugs = [o for o in outcomes if o.status in bc.BUG_STATUSES]
    lines += ["", f"**Bugs: {len(bugs)}** (crash, rollback, mismatch, input modified, timeout).", "",
              f"## ORT cannot run / does not pass the original: {len(ort_refused)}", "",
              "| cases | ORT's reason (kind) |", "|---|---|"]
    lines += _counter_rows(collections.Counter(bc.reason_kind(r) for r in ort_refused.values()))
    for passes in pass_lists:
        refused = collections.Counter(o.kind for o in outcomes if o.passes == passes and o.status == "refused")
        lines += ["", f"## Tool refused (exit 2), `{passes}`: {sum(refused.values())}", "",
                  "| cases | reason (kind) |", "|---|---|"]
        lines += _counter_rows(refused)
    lines += ["", "## Bugs", "", "| case | passes | symptom | detail |", "|---|---|---|---|"]
    lines += [f"| {o.case} | `{o.passes}` | {o.status} | {o.reason.replace('|', '/')[:240]} |" for o in bugs]
    if not bugs:
        lines.append("| — | — | none | |")
    lines += ["", "## Refused cases (for reference)", "",
              "| case | passes | reason |", "|---|---|---|"]
    lines += [f"| {o.case} | `{o.passes}` | {o.reason.replace('|', '/')[:200]} |"
              for o in outcomes if o.status == "refused"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = _args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    cases = collect(kinds, args.only, args.every)
    print(f"{len(cases)} cases", file=sys.stderr, flush=True)
    result = sweep(cases, args.passes, args.timeout, progress=lambda s: print(s, file=sys.stderr, flush=True))
    command = "python benchmarks/backend_sweep.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    out = Path(args.out) if args.out else RESULTS / f"backend-sweep-{datetime.date.today().isoformat()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render(result, cases, args.passes, command.strip()))
    tmp.replace(out)
    bugs = sum(o.status in bc.BUG_STATUSES for o in result["outcomes"])
    print(f"wrote {out}: {len(result['outcomes'])} runs, {len(result['ort_refused'])} ORT-refused cases, {bugs} bugs",
          file=sys.stderr)
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
