"""Comparison 1, N processes against one: the script at world size N against the same script as one process, fed the
N ranks' batches joined (rank order), both computing each step from the same weights (scriptmode/paired.py runs them;
measured.py judges them). GP801 when the gradient the optimizer sees departs; its all-clear says the largest difference.

Public reports this comparison follows: https://github.com/huggingface/transformers/issues/34242 (a loss averaged per
process over its own tokens), https://github.com/mlfoundations/open_clip (contrastive loss: gather_with_grad,
local_loss labels offset by rank).
"""

from __future__ import annotations

from typing import Any

from gradprobe.checks.equivalence.measured import judge, result


def run(loaded: Any, options: dict[str, Any]) -> dict[str, Any]:
    if not options.get("_paired"):
        return result(False, "measured on a target run at world_size 2-4 (a script, or a build_model() target) against "
                             "the same target as one process")
    return judge("ranks", options.get("_paired") or {})
