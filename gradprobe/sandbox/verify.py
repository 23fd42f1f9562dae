"""What the server sees of a confined call from outside (/proc), before any user code runs in it.

The confining code says which layers it applied (protocol.Control); the parent does not take its word:
it reads the process's identity, seccomp state, namespaces and cgroup itself, and with
`--require-isolation` refuses to send "go" when a layer is not verified.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gradprobe.sandbox.protocol import Layer, shown


def _ns(pid: int | str, name: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{name}")
    except OSError:
        return None


@dataclass
class Verified:
    """What the server saw of the confined process from outside: its layers, or why it could not look."""

    layers: dict[str, Layer] = field(default_factory=dict)
    error: str | None = None

    def bad(self) -> list[str]:
        return [k for k, layer in self.layers.items() if layer.missing] + (["error"] if self.error is not None else [])

    def shown(self) -> dict[str, str]:
        return {"error": self.error} if self.error is not None else shown(self.layers)


def verify(pid: int, claimed: dict[str, Layer], cgroup_name: str | None) -> Verified:
    """What the server sees of the confined process from outside, before any user code runs in it."""
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
        cg = open(f"/proc/{pid}/cgroup").read()
    except OSError as exc:
        return Verified(error=f"could not inspect the child ({exc.strerror})")
    status: dict[str, list[str]] = {k: v.split() for k, _, v in (line.partition(":") for line in lines)}
    uid = status.get("Uid", ["?"])[0]
    capeff = int(status.get("CapEff", ["1"])[0], 16)
    seen: dict[str, Layer] = {}
    seen["identity"] = Layer.of(not (uid == "0" and "identity" in claimed),
                                f"uid {uid}, effective capabilities {'none' if capeff == 0 else hex(capeff)}, "
                                f"no_new_privs {status.get('NoNewPrivs', ['?'])[0]}")
    seccomp = status.get("Seccomp", ["0"])[0] == "2"
    seen["syscalls"] = Layer.of(seccomp, "seccomp filter active" if seccomp else "no seccomp filter")
    filesystem = claimed.get("filesystem")
    if filesystem is not None and filesystem.enforced and hasattr(os, "pidfd_open"):
        seen["filesystem"] = Layer.of(True, "Landlock (as claimed; not visible from outside)")
    apart = [n for n in ("mnt", "pid", "net", "ipc", "uts") if _ns(pid, n) is not None and _ns(pid, n) != _ns("self", n)]
    seen["namespaces"] = Layer.of(bool(apart), f"own {', '.join(apart)}" if apart else "shares the server's namespaces")
    in_group = bool(cgroup_name and cgroup_name in cg)
    seen["cgroup"] = Layer.of(in_group, f"in the call's cgroup {cgroup_name}" if in_group else "not in the call's cgroup")
    return Verified(layers=seen)
