"""Checks across the ranks of one script run (GP703-GP707), on what each rank measured (gradprobe/scriptmode runs
the ranks and merges their reports: scriptmode/rankmerge.py).

    rules   RankFacts, and the rules: unused on some ranks, ranks diverge, a sum not averaged, a collective that
            hangs, a rank not checked
"""

from __future__ import annotations

from typing import Any

__all__ = ["RANK_RULES", "RankFacts"]


def __getattr__(name: str) -> Any:
    # the rules module imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.ranks import rules

        return getattr(rules, name)
    raise AttributeError(name)
