"""The fair pool: bounded concurrency, a per-caller cap, FIFO otherwise, and 'waiting' progress."""

from __future__ import annotations

import anyio
import pytest

from gradprobe.server.runtime import Runtime


class FakeCtx:
    def __init__(self):
        self.messages = []

    async def report_progress(self, progress, total=None, message=None):
        self.messages.append(message)


@pytest.mark.anyio
async def test_one_caller_cannot_starve_another():
    rt = Runtime(max_concurrent=2, per_caller=1, warm=False)
    started: list[str] = []
    peak = 0
    ctx_b = FakeCtx()

    async def job(caller: str, name: str, ctx=None):
        nonlocal peak
        async with rt.slot(ctx, caller):
            started.append(name)
            peak = max(peak, rt.running)
            await anyio.sleep(0.3)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(job, "alice", f"a{i}")
        await anyio.sleep(0.05)
        tg.start_soon(job, "bob", "b0", ctx_b)
    assert peak <= 2
    assert started.index("b0") < started.index("a1"), started  # bob is not queued behind alice's burst
    assert rt.running == 0 and rt.queued == 0


@pytest.mark.anyio
async def test_waiting_callers_are_told_how_many_are_ahead():
    rt = Runtime(max_concurrent=1, warm=False)
    ctx = FakeCtx()

    async def hold():
        async with rt.slot(None, "x"):
            await anyio.sleep(0.4)

    async def wait_behind():
        async with rt.slot(ctx, "y"):
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await anyio.sleep(0.05)
        tg.start_soon(wait_behind)
    assert ctx.messages and ctx.messages[0] == "waiting: 1 ahead of you"


@pytest.mark.anyio
async def test_cancelled_waiter_leaves_the_queue():
    rt = Runtime(max_concurrent=1, warm=False)

    async def hold():
        async with rt.slot(None, "x"):
            await anyio.sleep(0.3)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await anyio.sleep(0.05)
        with anyio.move_on_after(0.1):
            async with rt.slot(None, "y"):
                pass
        assert rt.queued == 0
    assert rt.running == 0
