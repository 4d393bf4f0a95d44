"""Whether ``int4``'s suffix runs (``passes/int4/suffix.py``) give the whole-model losses bit for
bit on a real model, and the seconds each takes: the check behind :class:`Sensitivity`'s default.

    python benchmarks/check_int4_suffix.py OUT.json -- MODEL --passes 'fuse,int4(method=rtn)' -o out.onnx --calib c.npz -q

Runs ``python -m onnxslim_kit ARGS`` in this process (from a folder other than the repository
root) with ``Sensitivity.losses`` wrapped: every measured candidate's loss is taken twice, as a
suffix run (the pass's way) and as a whole-model run on the same session (its cut dropped), each
timed with ``time.perf_counter`` (suffix: its session's set-up included; the call's one reference
run, :meth:`Sensitivity.prepare`, in neither). Writes OUT.json: one
row per candidate (weight, suffix nodes / all nodes, seconds each way, whether the two losses
are equal as floats) and the totals; prints the totals. The pass goes on with the suffix
losses, so its output is the ordinary one.
"""

from __future__ import annotations

import json
import sys
import time

from onnxslim_kit.passes.int4 import mixed


def _wrap(rows: list):
    mixed.SUFFIX_RUNS = True  # the pass's default since session 17 (mixed.py); set here, as this check is about them
    def losses(self, values: dict) -> dict:
        self.prepare(list(values))
        out = {}
        nodes = len(self.proto.graph.node) if self.proto is not None else None
        for name, make in values.items():
            value = make()
            start = time.perf_counter()
            out[name] = self.loss(name, value)
            suffix_s = time.perf_counter() - start
            start = time.perf_counter()
            whole = self.loss(name, value, whole=True)
            whole_s = time.perf_counter() - start
            rows.append({"weight": name, "suffix_nodes": len(self.parts[name]) if name in self.cuts else nodes,
                         "nodes": nodes, "suffix": name in self.cuts, "suffix_s": round(suffix_s, 3),
                         "whole_s": round(whole_s, 3), "equal": out[name] == whole, "loss": out[name]})
        self.cuts, self.held, self.types = {}, [], {}
        return out

    mixed.Sensitivity.losses = losses


def main(argv: list) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    from onnxslim_kit.cli import main as cli_main

    rows: list = []
    _wrap(rows)
    sys.argv = ["onnxslim_kit", *argv[2:]]
    try:
        code = cli_main()
    except SystemExit as stop:
        code = stop.code
    totals = {"candidates": len(rows), "suffix_runs": sum(r["suffix"] for r in rows),
              "all_equal": all(r["equal"] for r in rows),
              "suffix_s": round(sum(r["suffix_s"] for r in rows), 2), "whole_s": round(sum(r["whole_s"] for r in rows), 2),
              "exit": code}
    with open(argv[0], "w") as f:
        json.dump({"command": argv[2:], "totals": totals, "rows": rows}, f, indent=1)
    print(json.dumps(totals))
    return 0 if totals["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
