"""The ecosystem sweep's fixed fast sample: healthy real models of every family, diagnosed through the
sandbox the server uses, with plain-PyTorch ground truth. No internal crash, no error on a model that trains.

The full sweep (hundreds of models) is `python benchmarks/sweep.py`; see the README.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT


def test_sweep_sample_has_no_crash_and_no_false_error():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep.py"), "--sample", "--json"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(proc.stdout)
    results = payload["results"]
    built = [r for r in results if r["status"] != "skipped"]
    families = {r["family"] for r in built}
    # every family that can run here was built (diffusers only when installed: the `sweep` extra)
    expected = {"transformers", "midtrain", "peft", "examples"}
    try:
        import diffusers  # noqa: F401
        expected.add("diffusers")
    except ImportError:
        pass
    assert expected <= families, [(r["name"], r.get("skip")) for r in results if r["status"] == "skipped"]
    bad = [(r["family"], r["name"],
            [(e["code"], e["message"][:200], e.get("frame")) for e in r.get("crashes", []) + r.get("errors", [])])
           for r in results if r["status"] in ("crash", "false_error")]
    assert not bad, bad
    # the sample's models are small: one that stops at the sandbox's memory limit (GP113) is a regression too
    limited = [(r["family"], r["name"], [e["message"][:200] for e in r.get("resource_limits", [])])
               for r in results if r["status"] == "resource_limit"]
    assert not limited, limited
