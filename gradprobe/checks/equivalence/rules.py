"""The equivalence codes (GP8xx): a gradient that must equal the reference's, measured against it.

GP801 and GP802 are the measured departures of the two paired comparisons (N processes against one, k micro-batches
against one batch); GP806 is the measured per-tensor scale a scheme gives on purpose where the optimizer cannot see it.
The located cause (the division, the reduction, the all-reduce, the gather, the targets) is the finding's location
and its `cause` text; the rest is the measurement (evidence.steps: each step's largest difference, the departing
tensors).
"""

from __future__ import annotations

from gradprobe.findings import Rule, Situation

GP801: Rule[object] = Rule(
    code="GP801", name="ranks-gradient-differs", severity="error", rank=36,
    summary="At N processes the gradient the optimizer sees differs from the gradient one process computes on the same "
            "global batch from the same weights.",
    why="Data parallelism is meant to compute the gradient of one large batch: each rank takes a slice and DDP averages "
        "the slices' gradients. A loss summed over the local batch, gradients all-reduced with SUM and not divided, a "
        "loss divided by each rank's own token count, features gathered from the other ranks without their gradient, "
        "targets built for rank 0 only: each gives a gradient that flows and is wrong (1/N, N times, or pointing "
        "elsewhere), while nothing raises and the loss still goes down.",
    example="loss = F.cross_entropy(model(x), y, reduction=\"sum\")   # DDP averages the ranks: each example weighs 1/N",
    message="{setup}: at step {step} {count} of {total} parameter tensors get a gradient that departs from one process's "
            "on the same {examples} from the same weights: largest relative difference {worst:.3g} on {worst_name} "
            "(cosine {cosine}; tolerance {tol:.0e}), first in forward order {first}, nearest the loss {last}.{history}"
            "{cause}",
    fix="{remedy}",
    situations={
        "scale": Situation(
            when="every compared gradient keeps its direction and is scaled by one factor (1/N, N, ...)",
            message="{setup}: at step {step} every one of the {total} compared gradients is {ratio:.4g}x ({named}) the "
                    "gradient one process computes on the same {examples} from the same weights, in the same direction."
                    "{history}{cause}"),
        "scale_adaptive": Situation(
            severity="warning",
            when="a scale on the whole gradient under an optimizer that normalises each tensor's gradient (Adam and its "
                 "kin): the update barely changes, clipping thresholds and eps see the scale",
            message="{setup}: at step {step} every one of the {total} compared gradients is {ratio:.4g}x ({named}) the "
                    "gradient one process computes on the same {examples}. {optimizer} divides each gradient by its own "
                    "running scale, so its update is nearly the same; gradient clipping, eps and any switch to SGD see "
                    "the {named} scale.{history}{cause}"),
        "tensor_scale": Situation(
            severity="warning",
            when="some tensors' gradients are scaled (direction kept) while the others agree, under an optimizer whose "
                 "update follows the gradient's scale (SGD)",
            message="{setup}: at step {step} {scaled} get {ratio:.4g}x ({named}) one process's gradient on the same "
                    "{examples}, in the same direction, while the other {rest} compared tensors agree (largest relative "
                    "difference {rest_worst:.2g}). Under {optimizer} their update is {ratio:.4g}x too.{history}{cause}"),
    },
)

GP802: Rule[object] = Rule(
    code="GP802", name="accumulation-gradient-differs", severity="error", rank=37,
    summary="The gradient accumulated over k micro-batches differs from the gradient of the same examples as one batch, "
            "from the same weights.",
    why="Accumulation is meant to give the gradient of one k-times larger batch. Micro-batch losses added without "
        "dividing by k (k times), divided twice (1/k), each normalised by its own token count, or features of the other "
        "micro-batches counted twice among a contrastive loss's negatives: the step gets a gradient that flows and is "
        "wrong, and nothing raises. Measured here against the same training at accumulation 1 on the joined batch.",
    example="for mb in micro_batches:\n    F.cross_entropy(model(mb.x), mb.y).backward()   # no / k: k times the gradient",
    message="{setup}: at step {step} {count} of {total} parameter tensors get an accumulated gradient that departs from "
            "the gradient of the same {examples} as one batch from the same weights: largest relative difference "
            "{worst:.3g} on {worst_name} (cosine {cosine}; tolerance {tol:.0e}), first in forward order {first}, nearest "
            "the loss {last}.{history}{cause}",
    fix="{remedy}",
    situations={
        "scale": Situation(
            when="every compared gradient keeps its direction and is scaled by one factor (k, 1/k, ...)",
            message="{setup}: at step {step} every one of the {total} compared gradients is {ratio:.4g}x ({named}) the "
                    "gradient of the same {examples} as one batch from the same weights, in the same direction."
                    "{history}{cause}"),
        "scale_adaptive": Situation(
            severity="warning",
            when="a scale on the whole gradient under an optimizer that normalises each tensor's gradient (Adam and its "
                 "kin)",
            message="{setup}: at step {step} every one of the {total} compared gradients is {ratio:.4g}x ({named}) the "
                    "gradient of the same {examples} as one batch. {optimizer} divides each gradient by its own running "
                    "scale, so its update is nearly the same; gradient clipping, eps and any switch to SGD see the "
                    "{named} scale.{history}{cause}"),
        "both_divide": Situation(
            when="the accumulated gradient equals the reference's, and the test setup's loss graphs show the division "
                 "by k applied twice: the script divides by its own accumulation constant, which the reference at "
                 "accumulation 1 keeps, and the framework divides again",
            message="{setup}: the accumulated gradient at steps 1-{steps} equals the reference's ({reference}; largest "
                    "relative difference {worst:.2g}), and both carry the script's own division by {k}: read from the "
                    "losses' graphs, the {k} micro-batch losses of a step weigh {mass:.3g} of one mean over the step's "
                    "batch (1.00 when the division by {k} is applied once), each multiplied by {ops}. The script "
                    "divides by {k} whatever the framework's setting, and {framework} divides again.",
            fix="Remove the division by {k} at {line}: {framework} divides the loss by the accumulation steps already."),
        "tensor_scale": Situation(
            severity="warning",
            when="some tensors' accumulated gradients are scaled (direction kept) while the others agree, under an "
                 "optimizer whose update follows the gradient's scale (SGD)",
            message="{setup}: at step {step} {scaled} get {ratio:.4g}x ({named}) the one-batch gradient, in the same "
                    "direction, while the other {rest} compared tensors agree (largest relative difference "
                    "{rest_worst:.2g}). Under {optimizer} their update is {ratio:.4g}x too.{history}{cause}"),
    },
)

GP806: Rule[object] = Rule(
    code="GP806", name="tensor-scale-by-design", severity="info", rank=90,
    summary="Some tensors' gradients are a constant multiple of the reference's (direction kept) while every other tensor "
            "agrees, under an optimizer that normalises each tensor's gradient: a measured fact, not an error.",
    why="A scheme can scale one tensor's gradient on purpose or harmlessly: contrastive accumulation that recomputes each "
        "micro-batch's features against the others' cached ones runs k backward() calls through one shared logit scale "
        "(k times its one-batch gradient), and a loss gathered from every rank with only the local features put back "
        "gives the towers 1/N and the logit scale 1. Adam and its kin divide each tensor's gradient by its own running "
        "scale, so such a constant factor does not change the update.",
    example="for j in range(k): loss(cat(cached[:j] + [f_j] + cached[j+1:]), logit_scale).backward()   # logit_scale: k x",
    message="{setup}: {scaled} get {ratio:.4g}x ({named}) the reference's gradient at every compared step, in the same "
            "direction, while the other {rest} compared tensors agree (largest relative difference {rest_worst:.2g}). "
            "{optimizer} normalises each tensor's gradient by its own running scale, so their update is unchanged.",
    fix="Nothing to change for {optimizer}. If you switch to an optimizer whose update follows the gradient's scale (SGD), "
        "or clip the gradient norm, account for the {named} factor on {scaled}.",
)

EQUIVALENCE_RULES = (GP801, GP802, GP806)
