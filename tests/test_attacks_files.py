"""Attacks on the file tools beyond issue 12's list: tool calls from the fake model, harmless payloads."""

import os

import pytest

from conftest import tool_call
from test_file_safety import HEADLESS, outside, run_calls, snapshot  # noqa: F401 (outside is a fixture)


@pytest.mark.parametrize("config,path", [
    ("[core]\n\thooksPath = tools/hooks\n", "tools/hooks/pre-commit"),
    ('[core]\n\thooksPath = "./tools/hooks/"\n', "tools/hooks/post-checkout"),
    ("[core]\n\tfsmonitor = tools/fsmon.sh\n", "tools/fsmon.sh"),
    ("[core]\n\tpager = ./bin/pager\n", "bin/pager"),
    ("[diff \"x\"]\n\ttextconv = bin/conv\n", "bin/conv"),
    ("[filter \"lfs\"]\n\tclean = scripts/clean.sh %f\n", "scripts/clean.sh"),
    ("[CORE]\n\tHooksPath=tools/hooks\n", "tools/hooks/pre-push"),
])
def test_programs_git_config_names_inside_the_tree_are_protected(cli, fake, config, path):
    """git runs what its config names: an in-tree hooks directory or program is as dangerous as .git/hooks."""
    work = cli.workdir
    (work / ".git").mkdir()
    (work / ".git" / "config").write_text(config)
    cli.use(fake)
    before = snapshot(work)
    r, results = run_calls(cli, fake, [tool_call("write_file", path=path, content="#!/bin/sh\ntouch pwned\n")])
    assert r.returncode == 0, r.stderr
    assert results[0].startswith("Error: ") and results[0].endswith(HEADLESS), results[0]
    assert snapshot(work) == before


@pytest.mark.parametrize("layout", ["gitdir-file", "nested-config", "worktree-commondir", "enclosing"])
def test_nested_and_enclosing_repositories_keep_their_hooks(cli, fake, layout):
    """A vendored clone's `.git` file naming meta2/, its own core.hooksPath, a worktree's common gitdir,
    and the repository around the working directory naming hooks inside it."""
    work = cli.workdir
    path = "meta2/hooks/pre-commit"
    if layout == "gitdir-file":
        (work / "meta2" / "hooks").mkdir(parents=True)
        (work / "sub").mkdir()
        (work / "sub" / ".git").write_text("gitdir: ../meta2\n")
    elif layout == "nested-config":
        (work / "vendor" / "lib" / ".git").mkdir(parents=True)
        (work / "vendor" / "lib" / ".git" / "config").write_text("[core]\n\thooksPath = ../../meta2/hooks\n")
    elif layout == "worktree-commondir":
        (work / "meta2" / "worktrees" / "wt").mkdir(parents=True)
        (work / "meta2" / "worktrees" / "wt" / "commondir").write_text("../..\n")
        (work / "meta2" / "hooks").mkdir()
        (work / "wt").mkdir()
        (work / "wt" / ".git").write_text("gitdir: ../meta2/worktrees/wt\n")
    else:
        top = work.parent
        (top / ".git").mkdir()
        (top / ".git" / "config").write_text("[core]\n\thooksPath = %s/meta2/hooks\n" % work.name)
    cli.use(fake)
    before = snapshot(work)
    r, results = run_calls(cli, fake, [tool_call("write_file", path=path, content="x"),
                                       tool_call("write_file", path="elsewhere.txt", content="ok")])
    assert results[0].startswith("Error: ") and results[0].endswith(HEADLESS), results[0]
    assert results[1] == "Created elsewhere.txt (2 bytes)"
    assert not os.path.exists(str(work / path))


def test_hard_link_to_outside_is_never_written_through(cli, fake, outside):
    work = cli.workdir
    os.link(str(outside / "victim.txt"), str(work / "hl.txt"))
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="hl.txt", content="x\n"),
                                       tool_call("edit_file", path="hl.txt", old_text="x", new_text="y")])
    assert r.returncode == 0, r.stderr
    assert (outside / "victim.txt").read_text() == "untouched\n"
    assert (work / "hl.txt").read_text() == "y\n"


def test_a_huge_sparse_file_costs_an_error_not_the_memory(cli, fake):
    """edit_file and diff_files read files whole: a 100 MB (sparse: free to make) file is refused by size."""
    work = cli.workdir
    with open(str(work / "big.txt"), "wb") as fh:
        fh.write(b"hello needle\n" * 1000)
        fh.truncate(100 << 20)
    (work / "small.txt").write_text("a\n")
    cli.use(fake)
    r, results = run_calls(cli, fake, [
        tool_call("edit_file", path="big.txt", old_text="hello", new_text="x", replace_all=True),
        tool_call("diff_files", path1="small.txt", path2="big.txt"),
        tool_call("grep", pattern="needle", path="big.txt")])
    assert r.returncode == 0, r.stderr
    edit, diff, grep = results
    assert edit.startswith("Error: big.txt is 100.0 MB, over the 64.0 MB"), edit
    assert diff.startswith("Error: big.txt is 100.0 MB, over the 64.0 MB"), diff
    assert "big.txt:1: hello needle" in grep
    assert os.path.getsize(str(work / "big.txt")) == 100 << 20


def test_rewritten_and_copied_files_drop_set_id_bits(cli, fake):
    """Replacing a set-user-ID program's content (or copying it) must not hand the new bytes its privilege."""
    work = cli.workdir
    prog = work / "tool.sh"
    prog.write_text("#!/bin/sh\necho ok\n")
    os.chmod(str(prog), 0o6755)
    if os.stat(str(prog)).st_mode & 0o6000 != 0o6000:
        pytest.skip("this filesystem does not keep set-ID bits")
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("copy_path", source_path="tool.sh", destination_path="copy.sh"),
                                       tool_call("edit_file", path="tool.sh", old_text="ok", new_text="pwned")])
    assert r.returncode == 0, r.stderr
    assert results[1] == "Edited tool.sh: 1 replacement, saved. Lines 1-2 now read:\n     1\t#!/bin/sh\n     2\techo pwned"
    assert os.stat(str(prog)).st_mode & 0o7777 == 0o755
    assert os.stat(str(work / "copy.sh")).st_mode & 0o7777 == 0o755


def test_a_stored_key_echoed_encoded_in_a_provider_error_reaches_no_output(cli, fake):
    """A server that echoes the credential base64-encoded (as in Basic auth), URL-encoded or JSON-escaped
    the PHP/Java way (`\\/`) leaks it as surely as one echoing it plain."""
    import base64
    import json
    import urllib.parse
    from test_secrets import db_bytes, write_credentials
    key = "sec/ret+value=0042-no/known+shape"
    cli.use(fake, provider="openai")
    write_credentials(cli, {"openai_api_key": key})
    spellings = [base64.b64encode(key.encode()).decode(), base64.b64encode(("Bearer " + key).encode()).decode()[12:-4],
                 base64.urlsafe_b64encode(("user:" + key).encode()).decode()[8:-4],
                 urllib.parse.quote(key, safe=""), key.replace("/", "\\/")]
    fake.add({"status": 500, "body": json.dumps({"error": "bad " + " | ".join(spellings)})})
    r = cli.run("run", "--prompt", "hello")
    assert r.returncode == 1 and "bad [REDACTED]" in r.stderr, r.stderr
    for spelling in spellings:
        assert spelling not in r.stderr and spelling.encode() not in db_bytes(cli), spelling


@pytest.mark.skipif(not __import__("xzatoma_tools").landlock_abi(), reason="the kernel has no Landlock")
def test_the_sandbox_keeps_where_git_really_lives_and_what_its_config_runs_read_only(cli, fake):
    """`.git` a link to meta/, a nested clone's `.git` file naming meta2/, core.hooksPath naming tools/hooks:
    a script run through the terminal must not plant hooks there either."""
    work = cli.workdir
    (work / "meta" / "hooks").mkdir(parents=True)
    (work / "meta" / "config").write_text("[core]\n\thooksPath = tools/hooks\n")
    os.symlink("meta", str(work / ".git"))
    (work / "tools" / "hooks").mkdir(parents=True)
    (work / "meta2" / "hooks").mkdir(parents=True)
    (work / "sub").mkdir()
    (work / "sub" / ".git").write_text("gitdir: ../meta2\n")
    script = ("echo x > meta/hooks/pre-commit; echo x > tools/hooks/pre-commit; echo x > meta2/hooks/pre-commit;"
              " echo '[x]' >> meta/config; echo inside > ok.txt && echo INSIDE-OK\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("write_file", path="attack.sh", content=script)]},
             {"tool_calls": [tool_call("terminal", command="sh attack.sh")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    out = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"][-1]
    assert "INSIDE-OK" in out, out
    for hook in ("meta/hooks/pre-commit", "tools/hooks/pre-commit", "meta2/hooks/pre-commit"):
        assert not (work / hook).exists(), hook
    assert (work / "meta" / "config").read_text() == "[core]\n\thooksPath = tools/hooks\n"


def test_a_fifo_planted_as_git_metadata_hangs_nothing(cli, fake):
    """A worktree's `commondir` and a repository's `config` as FIFOs: protected-path checks, the sandbox's
    start and the policy's look at git config must not block reading them."""
    work = cli.workdir
    (work / "meta").mkdir()
    os.mkfifo(str(work / "meta" / "commondir"))
    (work / "wt").mkdir()
    (work / "wt" / ".git").write_text("gitdir: ../meta\n")
    (work / ".git").mkdir()
    os.mkfifo(str(work / ".git" / "config"))
    os.mkfifo(str(work / ".git" / "commondir"))
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="notes.txt", content="ok\n"),
                                       tool_call("terminal", command="git status"),
                                       tool_call("terminal", command="echo hi")], timeout=30)
    assert r.returncode == 0, r.stderr
    assert results[0] == "Created notes.txt (3 bytes)", results
    assert results[1].startswith("Error: ") or "needs a person" in results[1], results
