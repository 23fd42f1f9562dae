"""Progress notifications carry what the child sends as a phase: through a real MCP client, they arrive without
terminal control characters (a phase is one of the protocol's Phase values: anything else is dropped), and one call
cannot flood the client with them."""

from __future__ import annotations

import pytest

from test_sandbox_hostile import project

FLOOD = """
import json, os
def build_model():
    forged = json.dumps({'type': 'progress', 'phase': '\\x1b]52;c;aGVsbG8=\\x07\\x1b[2J\\x9b31m'}) + '\\n'
    phases = ['importing', 'building', 'checking', 'running the script', 'replaying the captured step']
    for n in os.listdir('/proc/self/fd'):
        try:
            pipe = int(n) > 2 and os.readlink('/proc/self/fd/' + n).startswith('pipe:')
        except OSError:
            pipe = False
        if pipe:
            for i in range(400):
                try:
                    os.write(int(n), forged.replace('m', 'm%d' % i).encode())
                    os.write(int(n), (json.dumps({'type': 'progress', 'phase': phases[i % 5]}) + '\\n').encode())
                except OSError:
                    break
    return nn.Linear(3, 1)
"""


@pytest.mark.anyio
async def test_progress_from_the_child_is_inert_and_bounded(client, tmp_path):
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    tmp = project(tmp_path, FLOOD)
    result = await client.call_tool("inspect_parameters", {"target": {"project_dir": tmp, "model": "case.py", "timeout_s": 60}},
                                    progress_callback=on_progress)
    assert result.structured_content is not None
    assert len(seen) <= 64 + 8, len(seen)  # the cap, and the server's own few (queued, starting)
    bad = [m for m in seen if any(ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f for ch in m)]
    assert not bad, bad[:3]
    assert not any("52;c;aGVsbG8=" in m for m in seen), seen  # not a phase: dropped
    assert sum(m == "checking" for m in seen) >= 5, seen  # the valid ones came through, up to the cap
