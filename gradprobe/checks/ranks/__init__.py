"""Checks across the ranks of one script run (GP703-GP707), on what each rank measured (gradprobe/scriptmode runs
the ranks and merges their reports: scriptmode/rankmerge.py).

    rules   RankFacts, and the rules: unused on some ranks, ranks diverge, a sum not averaged, a collective that
            hangs, a rank not checked
"""

from gradprobe.checks.ranks.rules import RANK_RULES, RankFacts

__all__ = ["RANK_RULES", "RankFacts"]
