"""Padding-free training of a small Llama with DistributedDataParallel at 2 processes: transformers'
DataCollatorWithFlattening packs each rank's batch into one row with position_ids that restart, the model is called as
`model(**batch)`. The configuration keeps use_cache=True (its default outside the Trainer), so a KV cache is built for
the training forward and transformers' packed-sequence mask is off: every packed example attends to the ones before it.
check_equivalence's packing comparison (on the script's first step, as one process) runs the packed batch against the
same examples padded one per row from the same weights: GP803. After https://github.com/huggingface/transformers/issues/25452
(packing without cross-contamination) and https://github.com/huggingface/trl/issues/784; the healthy twin,
equiv_ops/ddp_packed_llama.py, sets use_cache=False.

    torchrun --nproc_per_node=2 ddp_packed_llama_cache.py --steps 100
    gradprobe check_equivalence --script ddp_packed_llama_cache.py --world-size 2 -- --steps=2
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP803"], "culprits": [], "args": ["--steps=2"],
          "verified": ["storage:"], "options": {"compare": ["custom_ops", "storage", "packing"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=64)
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
