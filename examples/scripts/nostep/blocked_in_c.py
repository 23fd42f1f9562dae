"""Waits before its first step for a rendezvous master that never comes, inside a C++ call."""

from datetime import timedelta

import torch.distributed as dist
import torch.nn as nn

model = nn.Linear(4, 2)
store = dist.TCPStore("127.0.0.1", 29517, 2, False, timeout=timedelta(seconds=600))  # a worker rank waits for rank 0
