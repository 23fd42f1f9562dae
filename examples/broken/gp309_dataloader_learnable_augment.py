"""A learnable augmentation applied inside a Dataset that DataLoader workers run: its gradient never comes back."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

EXPECT = {"tool": "trace_grad_path", "codes": ["GP309"], "culprits": ["jitter.log_scale"], "line": 33}


class LearnableJitter(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return x * torch.exp(self.log_scale)


class Net(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.jitter = LearnableJitter(d)
        self.fc = nn.Linear(d, 1)

    def forward(self, x):
        return self.fc(x)


class JitteredSet(Dataset):
    def __init__(self, data, jitter):
        self.data, self.jitter = data, jitter

    def __getitem__(self, i):
        return self.jitter(self.data[i])

    def __len__(self):
        return len(self.data)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(8, 6)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, data, optimizer):
    loader = DataLoader(JitteredSet(data, model.jitter), batch_size=4, num_workers=2)
    for x in loader:
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        break
