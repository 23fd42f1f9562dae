"""verify_prompt_tuning (GP5xx): does the soft prompt learn, and only the prompt? Hand-written and PEFT prompt tuning.

    engine        one real step under the trace machinery with the base model observed (PromptFacts); the public entry
    soft_prompt   where the prompt is (found by what the forward does with it)
    prompt_use    how the forward used it (ids or embeddings, mask, labels, cache)
    prompt_rules  the GP5xx rules
"""

from __future__ import annotations

from typing import Any

__all__ = ["prompt_report", "verify_prompt_tuning"]


def __getattr__(name: str) -> Any:
    # the engine imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.prompt import engine

        return getattr(engine, name)
    raise AttributeError(name)
