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
With --steps N, diagnose also runs N observed training steps (its `steps` option); a warning from one of the recent
rounds' new codes (NEW_CODES, and every GP6xx, GP8xx, GP9xx) on a model that trains is counted apart, "new-code warnings".
With --tools, each model is checked by several tools in turn (diagnose, check_equivalence, check_dependencies; one table
per tool, a model's worst bucket over them, one last line per tool): a check a tool left out for a reason of
gradprobe's own (`not_run`, cause `gradprobe`) is a "gap", listed, neither clean nor a false error. GP901/GP902 are
judged against a plain-PyTorch measurement of what the outputs see on the same weights (sweep_leaks.py): on a model
whose outputs do see the future (other examples) they are true findings ("found"), and a dependency check that ran and
did not report such a leak "missed" it.

    nice -n 10 python benchmarks/sweep.py                        # everything
    python benchmarks/sweep.py --only peft --limit 20 --jobs 2
    python benchmarks/sweep.py --sample --json                   # the fixed fast sample (the test)
    nice -n 10 python benchmarks/sweep.py --steps 2 --jobs 2     # diagnose with 2 observed training steps
    nice -n 10 python benchmarks/sweep.py --tools diagnose,check_equivalence,check_dependencies --jobs 2
    python benchmarks/sweep.py --wrap compile --stride 20        # each model compiled (aot_eager) before the step
    python benchmarks/sweep.py --wrap bf16 --stride 20           # the step under torch.autocast (bf16; fp16-scaler too)
    nice python benchmarks/sweep.py --wrap ddp --stride 40       # at two ranks, gradprobe's DDP wrap (fsdp2: fully_shard)

Families: transformers, midtrain (causal LMs diagnosed after one training step already ran), peft,
diffusers, examples, timm, torchvision (skipped with the reason when they do not import).

This file enumerates the models and runs gradprobe on them; sweep_models.py builds a model from its spec,
sweep_truth.py measures the ground truth (sweep_leaks.py what the outputs see), sweep_report.py classifies each report
and prints the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
EXAMPLES = ROOT / "examples" / "broken"
FAMILIES = ("transformers", "midtrain", "peft", "diffusers", "examples", "timm", "torchvision")
DIAGNOSE_TIMEOUT_S = 120.0

sys.path.insert(0, str(BENCH))  # run as a script or imported: its sibling modules
from sweep_report import classify, judge_leaks, print_table, status_of, summarize, worst  # noqa: E402
from sweep_truth import GroundTruth, gt_server  # noqa: E402

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
WRAPS["accum2"] = "from sweep_models import accumulation_step\ntrain_step = accumulation_step(loss_fn, 2)\n"
WRAPS["ddp"] = ""
WRAPS["fsdp2"] = _FSDP2
WORLD = {"ddp": 2, "fsdp2": 2}  # the wraps that run the target at several ranks (the ground truth stays one process)
WRAP: list[str] = []


TOOLS = ("diagnose", "check_equivalence", "check_dependencies")  # what --tools may name
# the weights each tool's dependency measurements run on: as built, or after diagnose's observed step
SEES = {"check_dependencies": "built", "check_equivalence": "built", "diagnose": "after_step"}
PROBLEMS = ("crashes", "errors", "resource_limits", "new_code_warnings", "gaps", "found", "missed")


def tool_options(tool: str, steps: int) -> dict | None:
    """The options the sweep calls a tool with: its defaults (diagnose's `steps` with --steps)."""
    return {"steps": steps} if tool == "diagnose" and steps else None


async def run_tool(tool: str, spec: dict, truth: dict, executor, steps: int) -> dict:
    """One tool on one model that trains: its report classified, its cost, against the plain step's."""
    from gradprobe.sandbox.call import execute

    t0 = time.perf_counter()
    try:
        report = await execute(tool, target_for(spec), tool_options(tool, steps), executor=executor)
    except Exception as exc:
        report = {"findings": [{"code": "GP000", "severity": "error", "message": f"execute raised {type(exc).__name__}: {exc}",
                                "evidence": {"internal_traceback": traceback.format_exc()}}]}
    res: dict = {"seconds": time.perf_counter() - t0}
    res["ratio"] = res["seconds"] / max(truth["step_s"], 1e-6)
    res["ratio_build_step"] = res["seconds"] / max(truth["step_s"] + truth["build_s"], 1e-6)
    res.update(classify(report))
    facts = report.get("facts") or {}
    if tool in SEES:  # GP901-GP903, GP803 judged against plain PyTorch on the weights the tool measured (sweep_leaks.py)
        judge_leaks(res, (truth.get("sees") or {}).get(SEES[tool]), measured_kinds(tool, facts))
    for key in PROBLEMS:
        for entry in res.get(key, []):
            entry["tool"] = tool
    res["status"] = status_of(res)
    if facts.get("ranks"):  # a two-rank wrap: how many ranks stepped, and who wrapped the model
        res["ranks"] = {"world_size": facts["ranks"].get("world_size"),
                        "stepped": sum(bool(r.get("stepped")) for r in facts["ranks"].get("ranks", [])),
                        "wrapped": (facts.get("model_form") or {}).get("wrapped")}
    if tool == "diagnose" and steps:  # did the several-steps audit run (its headline), or why not (its note)
        audited = facts.get("steps") or {}
        res["steps_audited"] = "headline" in audited
        res["steps_note"] = str(audited.get("headline") or audited.get("note") or audited.get("step_error") or "")[:300]
    if tool == "check_equivalence":  # which comparisons applied
        res["applied"] = sorted(n for n, c in (facts.get("comparisons") or {}).items() if c.get("applies"))
    res["verified"] = [str(v)[:240] for v in (facts.get("verified") or [])[:8]]  # what the tool says it measured
    # the report's own verdict (docs/verdicts.md), what did not run, and whether the verdict is consistent
    from gradprobe.verdict import inconsistencies

    verdict = report.get("verdict") or {}
    res["verdict"] = verdict.get("status")
    res["not_run"] = [e for e in verdict.get("not_run", []) if e.get("cause") != "not_applicable"][:6]
    res["verdict_problems"] = inconsistencies(report) if "verdict" in report else []
    return res


def measured_kinds(tool: str, facts: dict) -> tuple[str, ...]:
    """What a tool's report measured of what the outputs see: check_dependencies all of it, diagnose where its dependency
    check ran, check_equivalence packed rows where its packing comparison applied."""
    if tool == "check_equivalence":
        return ("packed",) if ((facts.get("comparisons") or {}).get("packing") or {}).get("applies") else ()
    if tool == "diagnose" and not (facts.get("dependencies") or {}).get("ran"):
        return ()
    return ("future", "examples", "packed")


async def run_one(spec: dict, gt: GroundTruth, executor, steps: int = 0, tools: tuple[str, ...] = ("diagnose",)) -> dict:
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
    res["tools"] = {tool: await run_tool(tool, spec, truth, executor, steps) for tool in tools}
    # the model over every tool: its worst bucket, every problem (each tagged with its tool), the first tool's costs
    per = list(res["tools"].values())
    res["status"] = worst([t["status"] for t in per])
    for key in PROBLEMS:
        res[key] = [e for t in per for e in t.get(key, [])]
    for key in ("warnings", "infos"):
        res[key] = dict(sum((Counter(t[key]) for t in per), Counter()))
    res["verdict_problems"] = [(tool, p) for tool, t in res["tools"].items() for p in t.get("verdict_problems", [])]
    for key in ("seconds", "ratio", "ratio_build_step", "ranks", "steps_audited", "steps_note", "dependency_s"):
        if key in per[0]:
            res[key] = per[0][key]
    return res


async def sweep(specs: list[dict], jobs: int, log, steps: int = 0, tools: tuple[str, ...] = ("diagnose",)) -> list[dict]:
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
                res = await run_one(spec, gt, executor, steps, tools)
                results.append(res)
                found = res.get("crashes", []) + res.get("errors", []) + res.get("resource_limits", []) + \
                    res.get("new_code_warnings", []) + res.get("found", []) + res.get("missed", [])
                extra = res.get("skip", "") if res["status"] == "skipped" else " ".join(
                    [f"{e['code']}" for e in found] + [f"gap:{g['tool']}" for g in res.get("gaps", [])])
                secs = " ".join(f"{t['seconds']:.1f}s" for t in res.get("tools", {}).values())
                log(f"[{len(results)}/{total}] {res['family']:<12} {res['name']:<45} {res['status']:<11} {secs} {extra[:160]}")
        finally:
            gt.close()

    try:
        await asyncio.gather(*(lane() for _ in range(max(1, jobs))))
    finally:
        executor.stop()
    return results


def select_specs(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """(the models to run, the skipped entries) for the command line's --sample / --only / --packed / --match /
    --stride / --limit."""
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
        return specs, skipped
    for fam in args.only or FAMILIES:
        if (args.wrap or args.packed) and fam == "examples":
            continue  # an example file is its own target: nothing to wrap or pack
        if args.packed and fam not in ("transformers", "midtrain"):
            continue
        got, skip = enumerate_specs(fam)
        if args.packed:  # the causal LMs, their batch as one packed row
            got = [{**s, "packed": True, "name": s["name"] + "+packed"} for s in got if s.get("task") == "causal_lm"]
            skip = [s for s in skip if s.get("task") == "causal_lm"]
        if args.match:
            got = [s for s in got if args.match in s["name"]]
        got = got[args.stride - 1::args.stride] if args.stride > 1 else got
        specs += got[: args.limit] if args.limit else got
        skipped += skip
    return specs, skipped


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
                    help="check each model compiled (aot_eager), with its step under autocast, accumulating 2 micro-batches "
                         "(accum2: a train_step dividing each loss by 2), or at two ranks: "
                         "ddp (gradprobe wraps it in DistributedDataParallel), fsdp2 (the setup applies fully_shard to "
                         "the repeated blocks and the root); the ground truth stays the single-process fp32 step; "
                         "not the examples family")
    ap.add_argument("--packed", action="store_true",
                    help="only the causal LMs (transformers, midtrain), each fed its batch as one packed row (position_ids "
                         "restarting, no attention_mask, as DataCollatorWithFlattening makes it); GP903/GP803 judged against "
                         "plain PyTorch: each packed example run alone")
    ap.add_argument("--tools", default="diagnose",
                    help="the tools run on each model, comma-separated, in order (default diagnose): " + ", ".join(TOOLS))
    ap.add_argument("--sample", action="store_true", help="the fixed fast sample (the test in tests/test_sweep_sample.py)")
    ap.add_argument("--gt-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gt_server:
        gt_server()
        return 0
    tools = tuple(t.strip() for t in args.tools.split(",") if t.strip())
    if not tools or any(t not in TOOLS for t in tools):
        ap.error(f"--tools: comma-separated names among {', '.join(TOOLS)}")
    sys.path.insert(0, str(ROOT))
    if args.wrap:
        WRAP.append(args.wrap)
    t0 = time.perf_counter()
    specs, skipped = select_specs(args)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results = asyncio.run(sweep(specs, args.jobs, log, args.steps, tools))
    wall = time.perf_counter() - t0
    summary = summarize(results, skipped)
    by_tool = {tool: summarize(results, skipped, tool) for tool in tools}
    payload = {"summary": summary, "by_tool": by_tool, "results": results, "skipped": skipped, "wall_s": wall,
               "steps": args.steps, "tools": list(tools)}
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=1, default=str))
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        print_table(summary, results, wall, by_tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
