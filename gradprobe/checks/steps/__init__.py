"""Several observed steps of the user's own training step (audit_training, the GP6xx rules).

observe (hooks on the user's steps) -> facts (typed measurements, per-parameter verdicts) ->
gradients / updates (the GP6xx Rule units) -> engine (runs the steps, the rules, ranks) -> summary (report text).
"""

from gradprobe.checks.steps.engine import audit_report

__all__ = ["audit_report"]
