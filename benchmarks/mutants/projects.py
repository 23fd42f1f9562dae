"""Real model sources materialised into a temporary project.

A source is a driver (committed here, under sources/) plus, for library models, the modeling files of
the INSTALLED transformers / diffusers copied at run time into the project. Their relative imports are
rewritten to absolute ones on the same line (`from ...activations import X` ->
`from transformers.activations import X`), or to the project-local copy when that module was copied
too, so every line number of the copy is the installed file's line number and the copy is imported
under a plain top-level name by the driver. Nothing of the library code is committed.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "sources"

_REL = re.compile(r"^(\s*)from (\.+)([\w.]*) import")


@dataclass(frozen=True)
class Source:
    name: str
    driver: str  # file under sources/, becomes case.py
    copies: tuple[tuple[str, str], ...] = ()  # (installed dotted module, local file name)
    needs: tuple[str, ...] = ()  # top-level packages that must be importable
    model_files: tuple[str, ...] = field(default=())  # files where model-level operators apply

    def mutable_model_files(self) -> tuple[str, ...]:
        return self.model_files or (tuple(local for _, local in self.copies) or ("case.py",))


def _hf(name: str, extra: tuple[tuple[str, str], ...] = ()) -> Source:
    return Source(name, f"hf_{name}.py", ((f"transformers.models.{name}.modeling_{name}", f"modeling_{name}.py"),) + extra,
                  needs=("transformers",))


ALL_SOURCES: tuple[Source, ...] = (
    _hf("gpt2"), _hf("llama"), _hf("bert"), _hf("t5"), _hf("vit"), _hf("convnext"), _hf("resnet"),
    Source("diffusers_unet", "diffusers_unet.py",
           (("diffusers.models.unets.unet_2d_blocks", "unet_2d_blocks.py"), ("diffusers.models.resnet", "resnet.py")),
           needs=("diffusers",)),
    Source("nanogpt", "nanogpt.py"),
    Source("vae", "vae.py"),
    Source("vq", "vq.py"),
    Source("custom_fn", "custom_fn.py"),
    Source("soft_prompt", "soft_prompt.py", needs=("transformers",)),
    Source("ptuning", "ptuning.py", needs=("transformers",)),
    Source("peft_lora", "peft_lora.py", needs=("transformers", "peft")),
)


def unavailable(src: Source) -> str | None:
    """Why this source cannot run here (a package missing), or None."""
    for pkg in src.needs:
        if importlib.util.find_spec(pkg) is None:
            return f"{pkg} is not installed"
    return None


def rewrite_relative_imports(text: str, dotted: str, local: dict[str, str]) -> str:
    """Make the relative imports of module `dotted` absolute, line for line (line numbers unchanged)."""
    package = dotted.rsplit(".", 1)[0].split(".")
    out = []
    for line in text.splitlines(keepends=True):
        m = _REL.match(line)
        if m:
            indent, dots, rest = m.group(1), m.group(2), m.group(3)
            base = package[: len(package) - (len(dots) - 1)]
            target = ".".join(base + ([rest] if rest else []))
            target = local.get(target, target)
            line = f"{indent}from {target} import" + line[m.end():]
        out.append(line)
    return "".join(out)


def materialise(src: Source, project: Path) -> dict[str, str]:
    """Write the source's files into `project`; return {file name: text} of what was written."""
    project.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {"case.py": (SOURCES / src.driver).read_text()}
    local = {dotted: Path(name).stem for dotted, name in src.copies}
    for dotted, name in src.copies:
        spec = importlib.util.find_spec(dotted)
        assert spec is not None and spec.origin, dotted
        files[name] = rewrite_relative_imports(Path(spec.origin).read_text(), dotted, local)
    for name, text in files.items():
        (project / name).write_text(text)
    return files
