"""Server-wide state shared by the tools: limits and a bounded pool of concurrent checks."""

from __future__ import annotations

import contextlib
import os
import tempfile

import anyio

from gradprobe.sandbox.runner import Limits, child_env
from gradprobe.sandbox.warm import WarmWorker

PHASES = ("queued", "starting", "importing", "building", "checking")


class Runtime:
    def __init__(self, max_concurrent: int | None = None, limits: Limits | None = None, warm: bool = True):
        self.max_concurrent = max_concurrent or os.cpu_count() or 2
        self.limits = limits or Limits()
        self.warm = WarmWorker(child_env(tempfile.gettempdir())) if warm else None
        self._slots = anyio.Semaphore(self.max_concurrent)
        self._waiting = 0
        self.phase_total = float(len(PHASES))

    def phase_index(self, phase: str) -> float:
        return float(PHASES.index(phase) + 1) if phase in PHASES else self.phase_total

    @contextlib.asynccontextmanager
    async def slot(self, ctx, progress):
        """Wait for a free slot (telling the caller how many are ahead), then hold it."""
        if self._slots.value == 0:
            ahead = self._waiting
            self._waiting += 1
            try:
                if ctx is not None:
                    try:
                        await ctx.report_progress(0, total=self.phase_total, message=f"waiting: {ahead + 1} ahead of you")
                    except Exception:
                        pass
                await self._slots.acquire()
            finally:
                self._waiting -= 1
        else:
            await self._slots.acquire()
        try:
            yield
        finally:
            self._slots.release()
