"""What a call can find of other calls and of the warm worker in its own process: nothing of an earlier call's
request in its memory (frames, gc, the raw heap), and no descriptor but its own. Through the real server."""

from __future__ import annotations

import json
import secrets

import pytest

from test_sandbox_hostile import call, project

# The marker is searched as two halves that the probe never joins: the probe's own copies of the halves are apart,
# so only a copy of the whole marker that came from somewhere else (an earlier request) is a hit.
SCAN = """
import gc, json, sys

def _joined(text, a, b):
    i = text.find(a)
    while i >= 0:
        if text[i + len(a):i + len(a) + len(b)] == b:
            return True
        i = text.find(a, i + 1)
    return False

def _raw(pairs):
    hits, halves, scanned = {}, 0, 0
    import ctypes
    for line in open('/proc/self/maps').read().splitlines():
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split('-'))
        name = parts[5] if len(parts) > 5 else ''
        if 'r' not in parts[1] or (name and not name.startswith('[heap') and not name.startswith('[stack')):
            continue
        if hi - lo > (1 << 30):
            continue
        pos = lo
        while pos < hi:
            n = min(hi - pos, 1 << 24)
            chunk = ctypes.string_at(pos, min(n + 64, hi - pos))  # readable by the maps: read in place
            scanned += len(chunk)
            for a, b in pairs:
                halves += chunk.count(a.encode())
                if _joined(chunk, a.encode(), b.encode()):
                    hits[a] = hits.get(a, 0) + 1
            pos += n
    return hits, halves, scanned

def _objects(pairs):
    found = []
    def look(v, where):
        if isinstance(v, (str, bytes)):
            for a, b in pairs:
                aa, bb = (a, b) if isinstance(v, str) else (a.encode(), b.encode())
                if _joined(v, aa, bb):
                    found.append(where)
    for o in gc.get_objects():
        if isinstance(o, dict):
            for k, v in list(o.items()):
                look(k, 'gc dict key')
                look(v, 'gc dict value')
        elif isinstance(o, (list, tuple)):
            for v in list(o):
                look(v, 'gc sequence')
    for frame in sys._current_frames().values():
        while frame is not None:
            for v in list(frame.f_locals.values()):
                look(v, 'frame ' + frame.f_code.co_name)
            frame = frame.f_back
    return found

def attempt():
    pairs = PAIRS
    raw, halves, scanned = _raw(pairs)
    return json.dumps({'raw': raw, 'halves': halves, 'scanned': scanned, 'objects': _objects(pairs)})

def build_model():
    raise ValueError('PROBE[' + attempt() + ']')
"""


def _halves() -> tuple[str, str]:
    return "GPMARK" + secrets.token_hex(8), secrets.token_hex(8) + "KRAMPG"


@pytest.mark.anyio
async def test_an_earlier_calls_request_is_not_in_the_next_calls_memory(client, tmp_path):
    """Call 1 sends a marker in inline `setup` code and in a script's `args`; call 2 searches its whole memory."""
    (a1, b1), (a2, b2) = _halves(), _halves()
    first = tmp_path / "first"
    first.mkdir()
    (first / "train.py").write_text("import sys\nprint(len(sys.argv))\n")
    setup = f"import torch, torch.nn as nn\nSECRET = '{a1}{b1}'\nmodel = nn.Linear(3, 1)\ninputs = torch.randn(2, 3)\n"
    await client.call_tool("inspect_parameters", {"target": {"project_dir": str(first), "setup": setup, "timeout_s": 60}})
    await client.call_tool("diagnose", {"target": {"project_dir": str(first), "script": "train.py",
                                                    "args": [f"--api-key={a2}{b2}"], "timeout_s": 60}})
    second = tmp_path / "second"
    second.mkdir()
    tmp = project(second, SCAN.replace("PAIRS", repr([(a1, b1), (a2, b2)])))
    result, _ = await call(client, tmp)
    msg = result.structured_content["findings"][0]["message"]
    assert "PROBE[" in msg, result.structured_content["findings"][0]
    seen = json.loads(msg.split("PROBE[", 1)[1].rsplit("]", 1)[0])
    assert seen["scanned"] > 10 << 20 and seen["halves"] >= 2, seen  # the scan did read this process's memory
    assert seen["raw"] == {} and seen["objects"] == [], seen


FDS = """
import json, os
def attempt():
    out = {}
    for n in os.listdir('/proc/self/fd'):
        try:
            out[n] = os.readlink('/proc/self/fd/' + n)
        except OSError:
            pass
    return json.dumps(out)
def build_model():
    raise ValueError('PROBE[' + attempt() + ']')
"""


@pytest.mark.anyio
async def test_user_code_holds_only_the_calls_own_descriptors(client, tmp_path):
    """The first call after the worker starts and a later one: stdio, the result pipe, and the listing itself."""
    for i in range(2):
        d = tmp_path / f"c{i}"
        d.mkdir()
        result, _ = await call(client, project(d, FDS))
        msg = result.structured_content["findings"][0]["message"]
        fds = json.loads(msg.split("PROBE[", 1)[1].rsplit("]", 1)[0])
        others = {n: t for n, t in fds.items() if n not in ("0", "1", "2")}
        assert not [t for t in others.values() if t.startswith(("socket:", "user:", "anon_inode:", "net:", "mnt:"))], fds
        pipes = [t for t in others.values() if t.startswith("pipe:")]
        assert len(pipes) == 1 and len(others) <= 2, fds  # the result pipe (and the directory being listed)
