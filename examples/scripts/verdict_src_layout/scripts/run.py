"""The healthy twin of verdict_src_uninstalled_broken: a src/ layout whose script puts src/ on sys.path itself, run from
the repository root as `python scripts/run.py recipes/tiny.yaml` (the recipe path is relative to the working directory).

gradprobe runs it as that command does: the working directory is the root (the CLI's, or project_dir over MCP),
sys.path begins with scripts/, and the recipe resolves against the root.

    cd examples/scripts/verdict_src_layout && python scripts/run.py recipes/tiny.yaml
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

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
