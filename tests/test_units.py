"""Unit tests, layer by layer: the catalogue, ranking and folding, graph walks, patch-and-restore,
rendering, frame splitting, target validation and the tool table. No server, no child process."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from conftest import ROOT
from factories import catalogued_finding as make_finding
from gradprobe.findings import catalogue
from gradprobe.tools import TOOLS

SPEC = ROOT.parent / "shared" / "spec" / "findings.md"  # the steering spec, beside a checkout


# ---- the catalogue ---------------------------------------------------------------------------

def test_every_rule_is_complete_and_catalogue_needs_no_torch():
    rules = catalogue()
    for code, rule in rules.items():
        assert re.fullmatch(r"GP\d{3}", code)
        assert rule["severity"] in ("error", "warning", "info") and isinstance(rule["rank"], int)
        assert rule["summary"] and rule["fix"]
    code = "import sys, gradprobe.findings as f; f.catalogue(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not SPEC.exists(), reason="the shared spec is not on this machine")
def test_catalogue_holds_every_code_of_the_spec_table():
    """Every code the spec declares is ours with its name and severity (we may add proposed codes, never drop one)."""
    rows = re.findall(r"^\| (GP\d{3}) \| ([a-z0-9-]+) \| (error|warning|info)", SPEC.read_text(), re.M)
    spec = {code: (name, sev) for code, name, sev in rows}
    ours = {code: (r["name"], r["severity"]) for code, r in catalogue().items()}
    assert spec and {code: ours.get(code) for code in spec} == spec


# ---- ranking and folding ---------------------------------------------------------------------

def _f(code: str, params: list[str]) -> dict:
    return dict(make_finding(code, f"{code} on {params}", parameters=params))


def test_fold_ranks_root_causes_first_and_folds_what_they_explain():
    from gradprobe.checks.diagnosis import fold

    unregistered = _f("GP101", ["scale"])
    symptom = _f("GP301", ["scale"])
    other = _f("GP302", ["fc.weight"])
    loss = _f("GP310", [])  # a parameterless consequence
    info = _f("GP108", ["fc.weight"])
    kept = fold([info, loss, symptom, other, unregistered])
    assert [k["code"] for k in kept] == ["GP101", "GP302", "GP108"]
    related = [r["code"] for r in kept[0]["evidence"]["related"]]
    assert related == ["GP301", "GP310"]
    assert "related" not in kept[1]["evidence"]


def test_fold_keeps_a_lone_consequence_and_warnings_of_other_parameters():
    from gradprobe.checks.diagnosis import fold

    kept = fold([_f("GP306", ["a"]), _f("GP310", [])])
    assert [k["code"] for k in kept] == ["GP310", "GP306"]


def test_rank_comes_from_the_rule():
    from gradprobe.checks.diagnosis import _rank

    assert _rank(_f("GP101", ["x"])) < _rank(_f("GP302", ["x"])) < _rank(_f("GP301", ["x"]))
    assert _rank(_f("GP000", [])) < _rank(_f("GP100", []))


# ---- graph walks -----------------------------------------------------------------------------

def test_reach_and_chain_walk_the_real_autograd_graph():
    from gradprobe.checks.trace.graphwalk import chain, reach
    from gradprobe.checks.trace.candidates import Candidate

    w, v = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    h = (w * 2).exp() + 1
    cut = Candidate(0, "detach", "detach", None, True, [h], True, None)
    leaf = Candidate(1, "detach", "detach", None, True, [v], True, None)
    hit = reach([cut, leaf], {id(w), id(v)})
    assert hit == {0: {id(w)}, 1: {id(v)}}
    loc = {"file": "/p/model.py", "line": 7, "function": "forward", "code": "h = (w * 2).exp() + 1"}
    tracer = SimpleNamespace(grad_fn_loc={id(h.grad_fn): loc, id(h.grad_fn.next_functions[0][0]): loc})
    assert chain(cut, id(w), tracer) == [loc]
    assert chain(cut, id(v), tracer) == []  # v is not behind h


# ---- patch and restore -----------------------------------------------------------------------

def test_patched_restores_attributes_and_mapping_items_even_on_error():
    from gradprobe.checks.core.watches import patched

    ns = SimpleNamespace(f=1)
    table = {"k": "old"}
    with pytest.raises(RuntimeError), patched(ns, "f", 2) as old_f, patched(table, "k", "new") as old_k:
        assert (ns.f, table["k"], old_f, old_k) == (2, "new", 1, "old")
        raise RuntimeError
    assert ns.f == 1 and table["k"] == "old"

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

    class Sub(Fn):
        pass

    with patched(Fn, "forward", staticmethod(lambda ctx, x: x + 1)), patched(Sub, "forward", staticmethod(lambda ctx, x: x)):
        assert "forward" in vars(Sub)
    assert isinstance(vars(Fn)["forward"], staticmethod) and "forward" not in vars(Sub)


def test_tracer_leaves_torch_as_it_found_it():
    from gradprobe.checks.trace.recording import GradTracer
    from gradprobe.userframes import UserCode

    before = (torch.from_numpy, torch.Tensor.__reduce_ex__, torch.inference_mode.__enter__)
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError), GradTracer(model, UserCode(str(ROOT / "tests"))):
        model(torch.ones(1, 2)).sum().backward()
        raise ValueError
    assert (torch.from_numpy, torch.Tensor.__reduce_ex__, torch.inference_mode.__enter__) == before


# ---- the step runner -------------------------------------------------------------------------

def test_step_result_says_why_the_default_step_had_no_loss():
    from gradprobe.checks.core.step import run_step
    from gradprobe.userframes import UserCode

    class Vector(nn.Module):
        def forward(self, x):
            return x.sum(-1)  # not a parameter in sight, and not a scalar

    loaded = SimpleNamespace(model=Vector(), batch=torch.ones(2, 3), loss_fn=lambda out, b: out, optimizer=None,
                             train_step=None, user=UserCode(str(ROOT)))
    r = run_step(loaded, optimizer_step=False)
    assert r.kind == "default" and r.failed and r.error is None
    assert r.loss_problem and "not a scalar" in r.loss_problem and r.loss_evidence == {"shape": [2]}


# ---- rendering, frames, targets, tools -------------------------------------------------------

def test_render_text_names_code_location_and_fix():
    from gradprobe.render import render_text
    from gradprobe.report import make_report

    f = make_finding("GP302", "cut here", parameters=["fc.weight"],
                     location={"file": "/p/model.py", "line": 12, "function": "forward", "code": "x = x.detach()"})
    text = render_text(make_report("trace_grad_path", [f], ["1 parameter"]))
    assert "GP302" in text and "model.py:12" in text and catalogue()["GP302"]["fix"].splitlines()[0] in text


def test_split_frames_keeps_the_incomplete_rest():
    from gradprobe.sandbox.zygote import split_frames

    def frame(obj):
        data = json.dumps(obj).encode()
        return struct.pack("!I", len(data)) + data

    whole = frame({"a": 1}) + frame({"b": [2]})
    third = frame({"c": "x" * 50})
    msgs, rest = split_frames(whole + third[:10])
    assert msgs == [{"a": 1}, {"b": [2]}] and rest == third[:10]
    msgs, rest = split_frames(rest + third[10:])
    assert msgs == [{"c": "x" * 50}] and rest == b""


def test_target_validation_rejects_what_the_caller_can_fix(tmp_path):
    from pydantic import ValidationError

    from gradprobe.target import Target

    with pytest.raises(ValidationError, match="give `model`"):
        Target(project_dir=str(tmp_path))
    with pytest.raises(ValidationError, match="not a reference"):
        Target(project_dir=str(tmp_path), model="a.py:")
    with pytest.raises(ValidationError, match="device"):
        Target(project_dir=str(tmp_path), model="a.py", device="tpu")
    with pytest.raises(ValueError, match="not found"):
        Target(project_dir=str(tmp_path), model="a.py").check_paths()
    with pytest.raises(ValueError, match="absolute"):
        Target(project_dir="rel", model="a.py").check_paths()
    (tmp_path / "a.py").write_text("")
    Target(project_dir=str(tmp_path), model="a.py:build").check_paths()


def test_the_tool_table_is_what_every_layer_reads():
    from gradprobe.cli import main

    for tool in TOOLS:
        assert callable(tool.check_function())
        assert (ROOT / "gradprobe" / "server" / "tools" / f"{tool.name}.py").exists()
    assert [t.name for t in TOOLS if t.allows_meta] == ["inspect_parameters"]
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0


def test_build_recorder_exits_once_and_restores_torch():
    """Script mode pauses recording (an explicit __exit__) and its `with` exits again: the second exit is a no-op."""
    from gradprobe.loading import BuildRecord, BuildRecorder
    from gradprobe.userframes import UserCode

    before = (torch.Tensor.__dict__.get("requires_grad_"), nn.Module.__setattr__, nn.Parameter.__dict__.get("requires_grad"))
    rec = BuildRecorder(UserCode(str(ROOT)), BuildRecord())
    with rec:
        assert torch.Tensor.__dict__.get("requires_grad_") is not None
        rec.__exit__(None, None, None)
    after = (torch.Tensor.__dict__.get("requires_grad_"), nn.Module.__setattr__, nn.Parameter.__dict__.get("requires_grad"))
    assert after == before
    torch.zeros(2).requires_grad_(True)  # the C method shows through again
