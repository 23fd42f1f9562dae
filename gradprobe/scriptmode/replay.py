"""The script's captured step, replayed for the checks: every model it trained (several.py), or the one (step.py)."""

from __future__ import annotations

from gradprobe.scriptmode.observe import StepWatch
from gradprobe.scriptmode.several import several_replay
from gradprobe.scriptmode.step import Replay, replay_one
from gradprobe.userframes import UserCode


def replay(watch: StepWatch, user: UserCode) -> Replay | None:
    """Choose the model(s) and build the replayed step; None when nothing was trained."""
    cap = watch.capture
    roots = [b.root for b in watch.backwards if b.root is not None]
    several = several_replay(watch, cap.optimizer if cap is not None else None, roots, user)
    if several is not None:  # several models trained: every one of this step's, under the script's names for them
        return several
    return replay_one(watch, user)
