"""Comparison 2, k micro-batches against one batch: the accumulated gradient of an optimizer step against the gradient
of the same examples as one batch, from the same weights, at each of the first steps.

- Script targets: the script as the user runs it against the same script at accumulation 1 (the framework's own
  setting, set by gradprobe: the Trainer's gradient_accumulation_steps, Lightning's accumulate_grad_batches,
  accelerate's gradient_accumulation_steps; or, for a plain loop, the caller's `reference.args`), fed each step's
  micro-batches joined (scriptmode/paired.py runs them; measured.py judges them).
- build_model() targets whose train_step runs several backward() calls per step: inprocess.py takes, after each of
  the user's steps, the gradient of the target's loss on the whole batch from the same pre-step weights.
The verdict is the measured ratio, never the pattern: GP802 with the factor (k, 1/k, ...) at the line where the scale
is set, or the verified line with the largest difference.

Public reports: https://github.com/huggingface/transformers/issues/34242 and
https://github.com/huggingface/transformers/pull/35207 (the Trainer's loss under gradient accumulation),
https://github.com/karpathy/nanoGPT/issues/206 (micro-batch losses not divided).
"""

from __future__ import annotations

from typing import Any

from gradprobe.checks.equivalence.measured import judge


def run(loaded: Any, options: dict[str, Any]) -> dict[str, Any]:
    if options.get("_script"):
        return judge("accumulation", options.get("_paired") or {})
    from gradprobe.checks.equivalence.inprocess import accumulation_in_process

    return accumulation_in_process(loaded, options)
