"""The mutation bench: real sources -> seeded bugs -> plain-PyTorch oracle -> gradprobe through MCP -> tables.

    python -m benchmarks.mutants                      # the full bench (nice it: it is CPU-bound)
    python -m benchmarks.mutants --only detach,inplace --sources gpt2,nanogpt --limit 40 --json out.json

1. Each source (projects.py) is materialised in a temporary project and run once unmutated (the
   baseline: which tensors trained, which lines ran while building and while stepping). The unmutated
   source is also a control case: any error finding on it is a false error.
2. Every operator (operators.py) proposes mutants at the sites that ran; up to --per-op per
   (source, operator) are drawn with a fixed seed.
3. Each mutant runs in plain PyTorch (oracle.py). It is kept only when the bug is observable: the
   culprits are the tensors that trained in the baseline and, in the mutant, get no gradient, a zero
   gradient or do not change; or backward raises; or gradcheck fails — as the operator declares.
   Discarded mutants are counted per operator with the reason.
4. Kept mutants become bugzoo-format case directories (case.py + the mutated files + expected.json),
   scored through the real server (scoring.py, the rule of ../shared/tools/score_corpus.py).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.mutants import operators as ops
from benchmarks.mutants.oracle import run_forked, warm
from benchmarks.mutants.projects import ALL_SOURCES, Source, materialise, unavailable


@dataclass
class Kept:
    id: str
    source: str
    op: str
    case_dir: Path
    expected: dict[str, Any]


@dataclass
class Gen:
    kept: list[Kept] = field(default_factory=list)
    controls: list[Path] = field(default_factory=list)
    discarded: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    skipped_sources: dict[str, str] = field(default_factory=dict)
    proposed: Counter = field(default_factory=Counter)


_UNCONNECTED = re.compile(r"does not require grad|does not have a grad_fn")
_NOT_TORCH = re.compile(r"(AttributeError|NameError|TypeError|SyntaxError|ImportError|KeyError|IndexError):")


def _good(base: dict) -> set[str]:
    return {n for n, t in (base.get("tensors") or {}).items() if t["grad"] == "ok" and t["changed"]}


def decide(m: ops.Mutant, base: dict, res: dict) -> tuple[bool, list[str], str]:
    """(keep, culprits, reason) by the operator's oracle."""
    tensors = res.get("tensors") or {}
    err, phase = res.get("error"), res.get("phase")

    def bad(n: str) -> bool:
        t = tensors.get(n)
        return t is None or t["grad"] in ("none", "zero", "missing") or not t["changed"]

    stale = sorted(n for n in _good(base) if bad(n))
    raised = err is not None and phase == "step"
    gc_base, gc = base.get("gradcheck") or {}, res.get("gradcheck") or {}
    gc_failed = bool(m.function and gc_base.get(m.function) and gc.get(m.function) is False)
    if phase in ("timeout", "oracle"):
        return False, [], f"oracle {phase}"
    if raised and _NOT_TORCH.match(str(err)):
        # the mutation broke the Python itself (an int has no add_): a load/step failure, not the bug class seeded
        return False, [], f"invalid mutant ({str(err).split(':')[0]})"
    if err is not None and phase not in ("step",):
        return False, [], f"fails in {phase}"
    if m.oracle == "raises":
        return (True, [], "") if raised else (False, [], "did not raise")
    if m.oracle == "stale_or_raises" and raised:
        return True, [], ""
    if m.oracle in ("gradcheck", "stale_or_gradcheck") and gc_failed and err is None:
        return True, [], ""
    if raised and m.oracle.startswith("stale") and _UNCONNECTED.search(str(err)) and not m.function:
        # every trained tensor was cut off: backward() has nothing to differentiate (the same bug, total)
        return True, sorted(_good(base)), ""
    if raised:
        return False, [], "raised"
    if m.oracle == "trained":
        base_t = base.get("tensors") or {}
        trained = sorted(n for n, t in tensors.items() if t["changed"] and n in base_t and not base_t[n]["changed"])
        return (True, trained, "") if trained else (False, [], "nothing newly trained")
    if m.oracle in ("stale", "stale_or_raises", "stale_or_gradcheck"):
        if not stale:
            return False, [], "no effect on training"
        return True, ([] if m.function else stale), ""
    return False, [], "not observable"


def _expected(m: ops.Mutant, culprits: list[str], src: Source, id_: str) -> dict[str, Any]:
    where = m.expected_file or m.file
    exp: dict[str, Any] = {"id": id_, "tool": "diagnose", "buggy": True, "codes": list(m.codes),
                           "culprits": culprits, "line": m.line, "function": m.function,
                           "operator": m.op, "source": src.name, "symptom": m.desc,
                           "root_cause": f"seeded by the mutation bench: {m.desc}"}
    if where != "case.py":
        exp["file"] = where
    return exp


def _lines(base: dict, phase: str) -> set[tuple[str, int]]:
    ls = {tuple(x) for x in (base.get("lines") or {}).get("step", [])}
    if phase == "build":
        ls |= {tuple(x) for x in (base.get("lines") or {}).get("build", [])}
    return ls  # type: ignore[return-value]


def propose(src: Source, files: dict[str, str], base: dict, per_op: int, seed: int,
            only: set[str] | None) -> tuple[list[ops.Mutant], Counter]:
    proposed: list[ops.Mutant] = []
    not_reached: Counter = Counter()
    rng = random.Random(f"{seed}/{src.name}")
    parsed = {name: ops.parse(name, text) for name, text in files.items() if name.endswith(".py")}
    driver = parsed["case.py"]
    opt_line = ops.optimizer_statement_line(driver)
    tensors = base.get("tensors") or {}
    good = sorted(_good(base))
    baseline = ops.Baseline(children=tuple(base.get("children") or ()),
                            params=tuple(n for n in good if not n.split(".")[-1].isdigit()),
                            optimizer_line=opt_line)
    for name in src.mutable_model_files():
        p = parsed[name]
        for op in ops.MODEL_OPS.values():
            for m in op(p, name == "case.py"):
                if (m.file, m.site) not in _lines(base, m.phase):
                    not_reached[m.op] += 1
                    continue
                proposed.append(m)
        proposed.append(ops.grad_mode_mutant(p))
    for p in parsed.values():
        for m in ops.unfreeze_mutants(p, opt_line):
            if (m.file, m.site) in _lines(base, "build"):
                proposed.append(m)
    proposed.extend(ops.driver_mutants(driver, baseline, rng, per_op))
    del tensors
    if only:
        proposed = [m for m in proposed if m.op in only]
    by_op: dict[str, list[ops.Mutant]] = defaultdict(list)
    for m in proposed:
        by_op[m.op].append(m)
    chosen: list[ops.Mutant] = []
    for op_name in sorted(by_op):
        ms = by_op[op_name]
        chosen.extend(rng.sample(ms, per_op) if len(ms) > per_op else ms)
    return chosen, not_reached


def generate(sources: list[Source], workdir: Path, per_op: int, seed: int, only: set[str] | None,
             limit: int | None, log: Any) -> Gen:
    gen = Gen()
    for src in sources:
        why = unavailable(src)
        if why:
            gen.skipped_sources[src.name] = why
            print(f"[skip] {src.name}: {why}", file=log, flush=True)
            continue
        base_dir = workdir / "base" / src.name
        files = materialise(src, base_dir)
        warm(base_dir)
        base = run_forked(base_dir, trace=True, timeout=180)
        if base.get("error"):
            gen.skipped_sources[src.name] = f"the unmutated source fails: {base.get('phase')}: {base['error']}"
            print(f"[skip] {src.name}: {gen.skipped_sources[src.name]}", file=log, flush=True)
            continue
        ctrl = workdir / "cases" / f"control-{src.name}"
        shutil.copytree(base_dir, ctrl, ignore=shutil.ignore_patterns("__pycache__"))
        (ctrl / "expected.json").write_text(json.dumps({"id": ctrl.name, "tool": "diagnose", "buggy": False,
                                                        "source": src.name}, indent=1))
        gen.controls.append(ctrl)
        mutants, not_reached = propose(src, files, base, per_op, seed, only)
        for op_name, n in not_reached.items():
            gen.discarded[op_name]["site not run by the step"] += n
        n_src = 0
        t0 = time.perf_counter()
        for i, m in enumerate(mutants):
            if limit is not None and len(gen.kept) >= limit:
                break
            gen.proposed[m.op] += 1
            id_ = f"{src.name}-{m.op}-{i:03d}"
            case = workdir / "cases" / id_
            shutil.copytree(base_dir, case, ignore=shutil.ignore_patterns("__pycache__"))
            (case / m.file).write_text(m.text)
            res = run_forked(case, trace=False, timeout=90)
            keep, culprits, reason = decide(m, base, res)
            if not keep:
                gen.discarded[m.op][reason] += 1
                shutil.rmtree(case, ignore_errors=True)
                continue
            exp = _expected(m, culprits, src, id_)
            (case / "expected.json").write_text(json.dumps(exp, indent=1))
            gen.kept.append(Kept(id_, src.name, m.op, case, exp))
            n_src += 1
        print(f"[gen] {src.name}: {n_src} kept of {len(mutants)} tried in {time.perf_counter() - t0:.0f}s",
              file=log, flush=True)
    return gen


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} = {a / b:.0%}" if b else "0/0"


def table(title: str, groups: dict[str, list[dict]], discarded: dict[str, Counter] | None = None) -> list[str]:
    out = [f"{title:24s} {'kept':>5s} {'recall':>14s} {'right line':>14s}" + ("  discarded" if discarded else "")]
    for key in sorted(groups):
        rows = groups[key]
        hits = sum(bool(r.get("ok")) for r in rows)
        lines = sum(bool(r.get("line_ok")) for r in rows)
        extra = ""
        if discarded is not None:
            d = discarded.get(key) or Counter()
            extra = "  " + (", ".join(f"{v} {k}" for k, v in d.most_common()) or "-")
        out.append(f"{key:24s} {len(rows):5d} {_pct(hits, len(rows)):>14s} {_pct(lines, len(rows)):>14s}{extra}")
    return out


def load_kept(workdir: Path, max_per_op: int | None, only: set[str] | None, sources: set[str] | None) -> Gen:
    """The kept cases (and controls) of an earlier run's --keep directory."""
    gen = Gen()
    info = workdir / "generation.json"
    if info.exists():
        data = json.loads(info.read_text())
        for op, counts in data.get("discarded", {}).items():
            gen.discarded[op].update(counts)
        gen.skipped_sources.update(data.get("skipped_sources", {}))
    seen: Counter = Counter()
    for case in sorted((workdir / "cases").iterdir()):
        exp = json.loads((case / "expected.json").read_text())
        src = exp.get("source", "")
        if sources and src not in sources:
            continue
        if not exp.get("buggy"):
            gen.controls.append(case)
            continue
        if only and exp["operator"] not in only:
            continue
        seen[(src, exp["operator"])] += 1
        if max_per_op is not None and seen[(src, exp["operator"])] > max_per_op:
            continue
        gen.kept.append(Kept(exp["id"], src, exp["operator"], case, exp))
    return gen


def score_only(args: argparse.Namespace) -> dict[str, Any]:
    gen = load_kept(Path(args.score_only), args.max_per_op, set(args.only.split(",")) if args.only else None,
                    set(args.sources.split(",")) if args.sources else None)
    print(f"scoring {len(gen.kept)} kept mutants and {len(gen.controls)} controls from {args.score_only}", flush=True)
    return report(args, gen, 0.0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.mutants", description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="stop after this many kept mutants")
    ap.add_argument("--only", default=None, help="comma-separated operators")
    ap.add_argument("--sources", default=None, help="comma-separated sources")
    ap.add_argument("--per-op", type=int, default=10, help="mutants drawn per (source, operator)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every row (expected, verdict, findings) here")
    ap.add_argument("--keep", default=None, help="write the case directories here (bugzoo format)")
    ap.add_argument("--no-score", action="store_true", help="generate and validate only")
    ap.add_argument("--tool", default="diagnose")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--triage", default=None, help="write the misses grouped by operator and cause (markdown)")
    ap.add_argument("--score-only", default=None, help="score the cases a previous run kept (its --keep directory)")
    ap.add_argument("--max-per-op", type=int, default=None, help="with --score-only: at most this many per (source, operator)")
    args = ap.parse_args(argv)
    if args.score_only:
        return score_only(args)

    import torch  # the oracle forks from here: import the heavy libraries once

    torch.set_num_threads(1)
    sources = [s for s in ALL_SOURCES if not args.sources or s.name in set(args.sources.split(","))]
    for s in sources:
        if not unavailable(s):
            for pkg in s.needs:
                __import__(pkg)
    if any(s.name == "peft_lora" for s in sources) and not unavailable(sources[-1]):
        import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    only = set(args.only.split(",")) if args.only else None
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gp-mutants-"))
    if args.keep and workdir.exists():
        shutil.rmtree(workdir)
    (workdir / "cases").mkdir(parents=True)
    log = sys.stderr
    t0 = time.perf_counter()
    gen = generate(sources, workdir, args.per_op, args.seed, only, args.limit, log)
    t_gen = time.perf_counter() - t0
    (workdir / "generation.json").write_text(json.dumps(
        {"discarded": {k: dict(v) for k, v in gen.discarded.items()}, "skipped_sources": gen.skipped_sources,
         "seconds": t_gen}, indent=1))
    n_disc = sum(sum(c.values()) - c.get("site not run by the step", 0) for c in gen.discarded.values())
    print(f"generated {len(gen.kept)} kept mutants ({n_disc} discarded by the oracle) over "
          f"{len({k.source for k in gen.kept})} sources in {t_gen:.0f}s", flush=True)
    if args.no_score:
        return {"kept": len(gen.kept), "discarded": n_disc}
    return report(args, gen, t_gen)


def report(args: argparse.Namespace, gen: Gen, t_gen: float) -> dict[str, Any]:
    log = sys.stderr
    n_disc = sum(sum(c.values()) - c.get("site not run by the step", 0) for c in gen.discarded.values())
    cases = [k.case_dir for k in gen.kept] + gen.controls
    partial = open(args.json + ".partial.jsonl", "w") if args.json else None

    def on_row(r: dict) -> None:
        if partial is not None:
            partial.write(json.dumps(r, default=str) + "\n")
            partial.flush()
        if not args.quiet:
            print(f"{'PASS' if r.get('ok') else 'MISS'} {r['id']:44s} line={r.get('line_ok')} {r.get('s')}s "
                  f"{r.get('codes_seen', r.get('errors', ''))} {r.get('error', '')}", file=log, flush=True)

    from benchmarks.mutants.scoring import score

    t1 = time.perf_counter()
    rows = score(cases, args.tool, on_row=on_row)
    t_score = time.perf_counter() - t1
    by_id = {k.id: k for k in gen.kept}
    buggy = [r for r in rows if r.get("kind") == "buggy"]
    controls = [r for r in rows if r.get("kind") == "control"]
    for r in buggy:
        k = by_id[r["id"]]
        r.update(source=k.source, op=k.op, expected=k.expected)
    by_op: dict[str, list[dict]] = defaultdict(list, {op: [] for op in gen.discarded})
    by_src: dict[str, list[dict]] = defaultdict(list)
    for r in buggy:
        by_op[r["op"]].append(r)
        by_src[r["source"]].append(r)
    print("\n".join(table("operator", by_op, gen.discarded)))
    print()
    print("\n".join(table("source", by_src)))
    for name, why in gen.skipped_sources.items():
        print(f"source {name} skipped: {why}")
    print()
    for r in controls:
        if not r.get("ok"):
            print(f"FALSE ERROR on unmutated {r['id']}: {r.get('errors')} {r.get('error', '')}")
    hits = sum(bool(r.get("ok")) for r in buggy)
    lines = sum(bool(r.get("line_ok")) for r in buggy)
    clean = sum(bool(r.get("ok")) for r in controls)
    worst = min(((sum(bool(r.get("ok")) for r in rs) / len(rs), op) for op, rs in by_op.items() if rs), default=(1.0, "-"))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "discarded": {k: dict(v) for k, v in gen.discarded.items()},
                                               "skipped_sources": gen.skipped_sources}, indent=1, default=str))
    rate = len(buggy) / (t_score / 60) if t_score else 0.0
    if args.triage:
        from benchmarks.mutants.triage import write

        write(rows, args.triage, f"# Mutation bench triage ({len(buggy)} kept mutants; misses by operator and cause)")
    print(f"mutants: {len(buggy)} kept over {len(by_src)} sources ({len(by_op)} operators), {n_disc} discarded; controls clean "
          f"{clean}/{len(controls)}; generation {t_gen:.0f}s, scoring {t_score:.0f}s = {rate:.0f} mutants/min")
    print(f"recall {_pct(hits, len(buggy))}; right line {_pct(lines, len(buggy))} (of hits {_pct(lines, hits)}); "
          f"weakest operator {worst[1]} {worst[0]:.0%}")
    return {"kept": len(buggy), "hits": hits, "lines": lines, "controls": len(controls), "clean": clean,
            "sources": sorted(by_src), "operators": sorted(by_op), "discarded": n_disc, "rows": rows}
