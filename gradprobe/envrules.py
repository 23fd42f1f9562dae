"""Which environment variables a target's `env` may set (standard library only: the server and the child both ask).

A target's `env` is applied inside the sandbox, by gradprobe's child once every layer is in place, never to a process
that runs before confinement. Some names are refused outright all the same: the ones the C library or Python read
while a process starts (to load code, locale or character-set modules, or to change the allocator or the resolver;
glibc drops most of them for setuid programs, its "unsecure" list), the ones gradprobe's sandbox sets itself, and
the `GRADPROBE_` namespace.
"""

from __future__ import annotations

# glibc's UNSECURE_ENVVARS (sysdeps/generic/unsecvars.h) and the locale/allocator variables it reads at start-up
LOADER = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "NIS_PATH", "NLSPATH",
    "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR", "LANG", "LANGUAGE", "LINGUAS", "CHARSET", "MALLOC_TRACE",
})
LOADER_PREFIXES = ("LD_", "LC_", "MALLOC_", "GLIBC_", "PYTHON")
SANDBOX = frozenset({"HOME", "TMPDIR", "TMP", "TEMP", "PATH"})


def refused(name: str) -> str | None:
    """Why a target may not set `name` (a sentence naming it), or None when it may."""
    if name in SANDBOX or name.startswith("GRADPROBE_"):
        return f"env: {name} is set by gradprobe's sandbox and cannot be given"
    if name in LOADER or name.startswith(LOADER_PREFIXES):
        return (f"env: {name} changes how the C library or Python starts (what it loads: modules, locales, character "
                "sets, the allocator, the resolver) and cannot be given; gradprobe sets the locale itself")
    return None
