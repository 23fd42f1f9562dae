"""Healthy twin of equiv_ops_broken/ddp_packed_llama_cache.py: padding-free training of a small Llama with
DistributedDataParallel at 2 processes (DataCollatorWithFlattening: one packed row per rank's batch, position_ids that
restart), with use_cache=False as the Trainer sets it for training, so transformers builds the packed-sequence mask
and no example attends to another. check_equivalence's packing comparison (on the script's first step, as one
process) finds the packed batch's loss and gradients equal to the same examples padded one per row, and says it.

    torchrun --nproc_per_node=2 ddp_packed_llama.py --steps 100
    gradprobe check_equivalence --script ddp_packed_llama.py --world-size 2 -- --steps=2
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "absent": ["GP803"],
          "args": ["--steps=2"], "verified": ["packed", "storage:"], "options": {"compare": ["custom_ops", "storage", "packing"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
model = DDP(LlamaForCausalLM(config))
texts = [{"input_ids": torch.randint(0, 96, (int(n),)).tolist()} for n in torch.randint(4, 9, (32,))]
loader = DataLoader(texts, batch_size=3, sampler=DistributedSampler(texts, shuffle=False),
                    collate_fn=DataCollatorWithFlattening(return_tensors="pt"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.train()
for step, batch in enumerate(loader):
    out = model(**batch)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step + 1 >= args.steps:
        break
dist.destroy_process_group()
