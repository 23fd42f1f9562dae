"""Per-loss-term attribution's cost against one plain training step of the same model, both measured in this run.

The model is a VAE (MLP encoder and decoder, batch 128) whose loss is a sum of terms: the reconstruction and the KL,
plus (with --terms 3) a classifier on the latent mean. A plain step is forward, loss, backward, optimizer step. The
attributed step is the same step with the per-term attribution around its backward (checks/trace/term_split.py: the graph
split at the root, each term's reach, each term's gradient but the last by autograd.grad, the last by difference).
Prints the attribution's own cost (the time spent in it, around the step's backward) over the plain step, medians of
interleaved repeats after a warm-up, and the whole attributed step over the plain one. Target: <= 1.5x.

    python benchmarks/term_attribution.py [--repeats 7] [--terms 2] [--width 512] [--batch 128] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradprobe.checks.trace.term_split import TermProbe, term_table


class VAE(nn.Module):
    def __init__(self, d: int = 784, h: int = 512, z: int = 32, k: int = 10) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h // 2), nn.ReLU())
        self.mu, self.logvar = nn.Linear(h // 2, z), nn.Linear(h // 2, z)
        self.decoder = nn.Sequential(nn.Linear(z, h // 2), nn.ReLU(), nn.Linear(h // 2, h), nn.ReLU(), nn.Linear(h, d))
        self.classifier = nn.Linear(z, k)


def loss_of(model: VAE, x: torch.Tensor, y: torch.Tensor, terms: int) -> torch.Tensor:
    h = model.encoder(x)
    mu, logvar = model.mu(h), model.logvar(h)
    z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
    recon = F.mse_loss(model.decoder(z), x)
    kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
    loss = recon + 0.1 * kl
    if terms >= 3:
        loss = loss + F.cross_entropy(model.classifier(mu), y)
    return loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--terms", type=int, default=2, choices=(2, 3))
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: steadier on a shared machine)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = VAE(h=args.width).to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.rand(args.batch, 784, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    params = {id(p): p for p in model.parameters()}
    names = {id(p): [n] for n, p in model.named_parameters()}

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def plain() -> None:
        opt.zero_grad(set_to_none=True)
        loss_of(model, x, y, args.terms).backward()
        opt.step()
        sync()

    table: list[dict] = []
    spent: list[float] = []  # the attribution's own time in each attributed step

    def attributed() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y, args.terms)
        t0 = time.perf_counter()
        probe = TermProbe.start(loss, None, None, params, lambda i: (frozenset(), None), lambda i: [], lambda c: [])
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        assert probe is not None
        split = probe.finish()
        sync()
        spent.append(t1 - t0 + time.perf_counter() - t2)
        opt.step()
        sync()
        table[:] = term_table(split, names, [])

    # interleave the two so that drift on a shared machine hits both alike
    plain()
    attributed()
    runs: dict[Callable[[], None], list[float]] = {plain: [], attributed: []}
    for _ in range(args.repeats):
        for fn, acc in runs.items():
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    base, full = statistics.median(runs[plain]), statistics.median(runs[attributed])
    cost = statistics.median(spent[1:])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: VAE MLP width {args.width}, batch {args.batch}, {n_params:,} parameters, {args.terms} loss terms, "
          f"device {args.device}")
    for row in table:
        print(f"  term {row['term']}: reaches {', '.join(row['reaches'])}; share {row.get('share_of_grad_norm')}")
    print(f"plain training step:        {base * 1e3:.1f} ms (median of {args.repeats})")
    print(f"step with term attribution: {full * 1e3:.1f} ms (median of {args.repeats})")
    print(f"attribution itself:         {cost * 1e3:.1f} ms (median of {args.repeats})")
    print(f"attributed step / plain step: {full / base:.2f}x")
    print(f"attribution cost / plain step: {cost / base:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
