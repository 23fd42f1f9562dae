"""The ecosystem sweep: `diagnose` on one real training step of hundreds of healthy models.

Every model is built from a tiny config (no weights are downloaded) and checked twice:
  * ground truth, in plain PyTorch without gradprobe (a forked child per model): does it train
    (finite loss and gradients, AdamW moves the trainable parameters), and which gradients are
    None or zero by design;
  * gradprobe, through the machinery the server uses (`gradprobe.sandbox.call.execute`: one
    sandboxed child per model, forked from the warm worker, with a timeout), target = inline `setup`.
On a model that trains, every error-severity finding is a false error, and a GP000/GP100 (or GP114-GP117: a timeout, a dead
child) is an
internal crash (the model loads and trains without gradprobe). A GP113 (the check stopped at the
sandbox's memory limit) is its own bucket, "resource limit": neither clean nor a crash nor a false error.
With --steps N, diagnose also runs N observed training steps (its `steps` option); a warning from one of this
round's new codes (NEW_CODES, and every GP6xx) on a model that trains is counted apart, "new-code warnings".

    nice -n 10 python benchmarks/sweep.py                        # everything
    python benchmarks/sweep.py --only peft --limit 20 --jobs 2
    python benchmarks/sweep.py --sample --json                   # the fixed fast sample (the test)
    nice -n 10 python benchmarks/sweep.py --steps 2 --jobs 2     # diagnose with 2 observed training steps
    python benchmarks/sweep.py --wrap compile --stride 20        # each model compiled (aot_eager) before the step
    python benchmarks/sweep.py --wrap bf16 --stride 20           # the step under torch.autocast (bf16; fp16-scaler too)
    nice python benchmarks/sweep.py --wrap ddp --stride 40       # at two ranks, gradprobe's DDP wrap (fsdp2: fully_shard)

Families: transformers, midtrain (causal LMs diagnosed after one training step already ran), peft,
diffusers, examples, timm, torchvision (skipped with the reason when they do not import).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
from typing import Any
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
EXAMPLES = ROOT / "examples" / "broken"
FAMILIES = ("transformers", "midtrain", "peft", "diffusers", "examples", "timm", "torchvision")
COLUMNS = ("built", "clean", "crash", "false_error", "resource_limit", "skipped")
GT_TIMEOUT_S = 90.0
DIAGNOSE_TIMEOUT_S = 120.0
# This round's new codes (besides every GP6xx): a warning from one of them on a model that trains is counted apart.
NEW_CODES = frozenset({"GP118", "GP119", "GP120", "GP212", "GP213", "GP315", "GP316", "GP317", "GP318", "GP319",
                       "GP703", "GP704", "GP705", "GP706", "GP707"})


def is_new_code(code: str) -> bool:
    return code in NEW_CODES or code.startswith("GP6")

# The fixed fast sample (the test): at least one model of every family that can run here.
SAMPLE = [
    {"family": "transformers", "task": "causal_lm", "model_type": "gpt2", "cls": "GPT2LMHeadModel"},
    {"family": "transformers", "task": "seq_cls", "model_type": "bert", "cls": "BertForSequenceClassification"},
    {"family": "transformers", "task": "seq2seq", "model_type": "m2m_100", "cls": "M2M100ForConditionalGeneration"},
    {"family": "transformers", "task": "image_cls", "model_type": "vit", "cls": "ViTForImageClassification"},
    {"family": "midtrain", "task": "causal_lm", "model_type": "llama", "cls": "LlamaForCausalLM", "warm": True},
    {"family": "peft", "base": "gpt2", "method": "LORA"},
    {"family": "peft", "base": "llama", "method": "PREFIX_TUNING"},
    {"family": "peft", "base": "llama", "method": "LORA+dora"},
    {"family": "diffusers", "cls": "UNet2DModel"},
    {"family": "examples", "file": "healthy_prompt_llama.py"},
]


def spec_name(spec: dict) -> str:
    f = spec["family"]
    if f in ("transformers", "midtrain"):
        return f"{spec['task']}/{spec['model_type']}"
    if f == "peft":
        return f"{spec['method'].lower()}@{spec['base']}"
    if f == "diffusers":
        return spec["cls"]
    if f == "examples":
        return spec["file"]
    return spec.get("name", "?")


# ---- enumeration ---------------------------------------------------------------------------------

def enumerate_specs(family: str) -> tuple[list[dict], list[dict]]:
    """(specs to run, skipped entries) for one family; imports only what enumeration needs."""
    sys.path.insert(0, str(BENCH))
    import sweep_models as sm

    reason = sm.import_family("peft" if family == "peft" else "transformers" if family == "midtrain" else family) \
        if family != "examples" else None
    if reason is not None:
        return [], [{"family": family, "name": family, "skip": reason}]
    specs: list[dict] = []
    skipped: list[dict] = []
    if family in ("transformers", "midtrain"):
        specs, skipped = _hf_specs(family, sm)
    elif family == "peft":
        specs = _peft_specs(sm)
    elif family == "diffusers":
        specs = [{"family": "diffusers", "cls": c} for c in ("UNet2DModel", "UNet2DConditionModel", "AutoencoderKL")]
    elif family == "examples":
        sys.path.insert(0, str(ROOT / "tests"))
        for path in sorted(EXAMPLES.glob("*.py")):
            expect = _example_expect(path)
            if expect is not None and (expect.get("healthy") or not expect.get("codes")):
                specs.append({"family": "examples", "file": path.name})
    for s in specs:
        s["name"] = spec_name(s)
    return specs, skipped


def _hf_specs(family: str, sm: Any) -> tuple[list[dict], list[dict]]:
    """Every auto-mapped transformers model of the sweep's tasks (the causal LMs only for midtrain)."""
    import transformers
    from transformers.models.auto import modeling_auto

    specs: list[dict] = []
    skipped: list[dict] = []
    tasks = sm.HF_TASKS if family == "transformers" else {"causal_lm": sm.HF_TASKS["causal_lm"]}
    for task, mapping in tasks.items():
        for model_type, cls in getattr(modeling_auto, mapping).items():
            cls = cls[0] if isinstance(cls, (tuple, list)) else cls
            spec = {"family": family, "task": task, "model_type": model_type, "cls": cls}
            if family == "midtrain":
                spec["warm"] = True
            if model_type not in transformers.CONFIG_MAPPING:
                skipped.append({**spec, "name": spec_name(spec), "skip": "no config class in CONFIG_MAPPING"})
            elif not hasattr(transformers, cls):
                skipped.append({**spec, "name": spec_name(spec), "skip": f"{cls} is not exported by transformers"})
            else:
                specs.append(spec)
    return specs, skipped


def _peft_specs(sm: Any) -> list[dict]:
    import peft

    specs: list[dict] = []
    for kind in peft.PeftType:
        for base in ("gpt2", "llama", "t5"):
            specs.append({"family": "peft", "base": base, "method": kind.name})
    for variant in sm.LORA_VARIANTS:
        for base in ("gpt2", "llama"):
            specs.append({"family": "peft", "base": base, "method": f"LORA+{variant}"})
    for kind in ("LORA", "PREFIX_TUNING", "PROMPT_TUNING", "IA3"):
        specs.append({"family": "peft", "base": "bart", "method": kind})
    return specs


def _example_expect(path: Path) -> dict | None:
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECT":
            return ast.literal_eval(node.value)
    return None


# ---- ground truth: a fork server that imported torch once, one forked child per model ------------

def gt_server() -> None:
    """Read specs (JSON lines) on stdin, answer each with the plain-PyTorch ground truth on stdout."""
    sys.path.insert(0, str(BENCH))
    import torch  # noqa: F401  (imported once, before forking; no tensor op runs in this process)

    for mod in ("transformers", "peft", "diffusers"):
        try:
            __import__(mod)
        except Exception:
            pass
    out = sys.stdout
    for line in sys.stdin:
        spec = json.loads(line)
        out.write(json.dumps(_gt_fork(spec)) + "\n")
        out.flush()


def _gt_fork(spec: dict) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = _gt_child(spec)
        except BaseException as exc:
            res = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "tb": traceback.format_exc()[-1500:]}
        data = json.dumps(res, default=str).encode()
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    buf = b""
    deadline = time.monotonic() + GT_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return {"error": f"plain step did not finish in {GT_TIMEOUT_S:g} s"}
        ready, _, _ = select.select([r], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            buf += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not buf:
        return {"error": f"plain step child died (status {status})"}
    return json.loads(buf)


def _gt_child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    import sweep_models as sm

    if spec["family"] == "examples":
        return _gt_example(spec)
    if spec["family"] in ("transformers", "midtrain"):
        errors = []
        for variant in range(4):
            try:
                res = sm.plain_step({**spec, "variant": variant})
                res["variant"] = variant
                return res
            except TimeoutError as exc:
                return {"error": str(exc)}
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                if variant == 0 and _not_a_shape_problem(exc):
                    break
        return {"error": errors[0], "all_errors": errors}
    return sm.plain_step(spec)


def _not_a_shape_problem(exc: BaseException) -> bool:
    """Build failures (not the batch's shape) are not retried with another batch."""
    tb = traceback.extract_tb(exc.__traceback__)
    return not any(fr.name in ("forward", "hf_inputs", "_call_impl", "plain_step") for fr in tb[1:]) and \
        not isinstance(exc, (RuntimeError, ValueError, IndexError))


def _gt_example(spec: dict) -> dict:
    import importlib.util

    import torch

    sys.path.insert(0, str(EXAMPLES))
    modspec = importlib.util.spec_from_file_location("example_under_sweep", EXAMPLES / spec["file"])
    mod = importlib.util.module_from_spec(modspec)
    modspec.loader.exec_module(mod)
    t0 = time.perf_counter()
    model = mod.build_model()
    batch = mod.make_inputs() if hasattr(mod, "make_inputs") else None
    opt = mod.make_optimizer(model) if hasattr(mod, "make_optimizer") else \
        torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    build_s = time.perf_counter() - t0
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in named}
    t1 = time.perf_counter()
    if hasattr(mod, "train_step"):
        mod.train_step(model, batch, opt)
        loss_val = None
    else:
        out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, tuple) else model(batch)
        loss = mod.loss_fn(out, batch) if hasattr(mod, "loss_fn") else _default_loss(out)
        loss.backward()
        opt.step()
        loss_val = float(loss.detach())
    step_s = time.perf_counter() - t1
    moved = [n for n, p in named if not torch.equal(before[n], p.detach())]
    none = [n for n, p in named if p.grad is None]
    zero = [n for n, p in named if p.grad is not None and not bool(p.grad.any())]
    trains = bool(moved) and (loss_val is None or loss_val == loss_val)
    return {"trains": trains, "why": "" if trains else "no parameter moved", "loss": loss_val, "build_s": build_s,
            "step_s": step_s, "trainable": len(named), "grad_none": none, "grad_zero": zero, "moved": len(moved)}


def _default_loss(out):
    """gradprobe's documented default: an HF output's .loss, a scalar as it is, else a fixed random projection."""
    import torch

    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        return out.reshape(())
    flat = [t for t in (out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out])
            if isinstance(t, torch.Tensor) and t.is_floating_point()]
    g = torch.Generator().manual_seed(0)
    return sum((t * torch.randn(t.shape, generator=g)).sum() for t in flat)


class GroundTruth:
    """One fork server process (a lane); restarted if it dies."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--gt-server"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                                              TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
                                              HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
                                     cwd=tempfile.gettempdir())

    def ask(self, spec: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            self.proc = None
            return {"error": f"ground-truth server died: {exc}"}
        if not line:
            self.proc = None
            return {"error": "ground-truth server died"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ---- gradprobe -------------------------------------------------------------------------------------

def target_for(spec: dict):
    from gradprobe.target import Target

    if spec["family"] == "examples":
        return Target(project_dir=str(EXAMPLES), model=spec["file"], timeout_s=DIAGNOSE_TIMEOUT_S)
    clean = {k: v for k, v in spec.items() if k not in ("name",)}
    setup = ("from sweep_models import build\n"
             f"model, inputs, loss_fn, optimizer = build({clean!r})\n") + "".join(WRAPS[w] for w in WRAP)
    ranks = max([WORLD.get(w, 1) for w in WRAP] or [1])
    return Target(project_dir=str(BENCH), setup=setup, timeout_s=DIAGNOSE_TIMEOUT_S * ranks, world_size=ranks)


# --wrap: what the target's setup adds after building a model, so the same healthy model is checked compiled, or with
# its step under autocast, or at two ranks (the user's usual forms; ground truth stays the plain fp32 step in one
# process: a model that trains)
_STEP = ("def train_step(model, batch, optimizer):\n"
         "    optimizer.zero_grad()\n"
         "    with torch.autocast('cpu', dtype={dtype}):\n"
         "        out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, tuple) "
         "else model(batch)\n"
         "        loss = loss_fn(out, batch)\n"
         "{backward}")
WRAPS = {
    "compile": "model = torch.compile(model, backend='aot_eager')\n",
    "bf16": _STEP.format(dtype="torch.bfloat16", backward=(
        "    loss.backward()\n    optimizer.step()\n")),
    "fp16-scaler": "scaler = torch.amp.GradScaler('cpu')\n" + _STEP.format(dtype="torch.float16", backward=(
        "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n")),
}
# two ranks (world_size 2, gloo): `ddp` leaves the model as built, so gradprobe wraps it in DistributedDataParallel
# (defaults) as a training script would; `fsdp2` shards it as torchtitan does before gradprobe sees it: `fully_shard`
# on each block of the outermost repeated blocks (a ModuleList of modules of one type that have a forward and hold
# parameters), then on the root; a block holding a parameter shared with another block or with the rest of the model
# (tied, or one adapter vector for all layers) stays with the root (FSDP2 cannot shard one parameter in two units)
_FSDP2 = ("from torch.distributed.fsdp import fully_shard\n"
          "_blocks = []\n"
          "for _name, _m in model.named_modules():\n"
          "    if (isinstance(_m, torch.nn.ModuleList) and len(_m) > 1 and len({type(c) for c in _m}) == 1\n"
          "            and type(_m[0]).forward is not torch.nn.Module.forward\n"
          "            and not any(_name.startswith(b + '.') for b, _ in _blocks)):\n"
          "        _blocks += [(f'{_name}.{i}', c) for i, c in enumerate(_m) if any(True for _ in c.parameters())]\n"
          "_where = {}\n"
          "for _n, _p in model.named_parameters(remove_duplicate=False):\n"
          "    _where.setdefault(id(_p), set()).add(next((b for b, _ in _blocks if _n.startswith(b + '.')), None))\n"
          "for _b, _block in _blocks:\n"
          "    if all(len(_where[id(_p)]) == 1 for _p in _block.parameters()):\n"
          "        fully_shard(_block)\n"
          "fully_shard(model)\n")
WRAPS["ddp"] = ""
WRAPS["fsdp2"] = _FSDP2
WORLD = {"ddp": 2, "fsdp2": 2}  # the wraps that run the target at several ranks (the ground truth stays one process)
WRAP: list[str] = []


_RAISE_SITES: dict[str, list[str]] = {}


def raise_sites(code: str) -> list[str]:
    """The gradprobe source lines that can produce `code` (the frame that raised a finding)."""
    if not _RAISE_SITES:
        for path in sorted((ROOT / "gradprobe").rglob("*.py")):
            for i, text in enumerate(path.read_text().splitlines(), 1):
                for m in re.finditer(r'"(GP\d{3})"', text):
                    producing = text.strip().startswith(m.group(0) + ",") or f"make_finding({m.group(0)}" in text
                    mapped = re.search(r'"\w+": ' + m.group(0), text) is not None  # a kind -> code table (trace's cuts)
                    if not (producing or mapped):
                        continue  # a RULES key or a list of codes, not a producing site
                    _RAISE_SITES.setdefault(m.group(1), []).append(f"{path.relative_to(ROOT)}:{i}")
    return _RAISE_SITES.get(code, [])


def internal_frame(tb: str) -> str:
    """The innermost gradprobe frame of a traceback text."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', tb)
    ours = [f for f in frames if "/gradprobe/" in f[0]]
    if not ours:
        return frames[-1][0] + ":" + frames[-1][1] if frames else "?"
    f = ours[-1]
    inside = f[0].split('/gradprobe/', 1)[-1]
    return f"{inside and 'gradprobe/' + inside}:{f[1]} in {f[2]}: {f[3].strip()}"


def classify(report: dict) -> dict:
    """crash / errors / resource limits / warnings / infos of one diagnose report (the model trains: errors are false;
    GP113 says a memory limit stopped the check, which is no verdict on the model either way)."""
    crashes, errors, limits, new_warnings = [], [], [], []
    warnings: Counter = Counter()
    infos: Counter = Counter()
    for f in report.get("findings", []):
        entry = {"code": f["code"], "message": f["message"][:400], "location": f.get("location"),
                 "parameters": (f.get("parameters") or [])[:6]}
        if f["code"] in ("GP000", "GP100", "GP114", "GP115", "GP116", "GP117"):
            tb = (f.get("evidence") or {}).get("internal_traceback") or (f.get("evidence") or {}).get("traceback") or ""
            entry["frame"] = internal_frame(tb) if tb else "(no traceback: " + str((f.get("evidence") or {}).get("phase")) + ")"
            entry["stderr_tail"] = str((f.get("evidence") or {}).get("stderr_tail") or "")[-600:]
            crashes.append(entry)
        elif f["code"] == "GP113":
            entry["phase"] = (f.get("evidence") or {}).get("phase")
            limits.append(entry)
        elif f["severity"] == "error":
            entry["frame"] = ", ".join(raise_sites(f["code"])[:4])
            errors.append(entry)
        elif f["severity"] == "warning":
            warnings[f["code"]] += 1
            if is_new_code(f["code"]):
                new_warnings.append(entry)
        else:
            infos[f["code"]] += 1
        for rel in (f.get("evidence") or {}).get("related", []) or []:
            if isinstance(rel, dict) and rel.get("severity") == "error" and f["severity"] != "error":
                errors.append({"code": rel.get("code"), "message": str(rel.get("message"))[:400], "folded": True})
    seen: set = set()
    errors = [e for e in errors if (e["code"], e["message"]) not in seen and not seen.add((e["code"], e["message"]))]
    return {"crashes": crashes, "errors": errors, "resource_limits": limits, "warnings": dict(warnings), "infos": dict(infos),
            "new_code_warnings": new_warnings}


def status_of(res: dict) -> str:
    """One bucket per model: a crash or a false error outranks a resource limit, which is not clean."""
    if res["crashes"]:
        return "crash"
    if res["errors"]:
        return "false_error"
    return "resource_limit" if res["resource_limits"] else "clean"


async def run_one(spec: dict, gt: GroundTruth, executor, steps: int = 0) -> dict:
    from gradprobe.sandbox.call import execute

    res: dict = {"family": spec["family"], "name": spec["name"], "spec": spec}
    truth = await asyncio.to_thread(gt.ask, {k: v for k, v in spec.items() if k != "name"})
    res["truth"] = truth
    if "error" in truth:
        res["status"] = "skipped"
        res["skip"] = "not built: " + truth["error"]
        return res
    if not truth.get("trains"):
        res["status"] = "skipped"
        res["skip"] = "does not train in plain PyTorch: " + truth.get("why", "")
        return res
    if "variant" in truth:
        spec = {**spec, "variant": truth["variant"]}
    t0 = time.perf_counter()
    try:
        report = await execute("diagnose", target_for(spec), {"steps": steps} if steps else None, executor=executor)
    except Exception as exc:
        report = {"findings": [{"code": "GP000", "severity": "error", "message": f"execute raised {type(exc).__name__}: {exc}",
                                "evidence": {"internal_traceback": traceback.format_exc()}}]}
    res["seconds"] = time.perf_counter() - t0
    res["ratio"] = res["seconds"] / max(truth["step_s"], 1e-6)
    res["ratio_build_step"] = res["seconds"] / max(truth["step_s"] + truth["build_s"], 1e-6)
    res.update(classify(report))
    res["status"] = status_of(res)
    from gradprobe.verdict import inconsistencies

    # the report's own verdict (docs/verdicts.md), what did not run, and whether the verdict is consistent
    res["verdict"] = (report.get("verdict") or {}).get("status")
    res["not_run"] = [e for e in (report.get("verdict") or {}).get("not_run", []) if e.get("cause") != "not_applicable"][:6]
    res["verdict_problems"] = inconsistencies(report) if "verdict" in report else []
    facts = report.get("facts") or {}
    if facts.get("ranks"):  # a two-rank wrap: how many ranks stepped, and who wrapped the model
        res["ranks"] = {"world_size": facts["ranks"].get("world_size"),
                        "stepped": sum(bool(r.get("stepped")) for r in facts["ranks"].get("ranks", [])),
                        "wrapped": (facts.get("model_form") or {}).get("wrapped")}
    if steps:  # did the several-steps audit run (its headline), or why not (its note)
        audited = (report.get("facts") or {}).get("steps") or {}
        res["steps_audited"] = "headline" in audited
        res["steps_note"] = str(audited.get("headline") or audited.get("note") or audited.get("step_error") or "")[:300]
    return res


async def sweep(specs: list[dict], jobs: int, log, steps: int = 0) -> list[dict]:
    from gradprobe.sandbox.executor import LocalExecutor

    executor = LocalExecutor(warm=True)  # what the server uses: children forked from a warm worker, confined
    queue: asyncio.Queue = asyncio.Queue()
    for s in specs:
        queue.put_nowait(s)
    results: list[dict] = []
    total = len(specs)

    async def lane() -> None:
        gt = GroundTruth()
        try:
            while not queue.empty():
                spec = queue.get_nowait()
                res = await run_one(spec, gt, executor, steps)
                results.append(res)
                found = res.get("crashes", []) + res.get("errors", []) + res.get("resource_limits", []) + \
                    res.get("new_code_warnings", [])
                extra = res.get("skip", "") if res["status"] == "skipped" else " ".join(f"{e['code']}" for e in found)
                secs = f"{res['seconds']:.1f}s" if "seconds" in res else ""
                log(f"[{len(results)}/{total}] {res['family']:<12} {res['name']:<45} {res['status']:<11} {secs} {extra[:160]}")
        finally:
            gt.close()

    try:
        await asyncio.gather(*(lane() for _ in range(max(1, jobs))))
    finally:
        executor.stop()
    return results


# ---- report ----------------------------------------------------------------------------------------

def summarize(results: list[dict], skipped: list[dict]) -> dict:
    fams: dict = {}
    for r in results + [{"family": s["family"], "name": s["name"], "status": "skipped", "skip": s["skip"]} for s in skipped]:
        f = fams.setdefault(r["family"], {"built": 0, "clean": 0, "crash": 0, "false_error": 0, "resource_limit": 0, "skipped": 0,
                                           "new_code_warning": 0, "steps_not_audited": 0,
                                           "warnings": Counter(), "infos": Counter(), "seconds": [], "ratios": [],
                                           "skip_reasons": Counter()})
        if r["status"] == "skipped":
            f["skipped"] += 1
            f["skip_reasons"][re.sub(r"\d+", "N", r["skip"])[:110]] += 1
            continue
        f["built"] += 1
        f[r["status"]] += 1
        f["new_code_warning"] += bool(r.get("new_code_warnings"))
        f["steps_not_audited"] += r.get("steps_audited") is False
        f["warnings"].update(r.get("warnings", {}))
        f["infos"].update(r.get("infos", {}))
        f["seconds"].append(r["seconds"])
        f["ratios"].append(r["ratio"])
    out = {}
    for name, f in fams.items():
        out[name] = {k: f[k] for k in COLUMNS + ("new_code_warning", "steps_not_audited")}
        out[name]["warnings"] = dict(sorted(f["warnings"].items()))
        out[name]["infos"] = dict(sorted(f["infos"].items()))
        out[name]["median_s"] = round(statistics.median(f["seconds"]), 2) if f["seconds"] else None
        out[name]["median_ratio_to_plain_step"] = round(statistics.median(f["ratios"]), 1) if f["ratios"] else None
        out[name]["skip_reasons"] = dict(f["skip_reasons"].most_common(12))
    return out


def print_table(summary: dict, results: list[dict], wall_s: float) -> None:
    head = (f"{'family':<13}{'built':>6}{'clean':>6}{'crash':>6}{'false err':>10}{'res limit':>10}{'skipped':>8}{'median s':>9}"
            f"{'x plain step':>13}  warnings by code")
    print(head)
    print("-" * len(head))
    tot = Counter()
    warn_tot: Counter = Counter()
    for name, s in summary.items():
        w = " ".join(f"{k}:{v}" for k, v in s["warnings"].items()) or "-"
        print(f"{name:<13}{s['built']:>6}{s['clean']:>6}{s['crash']:>6}{s['false_error']:>10}{s['resource_limit']:>10}{s['skipped']:>8}"
              f"{s['median_s'] if s['median_s'] is not None else '-':>9}{s['median_ratio_to_plain_step'] or '-':>13}  {w}")
        tot.update({k: s[k] for k in COLUMNS + ("new_code_warning", "steps_not_audited")})
        warn_tot.update(s["warnings"])
    print(f"{'total':<13}{tot['built']:>6}{tot['clean']:>6}{tot['crash']:>6}{tot['false_error']:>10}{tot['resource_limit']:>10}{tot['skipped']:>8}"
          f"{'':>22}  {' '.join(f'{k}:{v}' for k, v in sorted(warn_tot.items())) or '-'}")
    bad = [r for r in results if r["status"] in ("crash", "false_error")]
    if bad:
        print("\ncrashes and false errors:")
    for r in bad:
        for e in r.get("crashes", []) + r.get("errors", []):
            loc = e.get("location") or {}
            where = f"{loc.get('file')}:{loc.get('line')}" if loc else "-"
            print(f"  {r['family']}/{r['name']}: {e['code']} {e['message'][:220]!r}\n"
                  f"      at {where}; raised by {e.get('frame', '?')}")
    warned = [r for r in results if r.get("new_code_warnings")]
    if warned:
        print("\nwarnings from this round's new codes:")
    for r in warned:
        for e in r["new_code_warnings"]:
            loc = e.get("location") or {}
            print(f"  {r['family']}/{r['name']}: {e['code']} {e['message'][:220]!r} at {loc.get('file')}:{loc.get('line')}")
    limited = [r for r in results if r["status"] == "resource_limit"]
    if limited:
        print("\nstopped at a resource limit (GP113: not a verdict on the model):")
    for r in limited:
        for e in r.get("resource_limits", []):
            print(f"  {r['family']}/{r['name']}: {e['code']} in phase {e.get('phase')!r}: {e['message'][:220]!r}")
    for name, s in summary.items():
        if s["skip_reasons"]:
            print(f"\nskipped in {name}: " + "; ".join(f"{v}x {k}" for k, v in s["skip_reasons"].items()))
    print(f"\nsweep: {tot['built']} built, {tot['clean']} clean, {tot['crash']} internal crashes, "
          f"{tot['false_error']} with false errors, {tot['new_code_warning']} with new-code warnings, "
          f"{tot['resource_limit']} stopped at a resource limit, "
          f"{tot['skipped']} skipped, in {wall_s / 60:.1f} min")
    if any(r.get("steps_audited") is not None for r in results):
        print(f"steps: the several-steps audit did not run on {tot['steps_not_audited']} of the {tot['built']} built models")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=FAMILIES, help="run only this family (repeatable)")
    ap.add_argument("--limit", type=int, default=None, help="at most N models per family (in --sample too)")
    ap.add_argument("--stride", type=int, default=1, help="every Nth model of each family (a spread sample; before --limit)")
    ap.add_argument("--match", default=None, help="only models whose name contains this")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    ap.add_argument("--out", default=None, help="also write the JSON results to this file")
    ap.add_argument("--jobs", type=int, default=1, help="models checked at once (default 1)")
    ap.add_argument("--steps", type=int, default=0, help="diagnose with this many observed training steps (default 0)")
    ap.add_argument("--wrap", choices=sorted(WRAPS), default=None,
                    help="check each model compiled (aot_eager), with its step under autocast, or at two ranks: "
                         "ddp (gradprobe wraps it in DistributedDataParallel), fsdp2 (the setup applies fully_shard to "
                         "the repeated blocks and the root); the ground truth stays the single-process fp32 step; "
                         "not the examples family")
    ap.add_argument("--sample", action="store_true", help="the fixed fast sample (the test in tests/test_sweep_sample.py)")
    ap.add_argument("--gt-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gt_server:
        gt_server()
        return 0
    sys.path.insert(0, str(ROOT))
    if args.wrap:
        WRAP.append(args.wrap)
    t0 = time.perf_counter()
    specs: list[dict] = []
    skipped: list[dict] = []
    if args.sample:
        for fam in FAMILIES:
            if fam in ("timm", "torchvision"):
                skipped += enumerate_specs(fam)[1]
        per_family: Counter = Counter()
        for s in SAMPLE:  # --limit (per family) and --match narrow the sample too
            per_family[s["family"]] += 1
            if (not args.limit or per_family[s["family"]] <= args.limit) and (not args.match or args.match in spec_name(s)):
                specs.append({**s, "name": spec_name(s)})
    else:
        for fam in args.only or FAMILIES:
            if args.wrap and fam == "examples":
                continue  # an example file is its own target: nothing to wrap
            got, skip = enumerate_specs(fam)
            if args.match:
                got = [s for s in got if args.match in s["name"]]
            got = got[args.stride - 1::args.stride] if args.stride > 1 else got
            specs += got[: args.limit] if args.limit else got
            skipped += skip

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results = asyncio.run(sweep(specs, args.jobs, log, args.steps))
    wall = time.perf_counter() - t0
    summary = summarize(results, skipped)
    payload = {"summary": summary, "results": results, "skipped": skipped, "wall_s": wall, "steps": args.steps}
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=1, default=str))
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        print_table(summary, results, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
