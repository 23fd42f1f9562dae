"""The docs a newcomer reads stay true: inside the repository, generated where they can be, and runnable."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT

DOCS = ROOT / "docs"
PACKAGE = ROOT / "gradprobe"
CODE = re.compile(r"\bGP\d{3}\b")
RANGE = re.compile(r"\b(GP\d{3})\s*[–-]\s*(GP\d{3})\b")
FAMILY = re.compile(r"\bGP(\d)xx\b")


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rule_names(trees: dict[Path, ast.Module]) -> dict[str, str]:
    """Variable -> code for every `NAME = Rule(code="GPnnn", ...)` (annotated or not) in the package."""
    out: dict[str, str] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) else None
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Rule":
                code = [kw.value.value for kw in value.keywords if kw.arg == "code" and isinstance(kw.value, ast.Constant)]
                if code:
                    out[target.id] = code[0]
    return out


def emitted_codes() -> dict[str, set[str]]:
    """Code -> the modules that emit it: a `GP302.finding(...)` call, or a detector registered with `@GP302.detector`
    (whose findings a shared helper may build through the rule object it is handed)."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in _sources()}
    names = _rule_names(trees)
    out: dict[str, set[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for deco in node.decorator_list:
                    if isinstance(deco, ast.Attribute) and deco.attr == "detector" and isinstance(deco.value, ast.Name):
                        if deco.value.id in names:
                            out.setdefault(names[deco.value.id], set()).add(str(path.relative_to(ROOT)))
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            code = None
            if isinstance(func, ast.Attribute) and func.attr == "finding" and isinstance(func.value, ast.Name):
                code = names.get(func.value.id, func.value.id if CODE.fullmatch(func.value.id) else None)
            if code:
                out.setdefault(code, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_catalogued_code_is_emitted_by_a_rule():
    """A code documented in the catalogue but emitted by no rule is a promise the tools do not keep."""
    from gradprobe.findings import catalogue

    emitted = emitted_codes()
    missing = [code for code in catalogue() if code not in emitted]
    assert not missing, f"catalogued but never emitted (no `CODE.finding(` in gradprobe/): {missing}"


def test_every_code_in_the_source_is_catalogued():
    """A code emitted (or quoted in a message, a description, a comment) but not documented fails."""
    from gradprobe.findings import catalogue

    known = set(catalogue())
    unknown = {f"{path.relative_to(ROOT)}:{n}": code
               for path in _sources() for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               for code in CODE.findall(line) if code not in known}
    assert not unknown, f"codes not in the catalogue: {unknown}"
    assert set(emitted_codes()) <= known


@pytest.mark.parametrize("page", ["README.md", "docs/tools.md"])
def test_the_readme_quotes_the_catalogues_codes_and_ranges(page):
    """The tool tables (README's short one, docs/tools.md's full one): each tool's codes are its family's range in the
    catalogue (gradprobe.tools.code_range)."""
    from gradprobe.findings import catalogue
    from gradprobe.tools import NAMES, code_range, family_of

    readme = (ROOT / page).read_text()
    known = set(catalogue())
    assert set(CODE.findall(readme)) <= known, set(CODE.findall(readme)) - known
    rows = dict(re.findall(r"^\| `(\w+)` \|.*\| ([^|]+?) \|$", readme, re.M))
    assert set(NAMES) <= set(rows), f"{page}'s tool table lacks {set(NAMES) - set(rows)}"
    stale = {name: (rows[name], code_range(name)) for name in NAMES if rows[name] != code_range(name)}
    assert not stale, f"{page}'s tool table (quoted, catalogue): {stale}"
    for first, last in RANGE.findall(readme):
        tool = family_of(first)
        assert tool is not None and f"{first}–{last}" == code_range(tool), f"{page} quotes {first}–{last}"
    families = {code[:3] for code in known}
    assert {f"GP{d}" for d in FAMILY.findall(readme)} <= families


@pytest.mark.anyio
async def test_tool_descriptions_quote_their_own_codes(client):
    """What the model reading tools/list sees: codes that exist, of the tool's own family, ranges from the catalogue."""
    from gradprobe.findings import catalogue
    from gradprobe.tools import BY_NAME, code_range, family_of

    known = set(catalogue())
    for tool in (await client.list_tools()).tools:
        text, family = tool.description or "", BY_NAME[tool.name].family
        quoted = set(CODE.findall(text))
        assert quoted <= known, (tool.name, quoted - known)
        if family is not None:
            assert all(family_of(code) == tool.name for code in quoted), (tool.name, sorted(quoted))
            assert {f"GP{d}" for d in FAMILY.findall(text)} <= {family}, tool.name
        for first, last in RANGE.findall(text):
            assert f"{first}–{last}" == code_range(family_of(first) or tool.name), (tool.name, first, last)


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


FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "examples").rglob("README.md"))]


def _prose(text: str) -> str:
    """A page without its code blocks, inline code and HTML comments (a `[x](y)` or a `# line` there is no link or heading)."""
    text = re.sub(r"<!--.*?-->", "", FENCE.sub("", text), flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_link_in_the_readme_and_docs_resolves():
    """Each relative link or image of the README, docs/ and the examples' READMEs names a file that exists, and an
    anchor (`page.md#part`, `#part`) names a heading of that page."""
    broken = []
    for page in _pages():
        for link in LINK.findall(_prose(page.read_text())):
            if "://" in link or link.startswith("mailto:"):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path) if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading in {target.name})")
    assert not broken, broken


def test_the_readme_links_every_docs_page():
    """The README is the front door: every page of docs/ is reachable from its "Where to read more"."""
    more = (ROOT / "README.md").read_text().split("## Where to read more", 1)[1].split("\n## ", 1)[0]
    linked = {Path(link.partition("#")[0]).name for link in LINK.findall(more) if link.startswith("docs/")}
    missing = sorted(page.name for page in DOCS.glob("*.md") if page.name not in linked)
    assert not missing, f"docs pages the README's 'Where to read more' does not link: {missing}"


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
