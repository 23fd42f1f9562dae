"""The cold child's first stage, run by the server's own interpreter: confine, then exec the target's interpreter.

    python -I launch.py CONTROL_FD POLICY_JSON PYTHON CHILD

Every layer (`confine.py`) is in place before `exec`, so the program the target
names, whatever it is (a Python, a shell script, a binary), starts inside them.
When that program cannot be executed, the parent is told so on the result pipe
(a protocol StartFailed message) before this process exits.
"""

from __future__ import annotations

import os
import socket
import sys


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.path.insert(0, root)
    from gradprobe.sandbox import confine, view
    from gradprobe.sandbox.protocol import Control, Policy, StartFailed

    control = socket.socket(fileno=int(sys.argv[1]))
    policy = Policy.model_validate_json(sys.argv[2])
    python, child = sys.argv[3], sys.argv[4]
    if policy.enabled and os.geteuid() == 0:
        view.IDMAP_FD = view.make_idmap_userns()
    try:
        confine.confine(policy, control)
    except confine.Refused as exc:
        confine.send(control, Control(refused=str(exc)))
        os._exit(71)
    spec = policy.python_exec
    for tree in spec.trees if spec else []:  # bound already (or read through Landlock): the user's code holds none
        os.close(tree.fd)
    try:
        if spec is not None and spec.fd is not None:  # the very file the server resolved and opened, never a name again
            exe, argv = f"/proc/self/fd/{spec.fd}", [spec.argv0 or python, "-I", child]
            os.set_inheritable(spec.fd, _is_script(exe))  # a `#!` script's interpreter opens it by that name
            os.execve(exe, argv, dict(os.environ))
        os.execve(python, [python, "-I", child], dict(os.environ))
    except OSError as exc:
        os.write(2, f"gradprobe: cannot start {python}: {exc.strerror}\n".encode())
        _tell_parent(StartFailed(python=python, error=str(exc.strerror)).model_dump_json())
        os._exit(127)


def _tell_parent(line: str) -> None:
    try:
        os.write(int(os.environ.get("GRADPROBE_RESULT_FD", "-1")), (line + "\n").encode())
    except (OSError, ValueError):
        pass


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
