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


def test_sweep_sample_with_steps_has_no_new_code_warning():
    """One sample model per family, diagnosed with 2 observed training steps: the steps audit runs on each, and
    gives no crash, no false error and no warning from this round's new codes (GP6xx and the others in NEW_CODES)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep.py"), "--sample", "--steps", "2", "--limit", "1",
                           "--json"], capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(proc.stdout)
    assert payload["steps"] == 2
    built = [r for r in payload["results"] if r["status"] != "skipped"]
    assert {"transformers", "midtrain", "peft", "examples"} <= {r["family"] for r in built}
    assert len(built) <= len({r["family"] for r in built}), [r["name"] for r in built]  # --limit 1: one per family
    bad = [(r["name"], [(e["code"], e["message"][:200]) for e in r.get("crashes", []) + r.get("errors", [])
                        + r.get("new_code_warnings", [])]) for r in built
           if r["status"] in ("crash", "false_error") or r.get("new_code_warnings")]
    assert not bad, bad
    not_audited = [(r["name"], r.get("steps_note")) for r in built if not r.get("steps_audited")]
    assert not not_audited, not_audited
