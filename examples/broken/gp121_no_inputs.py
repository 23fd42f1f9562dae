"""A model file with no make_inputs and no train_step: `diagnose` can inspect the registration, but the step checks (the
trace, the optimizer step, gradcheck, ...) need a batch. The report is "partly checked", names the step checks as not
run and why (GP121, a warning), and never reads as OK; its twin healthy_gp121_inputs_given.py gives the batch and is
verified. (The issue this follows: gradprobe printed "OK / No error found" over "no inputs and no train_step: the
step-based checks were skipped".)"""
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP121"], "culprits": [], "severity": "warning"}


def build_model():
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 2))


def make_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3)
