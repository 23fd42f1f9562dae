"""GP123: a module on the path to the loss that is frozen and still holds the values its initialiser wrote.

Measured, never read from names:
- *frozen*: every parameter of the module has requires_grad False when the step runs;
- *at its initialisation*: the last write the build made to each of its parameters was an initialiser's (a random
  fill such as `normal_` or `uniform_`, at least one; constant fills for the rest), never a load (initwrites.py: a
  `copy_` of `load_state_dict`, a Parameter set in place by a loader);
- *on the path to the loss*: the graph of a loss that backward() ran on reaches the module's output (a forward hook
  notes its output's autograd node; an output with no graph counts through the module that consumed it);
- *last*: on some path from the loss to its output, no other module that holds parameters (the output layer).

The unit is the outermost module whose parameters are all frozen at their initialisation. Design and accident are
told apart by two more measured facts: whether the rest of the model was loaded during the build (some frozen
parameter's last write was a load, or a trainable one's was a loader's; adapters' own copies are no load), and whether
the module is last. A random frozen head of a loaded model (a classification head created by the model class while an
adapter froze everything else, peft's LoRA without `modules_to_save`) is an error at the line that froze it, with the
adapter config's key when there is one; a random frozen module inside a loaded model is a warning (a load that missed
it, or a random projection by design); in a model where nothing was loaded (built from scratch, or a small stand-in for
a pretrained one frozen around a trained prompt or adapter) it is info, said with what was measured: a frozen random
output layer, or a frozen random projection that trainable modules read (random features, a fixed hash embedding).

Written from peft's docs on `modules_to_save` and the issues about new heads left frozen or random:
https://github.com/huggingface/peft/issues/577 (`modules_to_save=lora_target_modules.append("score")` is None: the
head keeps its random initialisation), https://github.com/huggingface/peft/issues/1070 (modules_to_save and
AutoModelForSequenceClassification), https://github.com/4AI/LS-LLaMA/issues/3 ("LoRA seems not training the linear
head for classification").
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.step import tensors_in
from gradprobe.findings import Finding, Rule, Situation
from gradprobe.userframes import location
from gradprobe.checks.core.rule_text import and_more

Loc = dict[str, Any]
MAX_NODES = 50000

GP123: Rule[FrozenInitFacts] = Rule(
    code="GP123", name="frozen-at-initialisation", severity="error", rank=10,
    summary="A module on the path to the loss is frozen and still holds the values its initialiser wrote (never loaded, "
            "never trained).",
    why="A head created by the model class (a classifier, a reward head) is random until it is trained. When an adapter "
        "config or a freezing loop freezes it with the pretrained body, every prediction goes through a random map that "
        "never learns, while the loss still moves (the adapters fit around it).",
    example="model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)\n"
            "model = get_peft_model(model, LoraConfig(target_modules=['query', 'value']))  # no modules_to_save",
    message="`{module}` ({count} tensor(s): {names}) is frozen and still holds the values its initialiser wrote during the "
            "build (`{init_op}`{init_at}; no load wrote it), while {loaded} other tensors of the model were loaded. The "
            "loss's graph reaches its output with no module after it that holds parameters, so the model's outputs go "
            "through a random map that never learns. It was frozen at {frozen_at} (`{frozen_code}`), which froze {froze} "
            "tensors.",
    fix="Unfreeze it after line {line} of {file} ({attr}.requires_grad_(True)) and give its parameters to the optimizer, "
        "or load trained values for it before freezing.",
    situations={
        "adapter": Situation(
            when="an adapter config (peft) froze it: the config declares neither the head in modules_to_save nor a "
                 "task type that keeps it trainable",
            message="`{module}` ({count} tensor(s): {names}) is frozen and still holds the values its initialiser wrote "
                    "during the build (`{init_op}`{init_at}; no load wrote it), while {loaded} other tensors of the model "
                    "were loaded. The loss's graph reaches its output with no module after it that holds parameters, so "
                    "the model's outputs go through a random map that never learns. It was frozen by the adapter at {frozen_at} "
                    "(`{frozen_code}`), whose config{config_at} declares modules_to_save={modules_to_save} and "
                    "task_type={task_type}.",
            fix="Declare the head trainable in the adapter config{config_at}: modules_to_save=[\"{leaf}\"] (or the task "
                "type that keeps a head of this kind trainable, e.g. task_type=\"SEQ_CLS\" for a sequence classifier); "
                "the adapter then leaves `{module}` trainable and saves it with the adapter weights."),
        "inner": Situation(
            when="the rest of the model was loaded and other modules that hold parameters lie between its output and the "
                 "loss",
            severity="warning",
            message="`{module}` ({count} tensor(s): {names}) is frozen and still holds the values its initialiser wrote "
                    "during the build (`{init_op}`{init_at}; no load wrote it), while {loaded} other tensors of the model "
                    "were loaded. The loss's graph reaches its output, and the modules after it read a random "
                    "map: a load that missed it, or a random projection by design. Frozen at {frozen_at} "
                    "(`{frozen_code}`).",
            fix="If `{module}` should come from the checkpoint, make the load include it (load_state_dict(..., "
                "strict=True) raises on missing keys); if it should learn, unfreeze it after line {line} of {file}; "
                "nothing to change for a random projection by design."),
        "scratch_head": Situation(
            when="nothing in the model was loaded during the build (a model built from scratch, or a small stand-in for "
                 "a pretrained one), and no other module that holds parameters lies between its output and the loss",
            severity="info",
            message="`{module}` ({count} tensor(s): {names}) is frozen at the values its initialiser wrote (`{init_op}`"
                    "{init_at}), and the loss's graph reaches its output with no module after it that holds parameters: "
                    "the outputs go through a fixed random map. Nothing in the model was loaded during the build. Frozen at "
                    "{frozen_at} (`{frozen_code}`).",
            fix="If the output layer should learn, unfreeze it at line {line} of {file} ({attr}.requires_grad_(True)) "
                "and give it to the optimizer; nothing to change if a fixed random output layer is the design."),
        "random_features": Situation(
            when="nothing in the model was loaded during the build, and trainable modules after it learn from its "
                 "output (random features, a fixed hash embedding, or a small stand-in for a pretrained part)",
            severity="info",
            message="`{module}` ({count} tensor(s): {names}) is frozen at the values its initialiser wrote (`{init_op}`"
                    "{init_at}), nothing in the model was loaded during the build, and trainable modules after it learn "
                    "from its output: a fixed random projection (random features, a fixed hash), or a stand-in for a "
                    "pretrained part that a real run would load. Frozen at {frozen_at} (`{frozen_code}`).",
            fix="Nothing to fix if the random projection is meant (or a real run loads it); unfreeze it at line {line} of "
                "{file} if it should learn."),
    },
)


@dataclass
class Unit:
    """The outermost module whose parameters are all frozen at their initialisation."""

    path: str
    module: nn.Module
    names: list[str]
    params: list[nn.Parameter]
    init_op: str
    init_at: Loc | None
    frozen_at: Loc | None = None
    froze: int = 0  # tensors of the model the freezing line froze
    on_path: bool = False
    last: bool = False


@dataclass
class FrozenInitFacts:
    units: list[Unit] = field(default_factory=list)
    loaded: int = 0  # tensors of the model whose last write in the build was a load (_loaded)
    adapter: dict[str, Any] | None = None  # the adapter config's declared targets, where an adapter froze the model
    adapter_units: set[int] = field(default_factory=set)  # id(module) of the units library code froze


def _init_write(record: Any, p: torch.Tensor) -> Any:
    writes = getattr(record, "writes", None)
    last = writes.last(p) if writes is not None else None
    return last if last is not None and last.kind in ("random", "constant") else None


def unit_ids(model: nn.Module, record: Any) -> set[int]:
    """Ids of the parameters of the frozen-at-init units (modules whose parameters all are, one at least random)."""
    return {id(p) for u in measure_units(model, record, lines=False).units for p in u.params}


def at_init_ids(model: nn.Module, record: Any) -> set[int]:
    """Ids of the frozen parameters whose last write in the build was an initialiser's."""
    if getattr(record, "writes", None) is None or not record.writes.entries:
        return set()
    return {id(p) for p in model.parameters() if not p.requires_grad and _init_write(record, p) is not None}


def _all_at_init(module: nn.Module, at_init: set[int], record: Any) -> Any:
    """The first random initialiser write among the module's parameters when all of them are frozen at init."""
    params = list(module.parameters())
    if not params or not all(id(p) in at_init for p in params):
        return None
    return next((w for p in params if (w := _init_write(record, p)) is not None and w.kind == "random"), None)


_LOADER_OPS = ("load_state_dict", "replaced", "set_")  # a state dict's copy, a Parameter over a meta placeholder


def _loaded(w: Any, p: nn.Parameter) -> bool:
    """A tensor the build loaded: by a loader's own write (a state dict's value, a Parameter over a meta placeholder),
    or, for a frozen one, by any copy. A new Parameter set over a real one outside a loader is an adapter initialising
    itself from tensors the build drew (peft's HRA: nn.Parameter(repeat_interleave(...)); CPT: a prompt from the word
    embeddings), as is a copy into a trainable tensor (DEFT's copy_): no load of the model."""
    return w is not None and w.kind == "load" and (w.op in _LOADER_OPS or (w.op != "assigned" and not p.requires_grad))


def measure_units(model: nn.Module, record: Any, lines: bool = True) -> FrozenInitFacts:
    """The frozen-at-init units (outermost), how many tensors were loaded, the freezing lines."""
    facts = FrozenInitFacts()
    at_init = at_init_ids(model, record)
    if not at_init:
        return facts
    taken: list[str] = []
    for path, module in model.named_modules():
        if not path or any(path.startswith(t + ".") for t in taken):
            continue
        first = _all_at_init(module, at_init, record)
        if first is None:
            continue
        taken.append(path)
        named = [(f"{path}.{n}", p) for n, p in module.named_parameters()]
        facts.units.append(Unit(path, module, [n for n, _ in named], [p for _, p in named], first.op, first.location))
    inside = {id(p) for u in facts.units for p in u.params}
    writes = record.writes
    facts.loaded = sum(1 for p in model.parameters() if id(p) not in inside and _loaded(writes.last(p), p))
    if lines:
        _freezing_lines(model, record, facts)
    return facts


def measure(model: nn.Module, record: Any) -> tuple[FrozenInitFacts, PathWatch]:
    """The units before the step, and the watch that finds, during it, which of them the loss's graph reaches. An
    adapter config is read only where library code froze a unit (the adapter's call), never the user's own freeze."""
    facts = measure_units(model, record)
    by_library: set[int] = getattr(record, "frozen_by_library", set())
    frozen_by = next((u for u in facts.units if any(id(p) in by_library for p in u.params)), None)
    if frozen_by is not None:
        facts.adapter = adapter_config(model, record, frozen_by.frozen_at)
        facts.adapter_units = {id(u.module) for u in facts.units if any(id(p) in by_library for p in u.params)}
    return facts, PathWatch(model, facts)


def _freezing_lines(model: nn.Module, record: Any, facts: FrozenInitFacts) -> None:
    sites = getattr(record, "frozen_sites", None) or {}
    counts: dict[tuple[str, int], int] = {}
    for p in model.parameters():
        hit = sites.get(id(p))
        if hit is not None and not p.requires_grad:
            key = (hit[1]["file"], hit[1]["line"])
            counts[key] = counts.get(key, 0) + 1
    for u in facts.units:
        hit = next((sites[id(p)] for p in u.params if id(p) in sites), None)
        if hit is not None:
            u.frozen_at = hit[1]
            u.froze = counts.get((hit[1]["file"], hit[1]["line"]), len(u.params))
        else:  # created frozen (nn.Parameter(..., requires_grad=False)): where it was set on its module
            owner, _, attr = u.names[0][len(u.path) + 1:].rpartition(".")
            mod = u.module.get_submodule(owner) if owner else u.module
            u.frozen_at = record.site_of(mod, attr) if hasattr(record, "site_of") else None
            u.froze = len(u.params)


class PathWatch(TorchFunctionMode):
    """During the step: the autograd nodes of the units' outputs; for an output with no graph (a frozen module fed only
    frozen values), the nodes of the first ops that combine a value made from it with the graph; and the nodes of
    every other module that holds parameters (what lies between a unit and the loss: a unit is last when the loss's
    graph reaches it on a path through no other such module)."""

    def __init__(self, model: nn.Module, facts: FrozenInitFacts) -> None:
        super().__init__()
        self.facts = facts
        self.unit_of: dict[int, int] = {id(u.module): i for i, u in enumerate(facts.units)}
        self.inside = {id(m) for u in facts.units for m in u.module.modules()}
        names = {id(m): n for n, m in model.named_modules()}
        units = [u.path for u in facts.units]
        self.skip = {id(m) for m in model.modules() if any(
            u == names[id(m)] or u.startswith(names[id(m)] + ".") or not names[id(m)] for u in units)}
        self.parametrised = {id(m) for m in model.modules() if next(m.parameters(recurse=False), None) is not None}
        self.unit_nodes: dict[int, set[tuple[int, bool]]] = {}  # id(node) -> (unit index, through a value made from it)
        self.other_nodes: set[int] = set()
        self.no_graph: dict[int, tuple[torch.Tensor, frozenset[int]]] = {}  # a value with no graph -> units behind it
        self._keep: list[Any] = []
        self._handle: Any = None

    def _floats(self, out: Any) -> list[torch.Tensor]:
        if isinstance(out, torch.Tensor):
            values: Any = [out]
        else:
            values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
        return [o for o in values if isinstance(o, torch.Tensor) and o.is_floating_point()]

    def _carry(self, outs: list[torch.Tensor], units: frozenset[int], consumer: bool) -> None:
        for o in outs:
            if o.grad_fn is None:
                self.no_graph[id(o)] = (o, units)
                self._keep.append(o)
            else:
                self.unit_nodes.setdefault(id(o.grad_fn), set()).update((i, consumer) for i in units)
                self._keep.append(o.grad_fn)

    def _hook(self, module: nn.Module, args: Any, out: Any) -> None:
        mid = id(module)
        if mid in self.unit_of:
            self._carry(self._floats(out), frozenset({self.unit_of[mid]}), False)
        elif mid in self.parametrised and mid not in self.skip and mid not in self.inside:
            for o in self._floats(out):
                if o.grad_fn is not None:
                    self.other_nodes.add(id(o.grad_fn))
                    self._keep.append(o.grad_fn)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.no_graph:
            fed: set[int] = set()
            for t in tensors_in(args, kwargs):
                hit = self.no_graph.get(id(t))
                if hit is not None and hit[0] is t:
                    fed |= hit[1]
            if fed:
                self._carry(self._floats(out), frozenset(fed), True)
        return out

    def __enter__(self) -> PathWatch:
        if self.facts.units:
            self._handle = nn.modules.module.register_module_forward_hook(self._hook)
            super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            super().__exit__(*exc)
            self._handle.remove()
            self._handle = None

    def settle(self, roots: list[Any]) -> None:
        """Walk each loss's graph from its root: which units it reaches, and whether on a path through no other module
        that holds parameters."""
        if not self.unit_nodes:
            return
        seen: set[tuple[int, bool]] = set()
        stack: list[tuple[Any, bool]] = [(r, False) for r in roots if r is not None]
        while stack and len(seen) < MAX_NODES:
            node, crossed = stack.pop()
            if (id(node), crossed) in seen:
                continue
            seen.add((id(node), crossed))
            for i, consumer in self.unit_nodes.get(id(node), ()):
                unit = self.facts.units[i]
                unit.on_path = True
                unit.last = unit.last or (not crossed and not consumer)
            crossed = crossed or id(node) in self.other_nodes
            stack.extend((c, crossed) for c, _ in node.next_functions if c is not None)


def adapter_config(model: nn.Module, record: Any, at: Loc | None) -> dict[str, Any] | None:
    """The declared targets of an adapter config held by the model (peft's `peft_config`), and the user line that made
    it (the assignment of the variable the freezing line's frame held it in)."""
    config = next((c for m in model.modules() if isinstance(c := getattr(m, "peft_config", None), dict) and c), None)
    if config is None:
        return None
    cfg = next(iter(config.values()))
    if not hasattr(cfg, "modules_to_save"):
        return None
    targets = getattr(cfg, "target_modules", None)
    out: dict[str, Any] = {"type": type(cfg).__name__, "task_type": _plain(getattr(cfg, "task_type", None)),
                           "modules_to_save": _plain(cfg.modules_to_save),
                           "target_modules": sorted(targets) if isinstance(targets, (set, frozenset)) else _plain(targets)}
    frames = getattr(record, "freeze_frames", None) or {}
    env = frames.get((at["file"], at["line"])) if at else None
    var = next((k for k, v in (env[0] if env else {}).items() if v is cfg), None)
    if var is not None and at is not None:
        out["variable"] = var
        out["location"] = _assignment(at, var)
    return out


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (str, int, float, bool)):
        return getattr(v, "value", v)  # a str enum (peft's TaskType): its value
    if isinstance(v, (list, tuple, set, frozenset)):
        return [str(x) for x in v]
    return str(getattr(v, "value", v))


def _assignment(at: Loc, var: str) -> Loc | None:
    """The last assignment to `var` at or before the freezing line, in its file."""
    try:
        tree = ast.parse("".join(linecache.getlines(at["file"])))
    except (SyntaxError, ValueError):
        return None
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno <= at["line"]
             and any(isinstance(t, ast.Name) and t.id == var
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    return location(at["file"], max(lines), at.get("function") or "?") if lines else None


def _line(loc: Loc | None) -> str:
    return f"line {loc['line']} of {str(loc['file']).rsplit('/', 1)[-1]}" if loc else "a line gradprobe did not see"


def _listed(names: list[str], cap: int = 3) -> str:
    return and_more(names, cap)


def _situation(facts: FrozenInitFacts, u: Unit) -> str | None:
    if facts.loaded and u.last:
        return "adapter" if facts.adapter is not None and id(u.module) in facts.adapter_units else None
    if facts.loaded:
        return "inner"
    return "scratch_head" if u.last else "random_features"


@GP123.detector
def frozen_at_init(facts: FrozenInitFacts) -> Iterator[Finding]:
    groups: dict[tuple[Any, ...], list[Unit]] = {}  # units frozen by one line, in one situation: one finding
    for u in facts.units:
        if u.on_path:
            key = u.frozen_at or u.init_at or {}
            groups.setdefault((_situation(facts, u), key.get("file"), key.get("line")), []).append(u)
    for (situation, _, _), units in groups.items():
        u = units[0]
        names = [n for x in units for n in x.names]
        at = u.frozen_at or u.init_at
        adapter: dict[str, Any] = facts.adapter or {}
        cfg_at: Loc | None = adapter.get("location")
        module = _listed([x.path for x in units], 4)
        yield GP123.finding(
            situation, parameters=names, location=at,
            evidence={"modules": [x.path for x in units], "classes": sorted({type(x.module).__name__ for x in units}),
                      "initialiser": {"op": u.init_op, "location": u.init_at}, "frozen_at": u.frozen_at,
                      "froze": u.froze, "loaded_tensors": facts.loaded, "on_loss_path": True,
                      "last_before_loss": any(x.last for x in units), "adapter_config": facts.adapter},
            module=module, count=len(names), names=_listed(names), init_op=u.init_op,
            init_at=f" under {_line(u.init_at)}" if u.init_at else "", loaded=facts.loaded,
            frozen_at=_line(u.frozen_at), frozen_code=(u.frozen_at or {}).get("code", "?"), froze=u.froze,
            line=(at or {}).get("line", "?"), file=str((at or {}).get("file", "?")).rsplit("/", 1)[-1],
            attr=f"model.{u.path}", leaf=u.path.rsplit(".", 1)[-1],
            config_at=f" ({adapter.get('type', 'config')} at {_line(cfg_at)}, `{cfg_at.get('code', '')}`)" if cfg_at
            else f" ({adapter.get('type', 'config')})",
            modules_to_save=adapter.get("modules_to_save"), task_type=adapter.get("task_type"))


def verdict_lines(facts: FrozenInitFacts, frozen: int, stepped: bool) -> tuple[list[str], list[dict[str, str]]]:
    """What the GP123 check measured (the shared `verified` contract), and what it could not (`not_run`)."""
    if not frozen:
        return [], []
    if not facts.units:
        return [f"frozen at initialisation: none of the {frozen} frozen tensors holds only its initialiser's values "
                f"(written by a load, or not by an initialiser)"], []
    n = sum(len(u.params) for u in facts.units)
    if not stepped:
        return [], [{"check": "frozen-at-initialisation path", "cause": "user_code",
                     "why": f"{len(facts.units)} frozen module(s) at their initialisation ({n} tensors) were found, "
                            "but no backward() ran, so whether the loss reaches them was not measured"}]
    on = [u for u in facts.units if u.on_path]
    return [f"frozen at initialisation: {len(facts.units)} frozen module(s) hold only their initialiser's values ({n} "
            f"tensors), {len(on)} on the loss's path ({sum(u.last for u in on)} with no module after them); "
            f"{facts.loaded} other tensors were loaded"], []
