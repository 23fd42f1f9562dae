"""The isolation layers as functions; `confine.py` applies them in order before any user code or
user-named program runs, and reports what each enforced (or why it could not):

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


def loopback_up() -> tuple[bool, str]:
    """`ip link set lo up` in the call's own network namespace (SIOCSIFFLAGS), so a script's
    torchrun-style rendezvous on 127.0.0.1 works; the namespace has no other interface."""
    import fcntl
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0)))[1]  # SIOCGIFFLAGS
            fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    except OSError as exc:
        return False, f"loopback not up ({exc})"
    return True, "private loopback up"


def landlock(read_only: list[str], read_write: list[str], files_rw: list[str], tcp: bool = False) -> tuple[bool, str]:
    nrs = _SYSCALLS.get(platform.machine())
    if nrs is None:
        return False, f"Landlock syscalls unknown on {platform.machine()}"
    create, add, restrict = nrs[:3]
    abi = _libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return False, f"Landlock unavailable ({_err()})"
    fs_all = FS_ALL_V1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | (FS_IOCTL_DEV if abi >= 5 else 0)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 and not tcp else 0
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
    extra = (", TCP denied" if net else ", TCP only on the private loopback" if tcp else "")
    extra += ", signals and abstract sockets scoped" if scoped else ""
    return True, f"Landlock ABI {abi}: read-only installation and project, read-write scratch{extra}"


# seccomp: deny what sandboxed model code never needs. x86_64 numbers; other architectures report MISSING.
_DENIED_X86_64 = {
    "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 298, "kexec_load": 246, "init_module": 175,
    "finit_module": 313, "open_by_handle_at": 304, "process_vm_readv": 310, "process_vm_writev": 311,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442,
}
_SOCKET_X86_64, _CLONE_X86_64, _CLONE3_X86_64 = 41, 56, 435
_AF_UNIX = 1
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_ANY = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET


def seccomp_program(inet: bool = False) -> list[bytes]:
    """Classic BPF: a syscall of any other architecture (the 32-bit `int 0x80` entry) or an x32 number kills the
    process; clone3 -> ENOSYS (libc falls back to clone, whose flags this filter can read); clone with a
    namespace flag and the syscalls above -> EPERM; sockets other than AF_UNIX -> EACCES; the rest allowed."""
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno, kill = 0x7FFF0000, 0x00050000, 0x80000000

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    prog = [op(ld_abs, 4), op(jeq, AUDIT_ARCH_X86_64, 1, 0), op(ret, kill),
            op(ld_abs, 0), op(jge, X32_SYSCALL_BIT, 0, 1), op(ret, kill)]
    for nr in _DENIED_X86_64.values():
        prog += [op(jeq, nr, 0, 1), op(ret, errno | 1)]  # EPERM
    prog += [op(jeq, _CLONE3_X86_64, 0, 1), op(ret, errno | 38)]  # ENOSYS
    prog += [op(jeq, _CLONE_X86_64, 0, 4), op(ld_abs, 16), op(jset, CLONE_NEW_ANY, 0, 1), op(ret, errno | 1), op(ret, allow)]
    prog += [op(jeq, _SOCKET_X86_64, 1, 0), op(ret, allow),
             op(ld_abs, 16), op(jeq, _AF_UNIX, 0, 1), op(ret, allow)]
    if inet:  # only inside a private network namespace whose one interface is the loopback
        prog += [op(jeq, 2, 0, 1), op(ret, allow),  # AF_INET (127.0.0.1 is all the namespace has)
                 op(jeq, 16, 0, 3), op(ld_abs, 32), op(jeq, 0, 0, 1), op(ret, allow)]  # AF_NETLINK, NETLINK_ROUTE (getaddrinfo)
    prog += [op(ret, errno | 13)]  # EACCES
    return prog


def seccomp_filter(inet: bool = False) -> tuple[bool, str]:
    """With `inet`, IPv4 sockets and address lookups are allowed (the private loopback); AF_INET6 stays denied."""
    if platform.machine() != "x86_64":
        return False, f"no syscall table for {platform.machine()}"
    prog = seccomp_program(inet)
    code = b"".join(prog)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or _libc.prctl(22, 2, fbuf, 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        return False, f"seccomp failed ({_err()})"
    return True, (f"seccomp: other architectures (int 0x80) and x32 killed; clone3 ENOSYS; namespace clone flags, "
                  f"non-Unix sockets{' (but IPv4 on the private loopback)' if inet else ''} and {len(_DENIED_X86_64)} "
                  "syscalls (ptrace, mount, unshare, bpf, io_uring, ...) denied")


def become_subreaper() -> None:
    """Orphans of our calls (a call's pid-1 whose keeper was killed first) are reparented to us, to be reaped."""
    _libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def die_with_parent() -> None:
    """If whatever started us dies (a killed Ray worker, a crashed server), so do we."""
    _libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL


def readable_roots(project_dir: str, package_root: str, trees: list[str]) -> list[str]:
    """Read-only roots for Landlock where no private view could be built (a non-root server)."""
    roots = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", package_root, project_dir, *trees]
    roots += [p for p in sys.path if p and os.path.isdir(p)]
    return [os.path.realpath(r) for r in roots if r and os.path.exists(r)]
