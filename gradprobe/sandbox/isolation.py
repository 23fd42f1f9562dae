"""Isolation layers the child applies to itself before it imports any user code.

Each layer is tried, and what it enforced (or why it could not) is reported with
every result, so a missing layer is visible rather than silently absent:

- cgroups: join the per-call cgroups the parent made (memory, pids; cgroup v2 for
  cgroup.kill of the whole tree, setsid daemons included);
- network: a new network namespace (no interface but a down loopback);
- privileges: no_new_privs, every capability dropped (bounding set too), so the
  child cannot read a non-dumpable process's /proc files or remount anything;
- filesystem: Landlock (read-only: the Python installation, gradprobe, the project;
  read-write: the call's scratch dir and /dev/shm), plus TCP bind/connect denial and
  signal/abstract-socket scoping where the kernel's Landlock ABI has them;
- syscalls: a seccomp filter denying non-Unix sockets, ptrace, mount, unshare, bpf, keyctl, ...
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
import os
import platform
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_SYSCALLS = {  # landlock_create_ruleset, landlock_add_rule, landlock_restrict_self, capset
    "x86_64": (444, 445, 446, 126),
    "aarch64": (444, 445, 446, 91),
}
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24

# Landlock access rights
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ALL_V1 = (1 << 13) - 1
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1


def _err() -> str:
    return os.strerror(ctypes.get_errno())


def join_cgroups(procs_files: list[str]) -> str | None:
    for path in procs_files:
        try:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            return f"could not join {path}: {exc.strerror}"
    return None


def new_network_namespace() -> tuple[bool, str]:
    if _libc.unshare(CLONE_NEWNET) == 0:
        return True, "network namespace"
    first = _err()
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        try:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        except OSError:
            pass
        return True, "user + network namespace"
    return False, f"unshare failed ({first}; with a user namespace: {_err()})"


def drop_privileges() -> tuple[bool, str]:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False, f"no_new_privs failed ({_err()})"
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last cap: fine
    header = struct.pack("II", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # effective, permitted, inheritable = 0 for both 32-bit words
    hdr, dat = ctypes.create_string_buffer(header), ctypes.create_string_buffer(data)
    nr = _SYSCALLS.get(platform.machine(), (None,) * 4)[3]
    rc = _libc.syscall(nr, hdr, dat) if nr else -1
    if rc != 0:
        return False, f"no_new_privs set; capset failed ({_err()})"
    return True, "no_new_privs, all capabilities dropped"


def landlock(read_only: list[str], read_write: list[str], files_rw: list[str]) -> tuple[bool, str]:
    nrs = _SYSCALLS.get(platform.machine())
    if nrs is None:
        return False, f"Landlock syscalls unknown on {platform.machine()}"
    create, add, restrict = nrs[:3]
    abi = _libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return False, f"Landlock unavailable ({_err()})"
    fs_all = FS_ALL_V1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | (FS_IOCTL_DEV if abi >= 5 else 0)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", fs_all, net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", fs_all, net)
    else:
        attr = struct.pack("Q", fs_all)
    buf = ctypes.create_string_buffer(attr)
    ruleset = _libc.syscall(create, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return False, f"Landlock ruleset failed ({_err()})"
    ro = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (FS_TRUNCATE if abi >= 3 else 0) | (FS_IOCTL_DEV if abi >= 5 else 0)
    try:
        for paths, rights in ((read_only, ro), (read_write, fs_all), (files_rw, file_rights)):
            for path in dict.fromkeys(paths):
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    is_dir = os.path.isdir(path)
                    beneath = struct.pack("=Qi", rights if is_dir else rights & file_rights, fd)
                    b = ctypes.create_string_buffer(beneath)
                    if _libc.syscall(add, ruleset, ctypes.c_int(1), b, ctypes.c_uint32(0)) != 0:
                        return False, f"Landlock rule for {path} failed ({_err()})"
                finally:
                    os.close(fd)
        if _libc.syscall(restrict, ruleset, ctypes.c_uint32(0)) != 0:
            return False, f"Landlock restrict_self failed ({_err()})"
    finally:
        os.close(ruleset)
    extra = (", TCP denied" if net else "") + (", signals and abstract sockets scoped" if scoped else "")
    return True, f"Landlock ABI {abi}: read-only installation and project, read-write scratch{extra}"


# seccomp: deny what sandboxed model code never needs. x86_64 numbers; other architectures report MISSING.
_DENIED_X86_64 = {
    "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249, "userfaultfd": 323, "io_uring_setup": 425,
    "perf_event_open": 298, "kexec_load": 246, "init_module": 175, "finit_module": 313,
}
_SOCKET_X86_64 = 41
_AF_UNIX = 1


def seccomp_filter() -> tuple[bool, str]:
    """A classic-BPF filter: non-AF_UNIX sockets -> EACCES, the syscalls above -> EPERM, the rest allowed."""
    if platform.machine() != "x86_64":
        return False, f"no syscall table for {platform.machine()}"
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    allow, errno = 0x7FFF0000, 0x00050000

    def op(code, k, jt=0, jf=0):
        return struct.pack("HBBI", code, jt, jf, k)

    prog = [op(ld_abs, 4), op(jeq, 0xC000003E, 1, 0), op(ret, allow), op(ld_abs, 0)]
    for nr in _DENIED_X86_64.values():
        prog += [op(jeq, nr, 0, 1), op(ret, errno | 1)]  # EPERM
    prog += [op(jeq, _SOCKET_X86_64, 1, 0), op(ret, allow),
             op(ld_abs, 16), op(jeq, _AF_UNIX, 0, 1), op(ret, allow), op(ret, errno | 13)]  # EACCES
    code = b"".join(prog)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    if _libc.prctl(22, 2, fbuf, 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return False, f"seccomp failed ({_err()})"
    return True, f"seccomp: non-Unix sockets and {len(_DENIED_X86_64)} syscalls (ptrace, mount, unshare, bpf, ...) denied"


def readable_roots(project_dir: str, package_root: str) -> list[str]:
    roots = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", "/opt",
             sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             package_root, project_dir]
    roots += [p for p in sys.path if p and os.path.isdir(p)]
    return [os.path.realpath(r) for r in roots if r and os.path.exists(r)]


@dataclass(frozen=True)
class Layer:
    """One isolation layer: whether it is enforced, and what the user reads about it (facts.isolation)."""

    enforced: bool
    text: str

    @classmethod
    def of(cls, ok: bool, how: str) -> Layer:
        return cls(ok, how if ok else f"MISSING: {how}")


def apply(policy: dict) -> dict[str, Layer]:
    """Apply the layers in order (cgroups, network, privileges, filesystem, syscalls); report what enforced each."""
    report: dict[str, Layer] = {}
    if policy.get("cgroups"):
        err = join_cgroups(policy["cgroups"])
        report["cgroup"] = Layer.of(not err, err or "joined the call's cgroups")
    if policy.get("network", True):
        ok, how = new_network_namespace()
        report["network"] = Layer.of(ok, how)
    ok, how = drop_privileges() if policy.get("privileges", True) else (False, "not asked")
    report["privileges"] = Layer.of(ok, how)
    if policy.get("filesystem", True):
        ok, how = landlock(
            readable_roots(policy["project_dir"], policy["package_root"]),
            [policy["scratch"], "/dev/shm"],
            ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full", "/dev/tty"],
        )
        report["filesystem"] = Layer.of(ok, how)
    if policy.get("syscalls", True):
        ok, how = seccomp_filter()
        report["syscalls"] = Layer.of(ok, how)
    return report
