"""check_dependencies' cost: one sampled check against one plain training step of the same model, in this process.

The models are a small Llama and a small GPT-2 (random weights, no download), trained as causal LMs (labels =
input_ids). The plain step: zero_grad, forward with labels, backward, AdamW step. The sampled check: the engine's
measurement on the same batch (one forward with the inputs as leaves, the loss's gradient with respect to the logits
to read the claim, one batched backward for `--positions` sampled outputs, and the verdict), the healthy path where
no leak needs explaining. A packed batch (DataCollatorWithFlattening, position ids restarting, use_cache=False) is
timed too: the sampled check in the path the training runs, then with the extra measurements beside it (the same
rows called with use_cache=True: one more forward and pass; packed vs padded: the packed and the padded batch forward
and backward, two training steps' worth by design).

On a shared, loaded machine wall time is noise, so the ratio is of this process's CPU time (time.process_time) with
one torch thread; the best of the repeats of each side, alternating. Target for the sampled check: <= 1.5x.

    python -m benchmarks.dependencies_cost [--repeats 5] [--layers 2] [--width 256] [--seq 128] [--batch 4]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DataCollatorWithFlattening, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from gradprobe.checks.dependencies.engine import CHECKS, measure
from gradprobe.loading import live_target


def _llama(layers: int, width: int, seq: int) -> Any:
    return LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=width, intermediate_size=4 * width,
                                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=max(seq, 64), use_cache=False))


def _gpt2(layers: int, width: int, seq: int) -> Any:
    return GPT2LMHeadModel(GPT2Config(vocab_size=1024, n_embd=width, n_layer=layers, n_head=4, n_positions=max(seq, 64),
                                      bos_token_id=0, eos_token_id=0))


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _one(name: str, model: Any, batch: dict, repeats: int, positions: int | None, checks: tuple[str, ...]) -> float:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()

    loaded = live_target(model, batch)

    def check() -> None:
        out = measure(loaded, checks, positions)
        assert not any(f["severity"] == "error" for f in out.findings), out.findings

    step()
    check()  # warm-up of both
    plain, probe = [], []
    for _ in range(repeats):  # alternate, so both sides see the same machine
        plain.append(_best(step, 1))
        probe.append(_best(check, 1))
    ratio = min(probe) / min(plain)
    print(f"{name:44s} plain step {min(plain) * 1e3:8.1f} ms CPU   check {min(probe) * 1e3:8.1f} ms CPU   ratio {ratio:.2f}x")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--positions", type=int, default=None, help="default: the tool's own (5, in at most 3 passes)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ids = torch.randint(0, 1024, (args.batch, args.seq))
    batch = {"input_ids": ids, "labels": ids}
    sampled = ("causality", "examples", "packed")
    ratios = {}
    for name, make in (("llama", _llama), ("gpt2", _gpt2)):
        ratios[name] = _one(f"{name} causal LM, positions {args.positions or 'default'}", make(args.layers, args.width, args.seq),
                            batch, args.repeats, args.positions, sampled)
    lengths = torch.randint(args.seq // 4, args.seq // 2, (args.batch,)).tolist()
    packed = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": torch.randint(0, 1024, (n,)).tolist()}
                                                               for n in lengths])
    llama = _llama(args.layers, args.width, args.seq)
    ratios["packed"] = _one(f"llama packed ({len(lengths)} examples), sampled", llama, packed, args.repeats, args.positions,
                            sampled)
    _one("llama packed, + use_cache=True probe", llama, packed, args.repeats, args.positions, sampled + ("packed_outside",))
    _one("llama packed, + packed vs padded", llama, packed, args.repeats, args.positions, sampled + ("packed_vs_padded",))
    _one("llama packed, every check", llama, packed, args.repeats, args.positions, CHECKS)
    worst = max(ratios.values())
    print(f"sampled check / plain training step: worst {worst:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
