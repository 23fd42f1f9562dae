"""The docs a newcomer reads stay true: inside the repository, generated where they can be, and runnable."""

from __future__ import annotations

import json
import re

import pytest

from conftest import ROOT

DOCS = ROOT / "docs"


def test_findings_md_is_generated_from_the_catalogue():
    from gradprobe.docgen import COMMAND, findings_markdown
    from gradprobe.findings import catalogue

    text = findings_markdown()
    assert all(f"### {code}" in text for code in catalogue())
    assert (DOCS / "findings.md").read_text() == text, f"docs/findings.md is stale: run `{COMMAND}`"


def test_readme_and_docs_stay_inside_the_repository():
    for page in [ROOT / "README.md", ROOT / "examples" / "clients" / "README.md", *DOCS.glob("*.md")]:
        text = page.read_text()
        assert "../shared" not in text and "/work/" not in text, f"{page.name} points outside the repository"
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if "://" in link:
                continue
            assert (page.parent / link).exists(), f"{page.name}: broken link {link}"
    readme = (ROOT / "README.md").read_text()
    assert "(docs/targets.md)" in readme and "(docs/findings.md)" in readme


@pytest.mark.anyio
async def test_tool_descriptions_point_to_the_target_docs(client):
    for tool in (await client.list_tools()).tools:
        assert "docs/targets.md" in tool.description, tool.name


def _worked_example() -> tuple[str, list[dict]]:
    text = (DOCS / "targets.md").read_text().split("## A worked example", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    targets = [json.loads(block)["target"] for block in re.findall(r"```json\n(.*?)```", text, re.S)]
    return code, targets


@pytest.mark.anyio
async def test_the_worked_example_in_targets_md_runs_as_written(client, tmp_path):
    """The dict-batch, custom-loss example: every target the page shows diagnoses it as healthy."""
    code, targets = _worked_example()
    (tmp_path / "tagger.py").write_text(code)
    assert len(targets) == 2
    for target in targets:
        target = json.loads(json.dumps(target).replace("/home/ana/proj", str(tmp_path)))
        r = await client.call_tool("diagnose", {"target": target})
        assert not r.is_error, r.content
        report = r.structured_content
        assert report["ok"] is True, report["findings"]
        assert "optimizer" in " ".join(report["facts"]["checks"]), report["facts"]["checks"]
        grads = {row["name"]: row["grad"] for row in report["facts"]["per_parameter"]}
        assert grads and set(grads.values()) == {"ok"}, grads


def test_the_worked_examples_library_call_runs_as_written():
    text = (DOCS / "targets.md").read_text().split("## A worked example", 1)[1].split("\n## ", 1)[0]
    code, call = re.findall(r"```python\n(.*?)```", text, re.S)[:2]
    namespace: dict = {}
    exec(compile(code + call, "tagger.py", "exec"), namespace)
    assert namespace["report"]["ok"] is True, namespace["report"]["findings"]
