"""Build ``data/svd_calib_sentences.txt``: a large offline calibration text of real English
sentences for the data-aware ``svd`` pass on MiniLM-L6 (issue 6).

    apt-get install wordnet-base          # Debian 1:3.0-37 (WordNet 3.0), once
    python benchmarks/build_svd_calib.py  # rewrites data/svd_calib_sentences.txt (deterministic)

Why: 32 calibration sentences (428 real tokens) cannot estimate 384×384 / 1536×1536 input
covariances; whitened factors and rank choices fitted on them over-fit
(``results/svd-2026-11-29-s2-study.md``). This file gives tens of thousands of real tokens.

Source: the usage examples quoted in the glosses of WordNet 3.0 (``/usr/share/wordnet/data.{noun,
verb,adj,adv}`` of Debian's ``wordnet-base``, version pinned below) — short everyday sentences
written by lexicographers ("the children played in the garden"). Licence: WordNet 3.0 licence
(permissive: use, copy, modify and distribute for any purpose, keeping the notice below), which
is written at the top of the output file. Sentences with 6–30 words are kept, first letter
capitalised, a full stop added when missing, duplicates removed, then a seeded shuffle picks
``--count``. The benchmark's evaluation sentences (second half of ``data/sentences.txt``) are
never in the output: the script fails if one would be.

Lines starting with ``#`` in the output are the header (source, licence); readers skip them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "svd_calib_sentences.txt"
WORDNET = Path("/usr/share/wordnet")
WORDNET_PACKAGE = "wordnet-base 1:3.0-37 (Debian), WordNet 3.0"
FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
NOTICE = """WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved.
THIS SOFTWARE AND DATABASE IS PROVIDED "AS IS" AND PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR
WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON UNIVERSITY MAKES NO
REPRESENTATIONS OR WARRANTIES OF MERCHANT-ABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR THAT THE USE
OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY PATENTS,
COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS.
The name of Princeton University or Princeton may not be used in advertising or publicity pertaining
to distribution of the software and/or database. Title to copyright in this software, database and
any associated documentation shall at all times remain with Princeton University and LICENSEE agrees
to preserve same."""


def wordnet_examples(folder: Path = WORDNET) -> list:
    """The quoted usage examples of every synset gloss, in file order."""
    found = []
    for name in FILES:
        for line in (folder / name).read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:  # licence header lines start with 2 spaces
                continue
            found += re.findall(r'"([^"]+)"', line.split("|", 1)[1])
    return found


def clean(text: str, min_words: int = 6, max_words: int = 30) -> str | None:
    """A tidy sentence, or None when it is too short/long or not prose."""
    text = re.sub(r"\s+", " ", text).strip().strip(";").strip()
    words = text.split()
    if not min_words <= len(words) <= max_words or not text[:1].isalpha():
        return None
    if sum(c.isalpha() or c in " ,.'-?!" for c in text) < 0.95 * len(text):
        return None
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".?!" else text + "."


def evaluation_sentences() -> set:
    lines = [s.strip() for s in (HERE / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
    return {s.lower() for s in lines[len(lines) // 2:]}


def build(count: int, seed: int = 0, folder: Path = WORDNET) -> list:
    kept = sorted({c for c in (clean(t) for t in wordnet_examples(folder)) if c})
    rng = np.random.default_rng(seed)
    chosen = [kept[i] for i in rng.permutation(len(kept))[:count]]
    leaked = [s for s in chosen if s.lower() in evaluation_sentences()]
    if leaked:
        raise SystemExit(f"evaluation sentences in the calibration text: {leaked[:3]}")
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=4000, help="sentences (default 4000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not (WORDNET / FILES[0]).exists():
        print(f"{WORDNET} missing: apt-get install wordnet-base", file=sys.stderr)
        return 2
    chosen = build(args.count, args.seed)
    header = [f"# {len(chosen)} usage examples from {WORDNET_PACKAGE}, built by benchmarks/build_svd_calib.py "
              f"--count {args.count} --seed {args.seed}"] + [f"# {line}" for line in NOTICE.splitlines()]
    args.out.write_text("\n".join(header + chosen) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(chosen)} sentences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
