"""Several models trained by one script (issue 41), through the real server: every module an optimizer holds or the
loss reaches is found by identity and checked, each named after the script's own variable (`text_encoder.…`,
`unet.…`, `netD.…`); GP202 only for a tensor no live module holds; frozen models beside the trained ones (a VAE, a
teacher under no_grad) are said and measured, never reported missing from an optimizer; and no report contradicts
itself (tests/report_consistency.py). The build_model() form may return several modules (a tuple, list or dict)."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, ROOT, line_of, one_finding
from report_consistency import assert_consistent, contradictions

SCRIPTS = ROOT / "examples" / "scripts"


async def _script(client, project: str, args: list[str], tool: str = "diagnose", steps: int | None = 3) -> dict:
    target = {"project_dir": str(SCRIPTS / project), "script": "train.py", "args": args, "timeout_s": 600}
    options = {"steps": steps} if steps else {}
    result = await client.call_tool(tool, {"target": target, **options})
    assert not result.is_error, result.content
    report = result.structured_content
    assert not [f for f in report["findings"] if f["code"] == "GP000"], report["findings"]
    assert_consistent(report, project)
    return report


def _errors(report: dict) -> list[tuple[str, str]]:
    return [(f["code"], f["message"][:200]) for f in report["findings"] if f["severity"] == "error"]


def _models(report: dict) -> dict[str, str]:
    return {m["name"]: m["role"] for m in report["facts"]["script_step"]["models"]}


T2I = ["--max_train_steps=8"]


@pytest.mark.anyio
async def test_unet_and_text_encoder_lora_under_one_optimizer_is_clean(client):
    """The issue's own report: one AdamW, two groups, LoRA on the UNet and on the text encoder. It said "64 of 64 ...
    moved" and GP202 about the text encoder's 16 tensors; now both models are the model, named, and all 80 train."""
    report = await _script(client, "several_t2i_lora", T2I)
    assert report["ok"] and not [f for f in report["findings"] if f["code"] in ("GP201", "GP202")], _errors(report)
    assert _models(report) == {"unet": "trained", "text_encoder": "trained", "vae": "frozen"}
    steps = report["facts"]["steps"]
    assert steps["headline"].startswith("Over 3 step(s) (3 optimizer step(s)): 80 of 80 trainable"), steps["headline"]
    rows = {r["name"]: r for r in steps["per_parameter"]}
    te = [n for n in rows if n.startswith("text_encoder.") and rows[n]["requires_grad"]]
    assert len(te) == 16 and all(rows[n]["verdict"] == "ok" for n in te), te
    assert [g["tensors"] for g in steps["param_groups"]] == [64, 16]
    assert [max(g["with_gradient_at_step"]) for g in steps["param_groups"]] == [64, 16]
    traced = [r for r in report["facts"]["per_parameter"] if r["name"].startswith("text_encoder.")]
    assert len(traced) == 16 and all(r["grad"] == "ok" for r in traced), traced  # the replay reaches it through the UNet
    assert "Models: 2 trained together" in report["summary"] and "vae (AutoencoderKL" in report["summary"]


@pytest.mark.anyio
async def test_text_encoder_lora_left_out_of_the_optimizer_is_named(client):
    report = await _script(client, "several_t2i_lora_te_left_out", T2I)
    f = one_finding(report["findings"], "GP201")
    path = SCRIPTS / "several_t2i_lora_te_left_out" / "train.py"
    assert f["severity"] == "error" and f["location"]["line"] == line_of(path, "optimizer = torch.optim.AdamW(")
    assert len(f["parameters"]) == 16 and all(n.startswith("text_encoder.") for n in f["parameters"]), f["parameters"]
    assert not [g for g in report["findings"] if g["code"] == "GP202"]
    assert "64 of 80 trainable" in report["facts"]["steps"]["headline"]


@pytest.mark.anyio
async def test_text_encoder_rebuilt_after_the_optimizer_is_stale(client):
    """A real rebuild: the optimizer's 16 tensors belong to no live module, GP202 at the line that loaded the text
    encoder again, naming what they were; the new adapters' GP201/GP606 are its consequences, folded into it."""
    report = await _script(client, "several_t2i_lora_te_rebuilt", T2I)
    f = one_finding(report["findings"], "GP202")
    path = SCRIPTS / "several_t2i_lora_te_rebuilt" / "train.py"
    assert f["location"]["line"] == line_of(path, 'text_encoder = load_text_encoder()  # "resume"')
    assert len(f["parameters"]) == 16 and all(n.startswith("text_encoder.") for n in f["parameters"])
    assert "text_encoder.load_state_dict(" in f["fix"], f["fix"]
    assert not [g for g in report["findings"] if g["code"] in ("GP201", "GP606") and g["severity"] == "error"]


@pytest.mark.anyio
async def test_dcgan_two_optimizers_is_clean_and_names_both_networks(client):
    report = await _script(client, "several_dcgan", ["--niter=10"])
    assert report["ok"], _errors(report)
    assert _models(report) == {"netG": "trained", "netD": "trained"}
    rows = report["facts"]["steps"]["per_parameter"]
    assert {r["name"].split(".")[0] for r in rows} == {"netG", "netD"} and all(r["verdict"] == "ok" for r in rows), rows
    assert "6 of 6 trainable" in report["facts"]["steps"]["headline"]


@pytest.mark.anyio
async def test_dcgan_discriminator_optimizer_never_stepped(client):
    report = await _script(client, "several_dcgan_d_never_stepped", ["--niter=10"])
    f = one_finding(report["findings"], "GP213")
    assert sorted(f["parameters"]) == ["netD.main.0.weight", "netD.main.2.weight"], f["parameters"]
    path = SCRIPTS / "several_dcgan_d_never_stepped" / "train.py"
    assert f["location"]["line"] == line_of(path, "errD_real.backward()")
    assert f["evidence"]["optimizer_built_at"]["line"] == line_of(path, "optimizerD = torch.optim.Adam(")
    assert not [g for g in report["findings"] if g["code"] in ("GP207", "GP606") and g["severity"] == "error"]


@pytest.mark.anyio
async def test_dcgan_generator_optimizer_over_the_discriminator(client):
    """The generator's optimizer built over netD's parameters: the two optimizers share them (GP210, at the second
    optimizer's line), and the generator, which the loss reaches only after the first step, never moves (GP606)."""
    report = await _script(client, "several_dcgan_g_opt_over_d", ["--niter=10"])
    path = SCRIPTS / "several_dcgan_g_opt_over_d" / "train.py"
    shared = one_finding(report["findings"], "GP210")
    assert shared["location"]["line"] == line_of(path, "optimizerG = torch.optim.Adam(netD")
    assert sorted(shared["parameters"]) == ["netD.main.0.weight", "netD.main.2.weight"]
    still = one_finding(report["findings"], "GP606")
    assert sorted(still["parameters"]) == ["netG.main.0.weight", "netG.main.1.bias", "netG.main.1.weight",
                                           "netG.main.3.weight"]


@pytest.mark.anyio
async def test_distillation_teacher_under_no_grad_is_frozen_by_design(client):
    report = await _script(client, "several_distill", ["--steps=10"])
    assert report["ok"] and not [f for f in report["findings"] if f["code"] == "GP201"], _errors(report)
    assert _models(report) == {"student": "trained", "regressor": "trained", "teacher": "frozen"}
    frozen = report["facts"]["steps"]["script_step"]["frozen_models"]
    assert frozen == [{"name": "teacher", "class": "Net", "tensors": 4, "trainable": 4, "changed_over_steps": 0,
                       "no_grad_only": True}], frozen
    assert any(v.startswith("teacher (Net, 4 tensors, 4 with requires_grad): used under no_grad only")
               for v in report["facts"]["steps"]["verified"])


@pytest.mark.anyio
async def test_distillation_regressor_left_out_of_the_optimizer(client):
    report = await _script(client, "several_distill_regressor_left_out", ["--steps=10"])
    f = one_finding(report["findings"], "GP201")
    path = SCRIPTS / "several_distill_regressor_left_out" / "train.py"
    assert f["severity"] == "error" and sorted(f["parameters"]) == ["regressor.bias", "regressor.weight"]
    assert f["location"]["line"] == line_of(path, "optimizer = torch.optim.SGD(")


@pytest.mark.anyio
async def test_other_tools_name_every_model(client):
    """audit_training alone, and the one-step tools, see the same models under the same names."""
    audit = await _script(client, "several_dcgan", ["--niter=10"], tool="audit_training", steps=3)
    assert audit["ok"] and {m["name"] for m in audit["facts"]["script_step"]["models"]} == {"netG", "netD"}
    assert "Models: 2 trained together" in audit["summary"]
    coverage = await _script(client, "several_distill_regressor_left_out", ["--steps=10"],
                             tool="check_optimizer_coverage", steps=None)
    assert one_finding(coverage["findings"], "GP201")["parameters"] == ["regressor.weight", "regressor.bias"]
    trace = await _script(client, "several_distill", ["--steps=10"], tool="trace_grad_path", steps=None)
    names = {r["name"] for r in trace["facts"]["per_parameter"]}
    assert {"student.head.weight", "regressor.weight"} <= names and not [n for n in names if n.startswith("teacher")]


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["gp201_several_models_regressor_left_out.py", "healthy_several_models_distill.py"])
async def test_build_model_returning_a_dict_of_models(client, name):
    """build_model() returns {"student", "regressor", "teacher"}: the names are the dict's keys; the user's
    make_optimizer and train_step get the dict back; the teacher under no_grad is frozen by design."""
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": name}, "steps": 3})
    report = result.structured_content
    assert_consistent(report, name)
    assert not [f for f in report["findings"] if f["code"] == "GP201" and any(p.startswith("teacher") for p in f["parameters"])]
    assert "teacher (4 tensors with requires_grad) is in no optimizer" in report["facts"]["steps"]["headline"]


@pytest.mark.anyio
async def test_build_model_returning_a_tuple_names_models_by_class(client):
    setup = ("class Enc(nn.Module):\n    def __init__(self):\n        super().__init__(); self.lin = nn.Linear(4, 3)\n"
             "    def forward(self, x):\n        return self.lin(x)\n"
             "model = (Enc(), nn.Linear(3, 2))\n"
             "inputs = torch.randn(5, 4)\n"
             "optimizer = lambda models: torch.optim.SGD(models[1].parameters(), lr=0.1)\n"
             "def train_step(models, batch, optimizer):\n"
             "    enc, head = models\n"
             "    loss = head(enc(batch)).pow(2).mean()\n"
             "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
             "    return loss\n")
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "setup": setup}})
    report = result.structured_content
    f = one_finding(report["findings"], "GP201")
    assert f["severity"] == "error" and sorted(f["parameters"]) == ["Enc.lin.bias", "Enc.lin.weight"], f
    assert_consistent(report, "tuple")


def test_the_consistency_helper_flags_the_issue_41_report():
    """The report issue 41 quotes: "64 of 64 ... moved", the text encoder's group of 16 with gradients at every step,
    and GP202 calling 16 of the optimizer's tensors stale. The helper must say so (it is what every test above runs)."""
    rows = [{"name": f"down.{i}.lora_A.weight", "in_optimizer": True, "verdict": "ok", "requires_grad": True}
            for i in range(64)]
    report = {"ok": False, "summary": "GP202 stale-optimizer-reference: ...",
              "findings": [{"code": "GP202", "severity": "error", "parameters": [],
                            "evidence": {"stale_tensors": [{"shape": [4, 16], "likely_was": None}] * 16}}],
              "facts": {"steps": {"headline": "Over 3 step(s) (3 optimizer step(s)): 64 of 64 trainable ...",
                                  "per_parameter": rows,
                                  "param_groups": [{"tensors": 64, "with_gradient_at_step": [64, 64, 64]},
                                                   {"tensors": 16, "with_gradient_at_step": [16, 16, 16]}]}}}
    found = contradictions(report)
    assert found and "16 of the 80 tensors the optimizers hold are stale" in found[0], found
    report["findings"][0]["parameters"] = ["down.3.lora_A.weight"]
    assert any("the steps say they trained" in c for c in contradictions(report))
    report["ok"] = True
    assert any(c.startswith("ok=True beside 1 error") for c in contradictions(report))
