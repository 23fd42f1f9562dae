"""Mutation operators over Python source (libcst positions, text splices that keep every other line), in one namespace.

Each operator finds its sites in one file of a source and yields `Mutant`s: the mutated file text, the
codes a right diagnosis may carry, how the plain-PyTorch oracle decides the bug is real (`oracle`),
and the line a right finding names (`line`, in `file`). Culprits are not guessed here: the oracle
measures them (the parameters that trained in the unmutated run and do not in the mutant).

    source.py       the parsed file (`parse`, `Parsed`), the `Mutant` record, the text helpers
    model_ops.py    model-level operators (MODEL_OPS): the forward side, custom Functions' backward, prompts
    driver_ops.py   driver-level operators on case.py (`driver_mutants`, `grad_mode_mutant`, `unfreeze_mutants`)
"""

from __future__ import annotations

from benchmarks.mutants.driver_ops import (
    Baseline,
    driver_mutants,
    grad_mode_mutant,
    optimizer_statement_line,
    unfreeze_mutants,
    with_expected_file,
)
from benchmarks.mutants.model_ops import MODEL_OPS, ModelOp
from benchmarks.mutants.source import DRIVER_FUNCS, Mutant, Parsed, Site, parse

__all__ = ["DRIVER_FUNCS", "MODEL_OPS", "Baseline", "ModelOp", "Mutant", "Parsed", "Site", "driver_mutants",
           "grad_mode_mutant", "optimizer_statement_line", "parse", "unfreeze_mutants", "with_expected_file"]
