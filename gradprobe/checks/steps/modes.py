"""GP6xx rules about the mode the model trained in: train() / eval(), as it stood when the optimizer stepped."""

from __future__ import annotations

from collections.abc import Iterator

from gradprobe.checks.steps.facts import AuditFacts, at, listed
from gradprobe.findings import Finding, Rule

GP610: Rule[AuditFacts] = Rule(
    code="GP610", name="training-in-eval-mode", severity="warning", rank=49,
    summary="Every dropout module of the model was in eval mode at every observed optimizer step: the model trains with "
            "dropout off (and batch norm on its running statistics).",
    why="model.eval(), often inside an evaluation run before training or between epochs, switches dropout off and makes "
        "batch norm normalise with (and stop updating) its running statistics. If model.train() is not called again "
        "before the training steps, the model trains without its regularisation; nothing raises and the loss goes down.",
    example="evaluate(model)   # calls model.eval()\nfor x, y in loader:\n    loss_fn(model(x), y).backward(); "
            "optimizer.step()   # model.train() never called again",
    message="{count} dropout module(s) of the model ({names}) were in eval mode at each of the {steps} observed optimizer "
            "step(s) ({step_line}){since}: the model trained with dropout switched off.",
    fix="Call model.train() before the training steps: at the start of each epoch, and after any evaluation that calls "
        "model.eval(){eval_line}.",
)


@GP610.detector
def detect_eval_mode(facts: AuditFacts) -> Iterator[Finding]:
    steps = [s for s in facts.opt_steps if s.dropout and (facts.initial_optimizer is None
                                                          or s.optimizer == facts.initial_optimizer)]
    if not steps or any(len(s.dropout_in_eval) < s.dropout for s in steps):
        return
    first = steps[0]
    evals = [m for m in facts.mode_calls if not m.training and m.call <= first.call and m.location is not None]
    loc = evals[-1].location if evals else None
    names = first.dropout_in_eval
    yield GP610.finding(location=loc or first.location,
                        evidence={"dropout_modules": first.dropout, "in_eval_at_each_step": [len(s.dropout_in_eval)
                                                                                             for s in steps],
                                  "eval_called_at": at(loc) if loc else None},
                        count=len(names), names=listed(names), steps=len(steps), step_line=at(first.location),
                        since=f", set by model.eval() at {at(loc)}" if loc else "",
                        eval_line=f" such as the one at {at(loc)}" if loc else "")


MODE_RULES: tuple[Rule[AuditFacts], ...] = (GP610,)
