"""check_optimizer_coverage (GP2xx): does the optimizer hold exactly the model's trainable parameters, and does a
step move them?

    engine              coverage by tensor identity (CoverageFacts), the GP2xx rules, one real step; the public entry
    param_groups        GP204, GP205: what each param group holds and the lr it gets
    group_sources       where each group came from in the user's code (recorded while build_model runs)
    param_updates       whether one real step moved each parameter (GP207)
    several_optimizers  GP210, GP211: a model split over several optimizers
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_optimizer_coverage", "optimizer_report"]


def __getattr__(name: str) -> Any:
    # the engine imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.optimizer import engine

        return getattr(engine, name)
    raise AttributeError(name)
