"""Where the int8 pass's peak memory is: resident memory around its steps, in one CLI run.

    python benchmarks/trace_int8_memory.py MODEL.onnx --passes fuse,int8 --calib CALIB.npz -o OUT.onnx

Runs the CLI (its arguments as given) in this process with the steps below wrapped; for each
step: how often it ran, the largest resident memory when it started and the largest
high-water mark during it (the kernel's ``VmHWM``, reset through ``/proc/self/clear_refs`` at
each wrapped call and after it; Linux only). Nested steps fold into the innermost one, so a
row's peak is what happened in that step outside the wrapped steps it calls. Unlike
``measure_memory.py trace`` nothing is collected or trimmed between steps: the figures are
the CLI's own.
"""

from __future__ import annotations

import functools
import sys

STEPS = [  # (module, attribute path, label)
    ("onnxslim_kit.verify", "Verifier.__init__", "verifier: reference outputs"),
    ("onnxslim_kit.verify", "Verifier.check", "verifier: check a candidate"),
    ("onnxslim_kit.model", "Model.to_proto", "Model.to_proto"),
    ("onnxslim_kit.passes.int8", "Int8Pass._calibrate", "int8: calibration run"),
    ("onnxslim_kit.passes.int8.correct", "measure_twins", "int8: bias correction and local sensitivity (twins)"),
    ("onnxslim_kit.passes.int8", "Int8Pass._plan", "int8: plan"),
    ("onnxslim_kit.passes.int8.fallback", "Scorer.__init__", "int8: reference outputs"),
    ("onnxslim_kit.passes._quant.qdq", "apply_plan", "int8: apply a plan (trial or final)"),
    ("onnxslim_kit.passes.int8.fallback", "SharedWeights.session", "int8: trial session"),
    ("onnxslim_kit.passes.int8.fallback", "Scorer.score_session", "int8: scoring runs"),
]


def _kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _reset() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def instrument(rows: dict) -> None:
    import importlib

    for module_name, path, label in STEPS:
        owner = importlib.import_module(module_name)
        *parents, attr = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        fn = getattr(owner, attr)

        def wrapper(*args, _fn=fn, _label=label, **kwargs):
            row = rows.setdefault(_label, [0, 0, 0])
            row[0] += 1
            row[1] = max(row[1], _kb("VmRSS"))
            _reset()
            try:
                return _fn(*args, **kwargs)
            finally:
                row[2] = max(row[2], _kb("VmHWM"))
                _reset()

        setattr(owner, attr, functools.wraps(fn)(wrapper))
    # names imported into int8 before the wrapping
    import onnxslim_kit.passes.int8.fallback as fallback
    import onnxslim_kit.passes._quant.qdq as qdq
    import onnxslim_kit.passes.int8 as int8
    import onnxslim_kit.passes.int8.correct as correct

    int8.apply_plan = qdq.apply_plan
    int8.Scorer = fallback.Scorer
    int8.measure_twins = correct.measure_twins


def main(argv: list) -> int:
    from onnxslim_kit.cli import main as cli_main

    rows: dict = {}
    instrument(rows)
    code = cli_main(argv)
    print("| step | calls | RSS at its start, max MB | peak during, max MB |")
    print("|---|---|---|---|")
    for label, (calls, start, peak) in rows.items():
        print(f"| {label} | {calls} | {start / 1024:.0f} | {peak / 1024:.0f} |")
    print(f"\nlargest peak of the steps: {max(peak for _, _, peak in rows.values()) / 1024:.0f} MB")
    return code or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
