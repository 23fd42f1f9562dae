"""A project's own launcher, healthy: it starts torchrun on the real training script (train_ddp.py) with
subprocess.run, as many repositories' `launch.py` / `run_distributed.py` do. gradprobe reads the torchrun command with
torchrun's own argument parser, stops the launcher there, and compares what it starts: train_ddp.py at 2 processes
against the same script as one process. Written after the launcher layout of
https://github.com/huggingface/accelerate/issues/1154's thread and torchrun's documentation
(https://pytorch.org/docs/stable/elastic/run.html).

    python launch_torchrun.py --steps 100
    gradprobe check_equivalence --script launch_torchrun.py -- --steps=4
"""

import argparse
import os
import subprocess
import sys

EXPECT = {"tool": "check_equivalence", "world_size": 1, "codes": [], "healthy": True, "args": ["--steps=4"],
          "absent": ["GP801"], "launched": "train_ddp.py", "options": {"compare": ["ranks"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--nproc", type=int, default=2)
args = parser.parse_args()
cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "train_ddp.py",
       f"--steps={args.steps}"]
subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
