"""GP708's threshold, measured: each parameter's gradient underflow under torch.autocast against fp32, on healthy
models of the sweep's families (tiny configs, random init) and a small CNN, in bfloat16 and in float16 with no
GradScaler (the configuration GP708 judges). In-process (no server): the step runs once under `AutocastWatch`, then
`autocast_underflow.measure` reruns it in autocast and in fp32 on copies, as diagnose does. Prints, per model and
dtype, the largest underflow fraction over parameters with at least MIN_ENTRIES fp32-nonzero entries, and how many
parameters reach UNDERFLOW.

    python benchmarks/autocast_underflow.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gradprobe.checks.precision import autocast_underflow as au  # noqa: E402

SPECS = [
    {"family": "transformers", "task": "causal_lm", "model_type": "gpt2", "cls": "GPT2LMHeadModel"},
    {"family": "transformers", "task": "seq_cls", "model_type": "bert", "cls": "BertForSequenceClassification"},
    {"family": "transformers", "task": "image_cls", "model_type": "vit", "cls": "ViTForImageClassification"},
    {"family": "transformers", "task": "causal_lm", "model_type": "llama", "cls": "LlamaForCausalLM"},
    {"family": "diffusers", "cls": "UNet2DModel"},
]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def _cnn() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    batch = {"x": torch.randn(16, 3, 32, 32), "y": torch.randint(0, 10, (16,))}
    return SmallCNN(), batch, lambda out, b: F.cross_entropy(out, b["y"])


def _sweep(spec: dict) -> tuple[nn.Module, Any, Any]:
    import sweep_models

    model, batch, loss_fn, _ = sweep_models.build(spec)
    return model, batch, loss_fn


def measure(model: nn.Module, batch: Any, loss_fn: Any, dtype: torch.dtype) -> au.UnderflowFacts | None:
    from gradprobe.checks.core.step import call_model

    def step(m: nn.Module, b: Any, opt: Any) -> Any:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = loss_fn(call_model(m, b), b)
        loss.float().backward()
        return loss

    user = SimpleNamespace(innermost=lambda frame=None: None)
    loaded = SimpleNamespace(model=model, batch=batch, loss_fn=loss_fn, train_step=step)
    watch = au.AutocastWatch(model, user)
    with watch:
        step(model, batch, torch.optim.SGD(model.parameters(), lr=0.0))
    return au.measure(loaded, watch, step_failed=False)


def main() -> int:
    rows = [("small CNN", _cnn)] + [(f"{s['family']}:{s.get('model_type', s['cls'])}", lambda s=s: _sweep(s)) for s in SPECS]
    print(f"{'model':28} {'dtype':9} {'params':>6} {'max underflow':>13} {'>= threshold':>12}")
    for name, make in rows:
        for dtype in (torch.bfloat16, torch.float16):
            try:
                model, batch, loss_fn = make()
                facts = measure(model, batch, loss_fn, dtype)
            except Exception as exc:  # a model this torch cannot build or autocast: say so and go on
                print(f"{name:28} {str(dtype)[6:]:9} skipped: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            judged = [p for p in (facts.params if facts else []) if p.ref_nonzero >= au.MIN_ENTRIES]
            worst = max((p.underflow for p in judged), default=0.0)
            lost = len(facts.lost()) if facts else 0
            skipped = f" ({facts.skipped})" if facts and facts.skipped else ""
            print(f"{name:28} {str(dtype)[6:]:9} {len(judged):6d} {worst:13.4f} {lost:12d}{skipped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
