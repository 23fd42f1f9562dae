"""The script's captured step, replayed for the checks: every model it trained (several.py), or the one (step.py)."""

from __future__ import annotations

from gradprobe.scriptmode.observe import StepWatch
from gradprobe.scriptmode.several import several_replay
from gradprobe.scriptmode.step import Replay, outermost_modules, replay_one
from gradprobe.userframes import UserCode


def replay(watch: StepWatch, user: UserCode) -> Replay | None:
    """Choose the model(s) and build the replayed step; None when nothing was trained."""
    cap = watch.capture
    roots = [b.root for b in watch.backwards if b.root is not None]
    outer = outermost_modules()  # one walk over the live objects, for both questions (it is the costly part)
    several = several_replay(watch, cap.optimizer if cap is not None else None, roots, user, outer=outer)
    if several is not None:  # several models trained: every one of this step's, under the script's names for them
        return several
    return replay_one(watch, user, outer)
