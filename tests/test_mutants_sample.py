"""A fixed sample of the mutation bench (benchmarks/mutants): one mutant per (source, operator) on three
real sources, validated in plain PyTorch, then diagnosed through the real server over MCP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mutants.bench import main

pytest.importorskip("libcst")


def test_mutants_sample(tmp_path: Path) -> None:
    out = main(["--sources", "nanogpt,vae,soft_prompt", "--per-op", "1", "--seed", "1",
                "--keep", str(tmp_path / "cases"), "--quiet"])
    rows = out["rows"]
    buggy = [r for r in rows if r.get("kind") == "buggy"]
    print(f"sample: {out['kept']} kept, recall {out['hits']}, right line {out['lines']}")
    assert out["kept"] >= 30, out["kept"]
    assert len(out["operators"]) >= 18, out["operators"]
    assert out["clean"] == out["controls"] == 3, [r for r in rows if r.get("kind") == "control" and not r["ok"]]
    misses = [(r["id"], r.get("codes_seen")) for r in buggy if not r.get("ok")]
    assert out["hits"] / out["kept"] >= 0.85, misses
    assert out["lines"] / out["kept"] >= 0.75, [(r["id"], r.get("line_ok")) for r in buggy if not r.get("line_ok")]
