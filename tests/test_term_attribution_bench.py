"""The per-loss-term attribution benchmark runs (a tiny model, one repeat): it prints its ratio and each term's reach.

The figure itself is `python benchmarks/term_attribution.py` (see the performance table in docs/performance.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT


def test_term_attribution_benchmark_runs():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "term_attribution.py"), "--repeats", "2",
                           "--width", "32", "--batch", "8", "--terms", "3"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "attribution cost / plain step:" in proc.stdout, proc.stdout
    assert "term 2: reaches classifier, mu" in proc.stdout, proc.stdout
