"""A src/ layout whose script imports its package as if it were installed, with no install and no sys.path line:
`python scripts/run.py recipes/tiny.yaml` from the root fails with `No module named 'tinylm'` (Python puts scripts/
first on sys.path, not the working directory), as in https://github.com/huggingface/alignment-handbook/issues/23
(`scripts/run_sft.py` and `No module named 'alignment'` until the project is installed with `pip install -e .`).

gradprobe says so as GP122 (the package is in the project, in src/; what sys.path began with; what to set), not as an
error of the training code, and checks nothing.

    cd examples/scripts/verdict_src_uninstalled_broken && python scripts/run.py recipes/tiny.yaml
"""

import sys

import torch
import torch.nn.functional as F

from tinylm.model import TinyLM


def read_recipe(path: str) -> dict:
    cfg = {}
    for line in open(path, encoding="utf-8"):
        key, _, value = line.partition(":")
        if key.strip():
            cfg[key.strip()] = value.strip()
    return cfg


cfg = read_recipe(sys.argv[1])
torch.manual_seed(0)
model = TinyLM(int(cfg["vocab"]), int(cfg["dim"]))
optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]))
for _step in range(int(cfg["steps"])):
    idx = torch.randint(0, int(cfg["vocab"]), (4, 8))
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", round(loss.item(), 4))
