"""The documentation names only files that exist.

1. every path under ``benchmarks/``, ``tests/`` or ``passes/`` that README.md,
   benchmarks/README.md or docs/*.md names exists (a glob such as ``measure_*.py`` or a brace
   list such as ``prune-…-s4-{det,rec}.md`` must match at least one file per alternative);
2. every relative Markdown link in those files resolves from the file's folder, and
   benchmarks/README.md's ``results/…`` paths resolve under benchmarks/;
3. every dated results file those documents name by its bare name (``int8-2026-11-29-s3.md``)
   is in benchmarks/results/;
4. every ``results/<dated name>`` that a Markdown or Python file of the repository cites (pass
   docstrings quote figures from them) is in benchmarks/results/ — results keep only the latest
   run of each study, so a deleted run must not leave a dangling citation.

Templates (``results/<date>.md``, ``passes/<pass>/``) are checked up to the placeholder.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_FOLDERS = ("onnxslim_kit", "passes", "benchmarks", "docs", "tests")

_SEGMENT = r"(?:[\w.*-]|/|\{[\w.,-]*\})+"
REPO_PATH = re.compile(r"(?<![\w./~{-])((?:benchmarks|tests|passes)/" + _SEGMENT + r")")
BENCH_RELATIVE = re.compile(r"(?<![\w./~{-])(results/" + _SEGMENT + r")")
MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_DATED = r"[\w{},*.-]*20\d\d-\d\d-\d\d[\w{},*.-]*?\.(?:md|json)"
BARE_RESULT = re.compile(r"(?<![\w/.{}-])(" + _DATED + r")(?![\w.-])")
CITED_RESULT = re.compile(r"results/(" + _DATED + r")(?![\w.-])")


def _expand(pattern: str) -> list:
    """``a{b,c}d`` → ``[abd, acd]`` (nested braces are not used in the docs)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [p for alt in match.group(1).split(",") for p in _expand(head + alt + tail)]


def _exists(base: Path, path: str) -> bool:
    path = path.rstrip(".,:;")
    for alternative in _expand(path):
        if any(c in alternative for c in "*?["):
            if not glob.glob(str(base / alternative)):
                return False
        elif not (base / alternative).exists():
            return False
    return True


def _missing_in(doc: Path) -> list:
    text = doc.read_text(encoding="utf-8")
    missing = [p for p in REPO_PATH.findall(text) if not _exists(ROOT, p)]
    for link in MD_LINK.findall(text):
        if "://" in link or link.startswith("mailto:"):
            continue
        if not _exists(doc.parent, link):
            missing.append(link)
    if doc.parent.name == "benchmarks":
        missing += [p for p in BENCH_RELATIVE.findall(text) if not _exists(doc.parent, p)]
    missing += [name for name in BARE_RESULT.findall(text) if not _exists(RESULTS, name)]
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_paths_exist(doc):
    assert doc.exists()
    missing = sorted(set(_missing_in(doc)))
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def _sources():
    yield ROOT / "README.md"
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".md", ".py") and RESULTS not in path.parents and path.is_file():
                yield path


def test_cited_results_exist():
    missing = []
    for path in _sources():
        for name in CITED_RESULT.findall(path.read_text(encoding="utf-8", errors="replace")):
            if not _exists(RESULTS, name):
                missing.append(f"{path.relative_to(ROOT)}: results/{name}")
    assert not missing, "citations of results files that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_checker_catches_a_missing_file(tmp_path):
    doc = tmp_path / "x.md"
    date = "-".join(("2099", "01", "01"))  # not a literal: test 4 reads this file too
    doc.write_text(f"see `benchmarks/results/none-{date}.md`, `passes/no_such_pass/`, "
                   f"[a](nowhere.md) and `prune-{date}-{{a,b}}.md`; `tests/conftest.py` exists\n",
                   encoding="utf-8")
    missing = _missing_in(doc)
    assert f"benchmarks/results/none-{date}.md" in missing
    assert "passes/no_such_pass/" in missing
    assert "nowhere.md" in missing
    assert f"prune-{date}-{{a,b}}.md" in missing
    assert not any("conftest" in m for m in missing)
    assert _exists(RESULTS, "prune-2026-11-29-s4-{det,rec}.md")
    assert not _exists(RESULTS, "prune-2026-11-29-s4-{det,nothing}.md")
