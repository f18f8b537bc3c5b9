"""Tools: the registry's validation, the jail, and the basic file and search tools."""

import os

import pytest

from xzatoma_tools import (PLANNING, WRITE_MODE, JailError, ToolContext, ToolResult, build_registry,
                           glob_match, path_verdict, resolve_path)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return 1  # TODO\n")
    (root / "src" / "pkg" / "util.py").write_text("def helper():\n    pass\n")
    (root / "README.md").write_text("# Title\nTODO: write\n")
    (root / "data.bin").write_bytes(b"\x00\x01\x02binary")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("generated\n")
    (root / "debug.log").write_text("TODO in log\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    os.symlink(outside / "secret.txt", root / "link_out")
    os.symlink(root / "src", root / "link_in")
    os.symlink(outside, root / "dir_out")
    os.symlink(root / "nowhere", root / "dangling")
    os.symlink(root / "loop_a", root / "loop_b")
    os.symlink(root / "loop_b", root / "loop_a")
    os.symlink(root / "link_out", root / "chain_out")
    return root


def registry(root, mode=WRITE_MODE, **config):
    return build_registry(mode, ToolContext(str(root), config))


@pytest.mark.parametrize("path,verdict", [
    (".", "inside"), ("src/app.py", "inside"), ("src/../README.md", "inside"), ("link_in/app.py", "inside"),
    ("new/file.txt", "inside"), ("dangling", "inside"), ("%2e%2e/outside", "inside"),
    ("..", "outside"), ("../outside/secret.txt", "outside"), ("/etc/passwd", "outside"),
    ("~/x", "outside"), ("~", "outside"), ("link_out", "outside"), ("dir_out/secret.txt", "outside"),
    ("chain_out", "outside"), ("link_in/../../outside", "outside"), ("src/\x00x", "outside"),
])
def test_jail(tree, path, verdict):
    assert path_verdict(path, str(tree))[0] == verdict


def test_jail_loops_do_not_crash(tree):
    verdict, _ = path_verdict("loop_a", str(tree))
    assert verdict in ("inside", "outside")


def test_absolute_path_inside_is_allowed(tree):
    assert resolve_path(str(tree / "src" / "app.py"), os.path.realpath(str(tree))).endswith("app.py")


def test_registry_validates_and_never_raises(tree):
    reg = registry(tree)
    assert reg.execute("read_file", '{"path": ["a"]}').to_message() == \
        "Error: parameter 'path' must be a string, got array"
    r = reg.execute("read_file", '{"path": "src/app.py", "start_line": "2"}')
    assert r.success and r.output.startswith("\ndef main")
    assert reg.execute("read_file", "[1]").to_message() == "Error: arguments for read_file must be a JSON object, got array"
    assert reg.execute("read_file", '{"path": "src/app.py", "start_line": 0}').to_message() == \
        "Error: parameter 'start_line' must be at least 1"
    assert reg.execute("grep", '{"pattern": "x", "case_sensitive": "maybe"}').error.startswith(
        "parameter 'case_sensitive' must be true or false")


def test_planning_registry(tree):
    reg = registry(tree, PLANNING)
    assert "write_file" not in reg and "read_file" in reg
    assert reg.execute("write_file", {"path": "a", "content": "b"}).to_message() == \
        "Error: tool write_file is not available in planning mode"
    assert not (tree / "a").exists()


def test_output_is_truncated_with_a_note(tree):
    (tree / "big.txt").write_text("y" * 5000)
    r = registry(tree, max_output_size=1024).execute("read_file", {"path": "big.txt"})
    assert r.truncated and len(r.output) == 1024
    assert r.to_message().endswith("[Note: output truncated at 1024 of 5000 bytes]")


def test_read_file_ranges_and_refusals(tree):
    reg = registry(tree)
    assert reg.execute("read_file", {"path": "src/app.py", "start_line": 3, "end_line": 3}).output == "def main():\n"
    assert reg.execute("read_file", {"path": "data.bin"}).error.startswith("data.bin is a binary file")
    assert reg.execute("read_file", {"path": "src"}).error == "src is a directory; use list_directory"
    assert reg.execute("read_file", {"path": "src/ap.py"}).error == \
        "no such file or directory: src/ap.py (did you mean src/app.py?)"
    assert reg.execute("read_file", {"path": "link_out"}).error == "path outside working directory: link_out"
    assert "past the end" in reg.execute("read_file", {"path": "src/app.py", "start_line": 50}).error


def test_read_file_large_file_returns_head_and_how_to_continue(tree):
    (tree / "long.txt").write_text("".join("line %d\n" % i for i in range(1, 5001)))
    r = registry(tree).execute("read_file", {"path": "long.txt"})
    assert r.output.startswith("line 1\n") and "Showing lines 1-2000 of 5000" in r.output
    assert "start_line=2001" in r.output


def test_write_and_edit(tree):
    reg = registry(tree)
    r = reg.execute("write_file", {"path": "new/dir/f.txt", "content": "a\nb\na\n"})
    assert r.output == "Created new/dir/f.txt (6 bytes)"
    assert reg.execute("write_file", {"path": "new/dir/f.txt", "content": "a\nb\na\n"}).output.startswith("Overwrote")
    err = reg.execute("edit_file", {"path": "new/dir/f.txt", "old_text": "a", "new_text": "c"}).error
    assert err == "old_text occurs 2 times in new/dir/f.txt (lines 1, 3); include more context or set replace_all"
    r = reg.execute("edit_file", {"path": "new/dir/f.txt", "old_text": "b\n", "new_text": "B\n"})
    assert "-b\n+B\n" in r.output and (tree / "new/dir/f.txt").read_text() == "a\nB\na\n"
    assert "not found" in reg.execute("edit_file", {"path": "new/dir/f.txt", "old_text": "zz", "new_text": ""}).error
    assert reg.execute("write_file", {"path": "link_out", "content": "x"}).error.startswith("path outside")
    assert (tree.parent / "outside" / "secret.txt").read_text() == "secret\n"


def test_list_directory_and_gitignore(tree):
    reg = registry(tree)
    flat = reg.execute("list_directory", {}).output
    assert "src/" in flat and "README.md" in flat
    deep = reg.execute("list_directory", {"recursive": True}).output
    assert "src/pkg/util.py" in deep and "build/out.py" not in deep and "debug.log" not in deep
    assert "secret" not in deep
    py = reg.execute("list_directory", {"pattern": "**/*.py"}).output.splitlines()
    assert [l.split()[-1] for l in py] == ["src/app.py", "src/pkg/util.py"]


def test_find_path_pages(tree):
    reg = registry(tree)
    r = reg.execute("find_path", {"glob": "**/*.py", "limit": 1})
    assert r.output == "showing 1-1 of 2\nsrc/app.py"
    assert reg.execute("find_path", {"glob": "*.{md,py}", "offset": 1}).output.startswith("showing 2-3 of 3")


def test_grep(tree):
    reg = registry(tree)
    out = reg.execute("grep", {"pattern": "TODO"}).output.splitlines()
    assert out == ["README.md:2: TODO: write", "src/app.py:4:     return 1  # TODO"]
    assert reg.execute("grep", {"pattern": "todo", "case_sensitive": False, "include": "*.md"}).output == \
        "README.md:2: TODO: write"
    r = reg.execute("grep", {"pattern": "def", "max_results": 1})
    assert "stopped at 1 results; 1 more matches not shown" in r.output
    assert "invalid regular expression" in reg.execute("grep", {"pattern": "("}).error
    assert reg.execute("grep", {"pattern": "((", "fixed_string": True}).output == "no matches for (("
    ctx = reg.execute("grep", {"pattern": "main", "context_lines": 1}).output.splitlines()
    assert ctx == ["src/app.py-2- ", "src/app.py:3: def main():", "src/app.py-4-     return 1  # TODO"]


def test_plan_tool(tree):
    (tree / "p.yaml").write_text("goal: G\ninstructions: [a, b]\n")
    (tree / "bad.yaml").write_text("goal: G\n")
    reg = registry(tree, PLANNING)
    assert reg.execute("plan", {"path": "p.yaml"}).output == "GOAL: G\nINSTRUCTIONS:\n1. a\n2. b"
    assert reg.execute("plan", {"path": "bad.yaml"}).error == "bad.yaml: missing required key 'instructions' (a list of steps)"


@pytest.mark.parametrize("pattern,path,match", [
    ("*.py", "src/a.py", True), ("*.py", "a.pyc", False), ("**/*.md", "README.md", True),
    ("**/*.md", "docs/x/y.md", True), ("src/**/*.{rs,toml}", "src/a/b/c.toml", True),
    ("src/*.py", "src/pkg/a.py", False), ("src/?.py", "src/a.py", True), ("[ab].txt", "c.txt", False),
])
def test_glob(pattern, path, match):
    assert glob_match(pattern, path) is match


def test_tool_result_message_forms():
    assert ToolResult.fail("boom").to_message() == "Error: boom"
    assert ToolResult.ok("fine").to_message() == "fine"
    assert ToolResult.ok("a\nb\nc").preview() == "a  (+2 lines)"
