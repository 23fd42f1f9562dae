"""audit_training overhead: N observed steps vs the same N plain steps of the same train_step, in this process.

The model is a small GPT-2 (random weights, no download), the step the canonical loop: zero_grad, forward with
labels, backward, clip_grad_norm_, AdamW step. Both sides start from the same seed and the same weights (rebuilt
before each run), run one warm-up step, then are timed; the repeats alternate. "In-child time" is what the
sandboxed child spends in the tool: audit_report (the N observed steps, the measurements, the rules and the
report) against the N plain calls of the same train_step. On a shared, loaded machine wall time is noise, so the
ratio is of this process's CPU time (time.process_time) with one torch thread; wall times are printed beside it.
On CUDA the ratio is of wall time. Target: <= 1.3x.

With `--accum K` the step accumulates K micro-batches (each loss divided by K), and the target has a loss_fn, so the
audit also takes the full-batch gradient after the first accumulated step (gradprobe/checks/steps/fullbatch.py).

    python benchmarks/audit_overhead.py [--steps 4] [--repeats 3] [--layers 2] [--width 256] [--device cpu] [--accum 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gradprobe.checks.steps import audit_report
from gradprobe.loading import live_target


ACCUM = [1]


def train_step(model: Any, batch: dict, optimizer: Any) -> float:
    optimizer.zero_grad(set_to_none=True)
    k, total = ACCUM[0], 0.0
    for ids, labels in zip(batch["input_ids"].chunk(k), batch["labels"].chunk(k), strict=True):
        loss = model(input_ids=ids, labels=labels).loss / k
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def loss_fn(out: Any, batch: dict) -> torch.Tensor:
    return out.loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--accum", type=int, default=1)
    args = ap.parse_args()
    ACCUM[0] = args.accum
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    clock = time.perf_counter if cuda else time.process_time
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=8, vocab_size=4096, n_positions=256)
    ids = torch.randint(0, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1)).to(args.device)
    batch = {"input_ids": ids, "labels": ids}

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def fresh() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg).to(args.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    def plain() -> tuple[float, float]:
        model, opt = fresh()
        train_step(model, batch, opt)  # warm-up, as the audited side
        sync()
        t0, w0 = clock(), time.perf_counter()
        for _ in range(args.steps):
            train_step(model, batch, opt)
        sync()
        return clock() - t0, time.perf_counter() - w0

    def audited() -> tuple[float, float]:
        model, opt = fresh()
        train_step(model, batch, opt)
        loaded = live_target(model, batch, loss_fn=loss_fn if args.accum > 1 else None, optimizer=opt,
                             train_step=train_step, project_dir=__file__.rsplit("/", 1)[0])
        sync()
        t0, w0 = clock(), time.perf_counter()
        report = audit_report(loaded, steps=args.steps)
        sync()
        elapsed = clock() - t0, time.perf_counter() - w0
        assert report["ok"] and report["facts"]["verdicts"], report["summary"]
        if args.accum > 1:
            assert report["facts"]["full_batch"]["ratio"] is not None, report["facts"]["full_batch"]
        return elapsed

    ratios, plains, audits = [], [], []
    for _ in range(args.repeats):
        (p, pw), (a, aw) = plain(), audited()
        plains.append(p)
        audits.append(a)
        ratios.append(a / p)
        print(f"plain {args.steps} steps {p:.3f} s (wall {pw:.3f})   audit_training {a:.3f} s (wall {aw:.3f})   "
              f"ratio {a / p:.2f}x")
    n = sum(p.numel() for p in GPT2LMHeadModel(cfg).parameters())
    print(f"audit_overhead: GPT-2 {args.layers}x{args.width} ({n / 1e6:.1f} M parameters), batch 4x64, {args.steps} steps, "
          f"{f'{args.accum} micro-batches per step, ' if args.accum > 1 else ''}"
          f"{args.device}, {'wall' if cuda else 'CPU'} time, {args.threads} thread(s): "
          f"median ratio {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x; "
          f"plain median {statistics.median(plains):.3f} s, audit median {statistics.median(audits):.3f} s; target <= 1.3x)")


if __name__ == "__main__":
    main()
