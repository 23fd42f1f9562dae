"""A small classifier whose residual blocks never learn: they sit in a plain Python list."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.fc(x))


class Classifier(nn.Module):
    def __init__(self, dim: int = 16, depth: int = 2, n_classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.blocks = [Block(dim) for _ in range(depth)]  # BUG: not registered
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build_model() -> Classifier:
    return Classifier()


def make_inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(4, 8), "y": torch.randint(0, 3, (4,))}


def loss_fn(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(logits, batch["y"])


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-3)
