"""The child's file-system view: what it binds, read-only, into a private root before any user code runs.

Used by confine.py (the call's pid 1, in its new mount namespace) and by the warm worker's spares. The
view holds the system directories, the target's interpreter prefixes (opened once by the server and
bound from those very descriptors), gradprobe's own package directory, the project and the target's
read_paths (each opened and checked against the server's roots, then bound as that directory), and a
private /tmp, /dev, /dev/shm, /proc and /sys. Nothing else of the host is in it: not the server's
working directory, not arbitrary sys.path entries.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys

from gradprobe.sandbox.protocol import Layer, Policy
from gradprobe.sandbox.roots import inside

_libc = ctypes.CDLL(None, use_errno=True)
NOBODY = 65534

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT, SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 155, 428, 429, 442
OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH, AT_FDCWD = 1, 0x8000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 1, 2, 4, 0x100000

ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "hosts", "host.conf",
             "localtime", "timezone", "os-release", "alternatives", "protocols", "services", "mime.types", "gai.conf")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")

IDMAP_FD: int | None = None  # a user namespace mapping uid/gid 0 -> 65534, made once per process that confines


class Refused(Exception):
    """The call must not start (a path outside the roots, a layer required but missing)."""


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def make_idmap_userns() -> int | None:
    """An fd of a user namespace whose uid/gid 0 is 65534 outside, for id-mapped mounts (None if impossible)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            ok = _libc.unshare(CLONE_NEWUSER) == 0
            os.write(w, b"1" if ok else b"0")
            os.close(w)
            signal.pause()
        finally:
            os._exit(0)
    os.close(w)
    try:
        if os.read(r, 1) != b"1":
            return None
        for name, text in (("uid_map", f"0 {NOBODY} 1"), ("setgroups", "deny"), ("gid_map", f"0 {NOBODY} 1")):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _clone_tree(fd: int) -> int:
    """A detached copy of the mount tree at the opened directory `fd` (made before unshare: a mount of another
    namespace cannot be cloned afterwards)."""
    flags = ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | AT_EMPTY_PATH | os.O_CLOEXEC)
    return _check(_libc.syscall(SYS_OPEN_TREE, fd, b"", flags), "open_tree")


def _bind(source: str | int, target: str, idmap: int | None, writable: bool = False, devices: bool = False) -> bool:
    """Bind `source` (a path, or a detached tree from _clone_tree) at `target`, read-only and nosuid, id-mapped
    when the file system allows; returns whether the id mapping took."""
    if isinstance(source, int):
        tree = source
    else:
        flags = ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
        tree = _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), flags), f"open_tree {source}")
    try:
        base = (0 if writable else MOUNT_ATTR_RDONLY) | MOUNT_ATTR_NOSUID | (0 if devices else MOUNT_ATTR_NODEV)
        mapped = False
        for attrs, fd in (((base | MOUNT_ATTR_IDMAP), idmap), (base, None)):
            if attrs & MOUNT_ATTR_IDMAP and fd is None:
                continue
            buf = ctypes.create_string_buffer(struct.pack("QQQQ", attrs, 0, 0, fd or 0))
            where = ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE)
            if _libc.syscall(SYS_MOUNT_SETATTR, tree, b"", where, buf, ctypes.c_size_t(32)) == 0:
                mapped = bool(attrs & MOUNT_ATTR_IDMAP)
                break
        else:
            _check(-1, f"mount_setattr {target}")
        move = ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)
        _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), move), f"move_mount {target}")
        return mapped
    finally:
        os.close(tree)


def _place(root: str, path: str, is_dir: bool) -> str:
    """Create `path` under `root` (parents 0755), following the symlinks of the real system."""
    target = root + path
    parent = os.path.dirname(path)
    if parent != path and not os.path.lexists(root + parent):
        _place(root, parent, True)
    if os.path.lexists(target):
        return target
    if os.path.islink(path) and path != "/":
        os.symlink(os.readlink(path), target)
        return target
    if is_dir:
        os.mkdir(target, 0o755)
    else:
        open(target, "w").close()
    return target


def python_trees(policy: Policy) -> list[str]:
    """Directories an interpreter needs: the server's installation prefixes, and those derived from the interpreter
    the target runs, which the server resolved once and opened (sandbox/interpreter.py; a program it did not
    recognise as an installation is one file)."""
    trees = policy.python_exec.trees if policy.python_exec else []
    return [sys.prefix, sys.base_prefix, sys.exec_prefix] + [tree.path for tree in trees]


def clone_python_trees(policy: Policy) -> dict[str, int]:
    """Detached copies of the interpreter's opened trees, made before unshare (as for the project): the exact
    directories the server opened are what gets bound, whatever their names point to by now."""
    trees = policy.python_exec.trees if policy.python_exec else []
    return {tree.path: _clone_tree(tree.fd) for tree in trees}


def _covered(path: str, dirs: list[str]) -> bool:
    """`path` is already in the view: one of the bound `dirs` or below one (`/` covers everything). Not the roots test
    (that is roots.inside, where `/` holds nothing)."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def privileged() -> bool:
    """CAP_SYS_ADMIN in effect: a root server that can build every layer itself (root without capabilities cannot)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 21 & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _readable_as_nobody(policy: Policy, fd: int, what: str) -> None:
    """On a root server with roots the call reads the project and read_paths as uid 65534, unmapped (finish_view):
    refuse, saying so, one that user could not read at all (a directory it cannot list, a file it cannot read)."""
    if policy.idmap_data or not policy.enabled or os.geteuid() != 0:
        return
    st = os.stat(f"/proc/self/fd/{fd}")
    need = 0o5 if os.path.isdir(f"/proc/self/fd/{fd}") else 0o4
    bits = st.st_mode >> 6 & 7 if st.st_uid == NOBODY else st.st_mode >> 3 & 7 if st.st_gid == NOBODY else st.st_mode & 7
    if bits & need != need:
        raise Refused(f"{what} is not readable by the call: with roots, a call on this server reads them as an "
                      f"unprivileged user (uid {NOBODY}), as any other user would (it is mode {st.st_mode & 0o7777:04o}, "
                      f"owner uid {st.st_uid}); make it readable to others (chmod o+rX) if the call is to read it")


def _holds_no_scratch(policy: Policy, real: str, what: str) -> None:
    """A directory bound into the view must not hold the calls' scratch directories (/tmp itself): the call's own
    scratch could not be made there, and other calls' would be in view."""
    if policy.scratch and inside(os.path.realpath(policy.scratch), [real]):
        raise Refused(f"{what} holds the scratch directories of gradprobe's calls ({os.path.dirname(policy.scratch)}/"
                      "gradprobe-call-*), which no call may see: put the project's files in a folder of their own "
                      f"(e.g. {os.path.join(real, 'myproject')}) and give that folder")


def open_project(policy: Policy, clone: bool = True) -> tuple[int | None, str]:
    """Open the project directory and check *that* directory against the allowed roots; with `clone`, a detached
    copy of its mount tree (what gets bound into the view)."""
    want = policy.project_dir or ""
    try:
        fd = os.open(want, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"project_dir {want!r} cannot be opened: {exc.strerror}") from None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        roots = policy.allowed_roots
        if roots and not inside(real, roots):
            raise Refused(f"project_dir {want!r} is outside the roots this server may read")
        _holds_no_scratch(policy, real, f"project_dir {want!r}")
        _readable_as_nobody(policy, fd, f"project_dir {want!r}")
        return (_clone_tree(fd) if clone else None), real
    finally:
        os.close(fd)


def open_read_paths(policy: Policy, clone: bool = True) -> list[tuple[str, int]]:
    """The target's read_paths, each opened and checked like the project (inside the allowed roots when the server
    has roots), as detached trees to bind read-only (root), or their real paths only (fd -1; Landlock reads them)."""
    out: list[tuple[str, int]] = []
    try:
        for want in policy.read_paths:
            try:
                fd = os.open(want, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise Refused(f"read_paths: {want!r} cannot be opened: {exc.strerror}") from None
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
                roots = policy.allowed_roots
                if (roots and not inside(real, roots)) or real == "/":
                    raise Refused(f"read_paths: {want!r} is outside the roots this server may read")
                _holds_no_scratch(policy, real, f"read_paths: {want!r}")
                _readable_as_nobody(policy, fd, f"read_paths: {want!r}")
                out.append((real, _clone_tree(fd) if clone else -1))
            finally:
                os.close(fd)
    except BaseException:
        for _, tree in out:
            if tree >= 0:
                os.close(tree)
        raise
    return out


def prepare_view(policy: Policy, newroot: str, opened: dict[str, int] | None = None) -> tuple[list[str], list[bool]]:
    """In a new mount namespace, the part of the view every call shares: a tmpfs root at `newroot` (an empty dir,
    shadowed in this namespace only) with private /tmp, /dev, /dev/shm, /proc, /sys and the read-only binds.
    Returns the read-only paths (for Landlock) and which binds took the id mapping."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", newroot, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    # /tmp first: binds below it (a project in /tmp) go on top of the private tmpfs, not under it
    _place(newroot, "/tmp", True)
    _mount("tmpfs", newroot + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={policy.scratch_bytes},mode=1777")
    ro: list[str] = []
    mapped: list[bool] = []
    opened = dict(opened or {})
    # gradprobe's own package directory only (never the folder holding it: a checkout's other files, a working dir)
    own = os.path.join(policy.package_root, "gradprobe")
    trees = list(SYSTEM_DIRS) + python_trees(policy) + [own] + list(policy.extra_ro)
    # id-mapped (root's files read as the call's own) only what needs it: the interpreter's installation prefixes
    # and gradprobe's own directory, which may sit in a private home; never the system directories or /etc
    needs_map = {os.path.abspath(p) for p in python_trees(policy) + [own] if p}
    seen: list[str] = []
    for path in sorted({os.path.abspath(p) for p in trees if p}, key=len):
        tree = opened.pop(path, None)
        if tree is None and (not os.path.lexists(path) or path == "/"):
            continue
        if tree is None and os.path.islink(path) and os.path.dirname(path) == "/":
            _place(newroot, path, True)  # /bin -> usr/bin on merged-/usr systems
            continue
        real = path if tree is not None else os.path.realpath(path)
        if _covered(real, seen) or _covered("/tmp", [real]):  # /tmp itself (or /) is the call's own tmpfs
            if tree is not None:
                os.close(tree)
            continue
        seen.append(real)
        _place(newroot, real, os.path.isdir(f"/proc/self/fd/{tree}") if tree is not None else os.path.isdir(real))
        mapped.append(_bind(tree if tree is not None else real, newroot + real, IDMAP_FD if path in needs_map else None))
        ro.append(real)
    for tree in opened.values():
        os.close(tree)
    _place(newroot, "/etc", True)
    for name in ETC_FILES:
        src = os.path.join("/etc", name)
        if os.path.exists(src):
            _bind(src, _place(newroot, src, os.path.isdir(src)), None)
    ro.append("/etc")
    _place(newroot, "/dev", True)
    _mount("tmpfs", newroot + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEV_NODES + tuple(policy.devices):
        src = os.path.join("/dev", name)
        if os.path.exists(src):
            _bind(src, _place(newroot, src, os.path.isdir(src)), None, writable=True, devices=True)
    links = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))
    for name, target in links:
        os.symlink(target, newroot + "/dev/" + name)
    _place(newroot, "/dev/shm", True)
    _mount("tmpfs", newroot + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={policy.shm_bytes},mode=1777")
    _place(newroot, "/proc", True)
    _mount("proc", newroot + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _place(newroot, "/sys", True)
    _bind("/sys", newroot + "/sys", None)
    ro += ["/proc", "/sys"]
    return ro, mapped


def finish_view(policy: Policy, newroot: str, project_tree: int | None, ro: list[str], mapped: list[bool],
                report: dict[str, Layer], reads: list[tuple[str, int]] | None = None) -> None:
    """The call's own part: the project and the read_paths (the trees opened and checked), the scratch dir, then
    pivot_root. They are id-mapped only on a server without roots (the caller is the server's own user, over stdio):
    with roots (HTTP, or --allow-root) a call reads them as the unprivileged user it runs as, so a file private to
    the server's user (root) in a root stays private."""
    scratch = policy.scratch
    idmap = IDMAP_FD if policy.idmap_data else None
    for real, tree in reads or []:
        if _covered(real, ro) or not real.startswith("/") or (tree < 0 and not os.path.exists(real)):
            if tree >= 0:
                os.close(tree)
            continue
        # a detached tree (root), else the path checked when it was opened (an unprivileged user namespace)
        is_dir = os.path.isdir(f"/proc/self/fd/{tree}") if tree >= 0 else os.path.isdir(real)
        mapped.append(_bind(tree if tree >= 0 else real, _place(newroot, real, is_dir), idmap))  # closes a tree
        ro.append(real)
    if project_tree is not None:
        proj = policy.project_dir_real or ""
        if not _covered(proj, ro):
            mapped.append(_bind(project_tree, _place(newroot, proj, True), idmap))  # closes project_tree
            ro.append(proj)
        else:
            os.close(project_tree)
    if not _covered(policy.package_root, ro):  # the sys.path entry holding gradprobe: in the view it holds only that
        ro.append(policy.package_root)  # (and the project when it lives there), so Python may list it
    if not scratch.startswith("/tmp/"):
        raise Refused("the scratch dir must live under /tmp")
    os.makedirs(newroot + scratch, 0o700)
    try:
        os.chown(newroot + scratch, NOBODY, NOBODY)
    except OSError:
        pass  # in an unprivileged user namespace 65534 is not mapped: the call keeps the server's uid
    os.mkdir(newroot + "/.old")
    os.chdir(newroot)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_BIND | 32 | MS_RDONLY | MS_NOSUID | MS_NODEV)  # MS_REMOUNT: the view's own root read-only
    os.chdir(scratch)
    report["view"] = Layer.of(True, f"pivot_root into a minimal tree: {len(ro)} read-only binds ({sum(mapped)} id-mapped), "
                              f"fresh /proc, private tmpfs /tmp ({policy.scratch_bytes >> 20} MiB, holds scratch) and "
                              f"/dev/shm ({policy.shm_bytes >> 20} MiB)")
