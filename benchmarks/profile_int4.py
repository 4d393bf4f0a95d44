"""Where ``int4``'s seconds go: one CLI run under cProfile, and a table of the step's parts.

    python benchmarks/profile_int4.py run OUT.prof -- MODEL --passes 'fuse,int4(method=rtn)' -o out.onnx --calib c.npz --eval e.npz -q
    python benchmarks/profile_int4.py summary BEFORE.prof [AFTER.prof ...]

``run``: ``python -m onnxslim_kit ARGS`` in this process under :mod:`cProfile` (run it from a
folder other than the repository root, under ``flock /tmp/bench.lock``). ``summary``: per
profile, the cumulative seconds of the parts of ``passes/int4`` (and of the ONNX Runtime runs,
the verification, ``fuse``), matched by function name, as a markdown table; the calls of
``onnxruntime ... run`` counted too. cProfile's own overhead is small here (the time is in C).
"""

from __future__ import annotations

import cProfile
import pstats
import sys

PARTS = [  # (label, file suffix, function name)
    ("whole run", "optimize.py", "run_optimize"),
    ("fuse pass", "fuse/__init__.py", "run"),
    ("int4 pass", "int4/__init__.py", "run"),
    ("  mixed precision (promote)", "int4/promote.py", "promote"),
    ("    quantize all layers", "int4/rounds.py", "quantize_all"),
    ("    proxy rows (one pass)", "int4/proxy.py", "input_rows"),
    ("    proxy errors", "int4/proxy.py", "output_error"),
    ("    sensitivity (old: per call)", "int4/mixed.py", "sensitivities"),
    ("    sensitivity runs (new)", "int4/mixed.py", "losses"),
    ("    fidelity stop", "int4/judged.py", "stop"),
    ("      emulation set-up", "int4/judged.py", "__init__"),
    ("      emulation trials", "int4/judged.py", "judge"),
    ("  weights read (Target.load)", "int4/target.py", "load"),
    ("  scratch writes", "streaming.py", "put"),
    ("  RTN maths", "int4/quant.py", "quantize_rtn"),
    ("verification", "verify.py", "check"),
]


def _stats(path: str) -> dict:
    table = pstats.Stats(path).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = {}
    for label, suffix, name in PARTS:
        hits = [v for (f, _, n), v in table.items() if n == name and f.endswith(suffix)]
        out[label] = (sum(v[3] for v in hits), sum(v[1] for v in hits)) if hits else None
    ort = [v for k, v in table.items() if k[0] == "~" and "onnxruntime_pybind11_state.run" in k[2]]
    out["ONNX Runtime runs (all)"] = (sum(v[3] for v in ort), sum(v[1] for v in ort)) if ort else None
    return out


def summary(paths: list) -> str:
    rows = [_stats(p) for p in paths]
    lines = ["| part | " + " | ".join(f"`{p}` s (calls)" for p in paths) + " |", "|---|" + "---:|" * len(paths)]
    for label in [p[0] for p in PARTS] + ["ONNX Runtime runs (all)"]:
        cells = [f"{r[label][0]:.1f} ({r[label][1]})" if r.get(label) else "—" for r in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list) -> int:
    if argv[:1] == ["summary"] and len(argv) > 1:
        print(summary(argv[1:]))
        return 0
    if argv[:1] == ["run"] and len(argv) > 3 and argv[2] == "--":
        from onnxslim_kit.cli import main as cli_main

        sys.argv = ["onnxslim_kit", *argv[3:]]
        profile = cProfile.Profile()
        try:
            profile.runcall(cli_main)
        except SystemExit:
            pass
        profile.dump_stats(argv[1])
        return 0
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
