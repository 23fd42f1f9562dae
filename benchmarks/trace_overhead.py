"""trace_grad_path overhead on a GPT-2-small-sized model (12 layers, 768 wide, random weights), CPU.

Prints the ratio of a traced step to a plain forward + backward of the same model and batch,
both measured in this run (median of several repeats after a warm-up). Target: <= 1.3x.

    python benchmarks/trace_overhead.py [--repeats 3] [--layers 12] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gradprobe.checks import trace_grad_path
from gradprobe.checks.core.step import default_loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    model = GPT2LMHeadModel(cfg).to(args.device)
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device=args.device)
    batch = {"input_ids": ids, "labels": ids}

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def plain():
        model.zero_grad(set_to_none=True)
        out = model(**batch)
        default_loss(out).backward()
        sync()

    def traced():
        model.zero_grad(set_to_none=True)
        report = trace_grad_path(model, batch, project_dir="/nonexistent-user-dir")
        sync()
        assert report["ok"], report["summary"]

    # interleave the two so that drift on a shared machine hits both alike
    plain()
    traced()
    t_plain, t_traced = [], []
    for _ in range(args.repeats):
        for fn, acc in ((plain, t_plain), (traced, t_traced)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    base, tr = statistics.median(t_plain), statistics.median(t_traced)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: GPT-2 {args.layers} layers x 768, batch 2x128, {n_params:,} parameters, device {args.device}")
    print(f"plain forward+backward: {base:.3f} s (median of {args.repeats})")
    print(f"trace_grad_path:        {tr:.3f} s (median of {args.repeats})")
    print(f"ratio: {tr / base:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
