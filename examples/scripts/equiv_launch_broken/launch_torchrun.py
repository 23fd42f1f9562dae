"""A project's own launcher that starts torchrun on its training script (train_sum.py) through the shell, as many
repositories' `run.sh`-in-Python launchers do: `subprocess.check_call("OMP_NUM_THREADS=1 torchrun ...", shell=True)`.
The training script sums its loss over each rank's local batch under DDP (https://github.com/pytorch/pytorch/issues/37359):
gradprobe follows the launcher to what it starts and finds the 1/N gradient at the reduction's line in train_sum.py.

    python launch_torchrun.py --steps 100
    gradprobe check_equivalence --script launch_torchrun.py -- --steps=4
"""

import argparse
import subprocess

EXPECT = {"tool": "check_equivalence", "world_size": 1, "codes": ["GP801"], "culprits": ["0.weight"], "line": 30,
          "file": "train_sum.py", "args": ["--steps=4"], "ratio_is": "1/N", "launched": "train_sum.py",
          "options": {"compare": ["ranks"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
subprocess.check_call(f"OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 train_sum.py --steps {args.steps}", shell=True)
