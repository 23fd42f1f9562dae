"""Advantage actor-critic with separate actor and critic networks, one loss: the actor's term weights log-probabilities
by the detached advantage (the critic's value used as a constant), the critic's term trains the critic. The actor term
reaches the critic only through that stop-gradient: GP317 (info, a target or a weight), never a warning or an error.

Public reference: https://github.com/MishaLaskin/rad/issues/4 (the actor's gradient is detached from the part the
critic trains: "you still backprop from the critic ... the only detached parts are gradients from the actor").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP317"], "culprits": ["critic.0.weight"], "healthy": True,
          "severity": "info", "absent": ["GP315", "GP316"]}


class ActorCritic(nn.Module):
    def __init__(self, obs=6, act=3, h=16):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(obs, h), nn.Tanh(), nn.Linear(h, act))
        self.critic = nn.Sequential(nn.Linear(obs, h), nn.Tanh(), nn.Linear(h, 1))


def build_model():
    return ActorCritic()


def make_inputs():
    return {"obs": torch.randn(10, 6), "actions": torch.randint(0, 3, (10,)), "returns": torch.randn(10)}


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-4)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    logp = torch.log_softmax(model.actor(batch["obs"]), -1).gather(1, batch["actions"][:, None]).squeeze(1)
    values = model.critic(batch["obs"]).squeeze(1)
    advantage = batch["returns"] - values
    actor_loss = -(logp * advantage.detach()).mean()
    critic_loss = F.mse_loss(values, batch["returns"])
    loss = actor_loss + 0.5 * critic_loss
    loss.backward()
    optimizer.step()
