"""The cold child's first stage, run by the server's own interpreter: confine, then exec the target's interpreter.

    python -I launch.py CONTROL_FD POLICY_JSON PYTHON CHILD

Every layer (`confine.py`) is in place before `exec`, so the program the target
names, whatever it is (a Python, a shell script, a binary), starts inside them.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.path.insert(0, root)
    from gradprobe.sandbox import confine

    control = socket.socket(fileno=int(sys.argv[1]))
    policy = json.loads(sys.argv[2])
    python, child = sys.argv[3], sys.argv[4]
    if policy.get("enabled") and os.geteuid() == 0:
        confine.IDMAP_FD = confine.make_idmap_userns()
    try:
        confine.confine(policy, control)
    except confine.Refused as exc:
        confine.send(control, {"refused": str(exc)})
        os._exit(71)
    spec = policy.get("python_exec") or {}
    for _real, fd in spec.get("trees") or []:  # bound already (or read through Landlock): the user's code holds none
        os.close(int(fd))
    try:
        if spec.get("fd") is not None:  # exactly the file the server resolved and opened, never a name looked up again
            exe, argv = f"/proc/self/fd/{int(spec['fd'])}", [str(spec.get("argv0") or python), "-I", child]
            os.set_inheritable(int(spec["fd"]), _is_script(exe))  # a `#!` script's interpreter opens it by that name
            os.execve(exe, argv, dict(os.environ))
        os.execve(python, [python, "-I", child], dict(os.environ))
    except OSError as exc:
        os.write(2, f"gradprobe: cannot start {python}: {exc.strerror}\n".encode())
        os._exit(127)


def _is_script(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        return os.read(fd, 2) == b"#!"
    except OSError:
        return True
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
