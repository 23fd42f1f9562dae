"""The cost of checking each custom autograd.Function again at perturbed weights (issue 37, item 4).

For each target (a directory holding case.py, as the bugzoo's, or an examples/broken file) it loads the target once,
discovers the custom Functions in one step, and times run_gradcheck's checks of them with the perturbed check off
(weights_at empty: the check as it was) and on, alternately, in this one process; prints per target the median of each
and the ratio, and the ratio over all targets (the sum of the medians).

    python -m benchmarks.custom_ops_cost [--repeats 5] [TARGET ...]

With no TARGET: the bugzoo's custom-Function cases when /work/shared/bugzoo is there, else this repo's examples.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from gradprobe.checks.gradcheck import engine as gradcheck
from gradprobe.loading import load_target

ROOT = Path(__file__).resolve().parent.parent
BUGZOO = Path("/work/shared/bugzoo")
CASES = ("bias-gelu-wrong-derivative", "rmsnorm-function-missing-grad", "custom-linear-no-bias-grad",
         "ctrl-swish-function-mlp")
EXAMPLES = ("gp401_rmsnorm_backward_drops_weight.py", "healthy_rmsnorm_function.py", "healthy_custom_function.py",
            "healthy_float32_internal_function.py")


def _targets(given: list[str]) -> list[dict[str, str]]:
    paths = [Path(p) for p in given] or ([BUGZOO / c for c in CASES] if BUGZOO.is_dir() else
                                        [ROOT / "examples" / "broken" / e for e in EXAMPLES])
    return [{"project_dir": str(p), "model": "case.py"} if p.is_dir() else {"project_dir": str(p.parent), "model": p.name}
            for p in paths]


def _time(loaded, watch, direct, perturbed: bool) -> float:
    calls = watch.calls
    if not perturbed:
        saved = {cls: entry.get("weights_at") for cls, entry in calls.items()}
        for entry in calls.values():
            entry["weights_at"] = []
    t0 = time.perf_counter()
    gradcheck.gradcheck_findings(loaded, watch, direct)
    dt = time.perf_counter() - t0
    if not perturbed:
        for cls, w in saved.items():
            calls[cls]["weights_at"] = w
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args()
    total_off = total_on = 0.0
    for target in _targets(args.targets):
        loaded = load_target(target)
        watch, direct, _, _ = gradcheck.discover(loaded)
        _time(loaded, watch, direct, True)  # warm-up
        off, on = [], []
        for _ in range(args.repeats):
            off.append(_time(loaded, watch, direct, False))
            on.append(_time(loaded, watch, direct, True))
        m_off, m_on = statistics.median(off), statistics.median(on)
        total_off, total_on = total_off + m_off, total_on + m_on
        name = Path(target["project_dir"]).name if target["model"] == "case.py" else target["model"]
        print(f"{name:45s} without {m_off * 1e3:8.1f} ms   with {m_on * 1e3:8.1f} ms   ratio {m_on / m_off:5.2f}x")
    print(f"all: the perturbed check costs {total_on / total_off:.2f}x the check without it (sum of medians, this run)")


if __name__ == "__main__":
    main()
