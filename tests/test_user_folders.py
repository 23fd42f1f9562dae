"""A user's project under a folder named `gradprobe` is the user's code (issue 26, item 7): gradprobe's own frames are
told by the installed package's directory, never by a name in the path."""

from __future__ import annotations

import shutil

import pytest

from conftest import EXAMPLES
from gradprobe.userframes import PACKAGE_DIR, UserCode, is_gradprobe_file


def test_own_files_are_told_by_the_package_directory(tmp_path):
    user_file = tmp_path / "gradprobe" / "proj" / "case.py"
    user_file.parent.mkdir(parents=True)
    user_file.write_text("x = 1\n")
    assert not is_gradprobe_file(str(user_file))
    assert is_gradprobe_file(f"{PACKAGE_DIR}/checks/trace/recording.py")
    assert not is_gradprobe_file(f"{PACKAGE_DIR}/demo/broken_model.py")  # the bundled demo is user code
    assert UserCode(str(user_file.parent)).is_user_file(str(user_file))


@pytest.mark.anyio
async def test_no_grad_bug_in_a_folder_named_gradprobe_is_the_users(client, tmp_path):
    project = tmp_path / "gradprobe" / "proj"
    project.mkdir(parents=True)
    shutil.copy(EXAMPLES / "gp303_no_grad_block.py", project / "case.py")
    result = await client.call_tool("trace_grad_path", {"target": {"project_dir": str(project), "model": "case.py"}})
    sc = result.structured_content
    hits = [f for f in sc["findings"] if f["code"] == "GP303"]
    assert hits, sc["findings"]
    f = hits[0]
    assert f["severity"] == "error", f
    assert f["location"]["file"].endswith("gradprobe/proj/case.py") and f["location"]["line"] == 15, f["location"]
    assert "no_grad_entered_by" not in f["evidence"] and "by design" not in f["message"], f
    assert sc["ok"] is False
