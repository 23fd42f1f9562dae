"""docs/coverage.md, the matrix of the several-steps codes by setting, is generated from the examples' headers and
the script cases the tests run: it must be current."""

from __future__ import annotations

from conftest import ROOT


def test_coverage_md_is_current():
    from benchmarks.coverage import COMMAND, coverage_markdown

    text = coverage_markdown()
    assert (ROOT / "docs" / "coverage.md").read_text() == text, f"docs/coverage.md is stale: run `{COMMAND}`"
    assert "| GP601 |" in text and "| GP618 |" in text
