"""Weights shipped to a worker process for the "heavy" projection; the gradient stays there."""
import torch
import torch.multiprocessing as mp
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP309"], "culprits": ["mix"], "line": 22}


def project(w, x):
    return (x @ w).tolist()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.mix = nn.Parameter(torch.eye(4))

    def forward(self, x):
        h = self.inp(x)
        with mp.get_context("fork").Pool(1) as pool:
            y = pool.apply(project, (self.mix, h.detach()))
        return h + torch.tensor(y)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
