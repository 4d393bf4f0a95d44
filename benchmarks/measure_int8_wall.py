"""Wall and CPU seconds of one CLI command, per code tree, and the int8 pass's seconds by phase.

    python benchmarks/measure_int8_wall.py --trees before=/tmp/base after=. --repeat 2 \\
        --name int8-wall-2026-12-03-s12 -- MODEL --passes fuse,int8 --calib CALIB.npz

Each run is ``python -m onnxslim_kit <args> --report R -o OUT -q`` in a child process started
from a scratch folder with ``PYTHONPATH=<tree>`` and ``OMP_NUM_THREADS=1``, under ``flock
/tmp/bench.lock`` (taken per run, so other jobs' timed runs interleave, never overlap): wall
seconds, the child's user and system CPU seconds and peak RSS (``os.wait4``), the load
average before and after, the int8 pass's metrics from the report (``seconds_*``, builds,
runs, layers per rung) and the sha256 of the written model — equal hashes: the same bytes.
The trees alternate (before, after, before, after, …) so that a change of load hits both.

Writes ``results/<--name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = "/tmp/bench.lock"
PHASES = ("seconds_calibration", "seconds_bias_correction", "seconds_fallback")
COUNTS = ("fallback_builds", "fallback_runs", "layers_int8", "layers_weights", "layers_dynamic", "layers_float")


def run_once(tree: str, args: list, work: Path) -> dict:
    """One measured run of the CLI with ``tree`` first on the path."""
    report, out = work / "report.json", work / "out.onnx"
    cmd = [sys.executable, "-m", "onnxslim_kit", *args, "--report", str(report), "-o", str(out), "-q"]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "OMP_NUM_THREADS": "1"}
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        load_before = os.getloadavg()
        start = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        load_after = os.getloadavg()
    err = child.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed ({tree}): {err.strip().splitlines()[-1] if err.strip() else status}")
    metrics = {}
    for step in json.loads(report.read_text())["passes"]:
        if step.get("name") == "int8":
            metrics = step.get("metrics", {})
    return {
        "wall_s": round(wall, 2), "user_s": round(usage.ru_utime, 2), "sys_s": round(usage.ru_stime, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_mb": round(usage.ru_maxrss / 1024),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "metrics": {k: metrics[k] for k in (*PHASES, *COUNTS) if k in metrics},
    }


def machine() -> str:
    """The CPU model, core count and memory, in words."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.release()}"


def render(data: dict) -> str:
    """The results as markdown: one row per run, then the median per tree."""
    lines = [f"# int8 wall and CPU seconds — {data['date']}", "", f"`{data['command']}`", "",
             f"Machine: {data['machine']}. Each run: `python -m onnxslim_kit {data['args']}` in a child "
             "process under `flock /tmp/bench.lock`, OMP_NUM_THREADS=1; CPU = the child's user + system seconds.", "",
             "| tree | wall s | CPU s (user + sys) | peak MB | calibration s | bias corr. s | fallback s | builds / runs "
             "| int8 / weights / float | load before → after | sha256 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["runs"]:
        m = row["metrics"]
        lines.append(
            f"| {row['tree']} | {row['wall_s']} | {row['cpu_s']} ({row['user_s']} + {row['sys_s']}) | {row['peak_mb']} "
            f"| {m.get('seconds_calibration', '—')} | {m.get('seconds_bias_correction', '—')} "
            f"| {m.get('seconds_fallback', '—')} | {m.get('fallback_builds', '—')} / {m.get('fallback_runs', '—')} "
            f"| {m.get('layers_int8', '—')} / {m.get('layers_weights', '—')} / {m.get('layers_float', '—')} "
            f"| {row['load_before'][0]} → {row['load_after'][0]} | `{row['sha256'][:12]}` |")
    lines += ["", "Median per tree:", "", "| tree | wall s | CPU s | same bytes as the first tree |", "|---|---|---|---|"]
    first = data["runs"][0]["sha256"] if data["runs"] else None
    for tree in data["trees"]:
        rows = [r for r in data["runs"] if r["tree"] == tree]
        med = lambda key: sorted(r[key] for r in rows)[len(rows) // 2]  # noqa: E731
        lines.append(f"| {tree} | {med('wall_s')} | {med('cpu_s')} | {all(r['sha256'] == first for r in rows)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", required=True, help="label=path of each code tree")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the CLI's arguments")
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    trees = dict(t.split("=", 1) for t in opts.trees)
    runs = []
    with tempfile.TemporaryDirectory(prefix="int8-wall-") as tmp:
        for i in range(opts.repeat):
            for label, tree in trees.items():
                row = {"tree": label, "round": i, **run_once(tree, args, Path(tmp))}
                runs.append(row)
                print(json.dumps(row), flush=True)
    data = {"date": time.strftime("%Y-%m-%dT%H:%M+00:00", time.gmtime()),
            "command": "python benchmarks/measure_int8_wall.py " + shlex.join(sys.argv[1:]),
            "args": shlex.join(args), "machine": machine(), "trees": list(trees), "runs": runs}
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / f"{opts.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (opts.out / f"{opts.name}.md").write_text(render(data))
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
