"""Protected paths a terminal command creates: the sandbox makes existing ones read-only, but a `.git`, a
`.bashrc` or `.ssh/` that did not exist when it started would be writable. What appears is removed in a
headless run (a person keeps it in chat), unless it is a repository git would run nothing from.

Each attack is the script a prompt-injected model would write, run with --allow-dangerous so that only
these checks stand in the way; the payload is a `touch` marker that a later `git` outside the sandbox
would run.
"""

import os
import subprocess

import pytest

from conftest import tool_call
from test_file_safety import HEADLESS, tool_results
from xzatoma_tools import FULL, Approvals, ToolContext, build_registry

HOOK = "#!/bin/sh\ntouch \"$(git rev-parse --show-toplevel)/../PWNED\"\n"


def run_script(cli, fake, *scripts):
    """One terminal call per script (`sh sN.sh`), then an answer; the CLI result and the tool results."""
    cli.use(fake)
    for i, body in enumerate(scripts):
        (cli.workdir / ("s%d.sh" % i)).write_text(body)
    fake.add({"tool_calls": [tool_call("terminal", command="sh s%d.sh" % i) for i in range(len(scripts))]},
             {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", timeout=90)
    assert r.returncode == 0, r.stderr
    return tool_results(fake)


def hook_script(where):
    return ("mkdir -p %s/.git/hooks\ncat > %s/.git/hooks/post-checkout <<'EOF'\n%sEOF\n"
            "chmod +x %s/.git/hooks/post-checkout\necho planted\n" % (where, where, HOOK, where))


@pytest.mark.parametrize("where", [".", "a/b/c", "src"])
def test_a_planted_repository_with_a_hook_is_removed(cli, fake, where):
    (cli.workdir / "src").mkdir()
    (cli.workdir / "src" / "keep.txt").write_text("mine\n")
    [result] = run_script(cli, fake, hook_script(where))
    dot = os.path.normpath(os.path.join(where, ".git"))
    assert result.startswith("Error: the command made %s (hooks/post-checkout)" % dot), result
    assert HEADLESS in result and "Removed: %s" % dot in result and "planted" in result
    assert not os.path.lexists(str(cli.workdir / where / ".git"))
    assert (cli.workdir / "src" / "keep.txt").read_text() == "mine\n"  # only what the command planted


def test_git_init_is_kept_until_a_later_command_arms_it(cli, fake):
    results = run_script(cli, fake, "git init -q sub && echo made",
                         "printf '#!/bin/sh\\ntouch ../../PWNED\\n' > sub/.git/hooks/pre-commit; "
                         "chmod +x sub/.git/hooks/pre-commit")
    assert results[0].startswith("exit code: 0") and "made" in results[0], results[0]
    assert results[1].startswith("Error: the command made sub/.git (hooks/pre-commit)"), results[1]
    assert not os.path.lexists(str(cli.workdir / "sub" / ".git"))


@pytest.mark.parametrize("script,reason", [
    ("git init -q sub && git -C sub config core.fsmonitor 'touch ../PWNED'", "git config: core.fsmonitor"),
    ("git init -q sub && printf '[include]\\n\\tpath = ../../inc\\n' >> sub/.git/config", "git config: include.path"),
    ("mkdir sub && ln -s /tmp sub/.git", "a link"),
    ("mkdir sub && echo 'gitdir: /etc' > sub/.git", "a gitdir outside the working directory"),
    ("mkdir -p sub/.hg && printf '[hooks]\\nupdate = touch ../PWNED\\n' > sub/.hg/hgrc", "an hgrc"),
    ("mkdir -p sub/.GIT/hooks && touch sub/.GIT/hooks/pre-push", "hooks/pre-push"),
])
def test_repositories_that_would_run_code_are_removed(cli, fake, script, reason):
    [result] = run_script(cli, fake, script)
    assert result.startswith("Error: the command made sub/"), result
    assert "(%s)" % reason in result, result
    assert os.listdir(str(cli.workdir / "sub")) == []


@pytest.mark.parametrize("path,top", [(".bashrc", ".bashrc"), (".ssh/authorized_keys", ".ssh"),
                                      (".config/git/config", ".config/git"), (".npmrc", ".npmrc"),
                                      ("deploy/keys", "deploy/keys")])
def test_new_protected_files_are_removed(cli, fake, path, top):
    cli.use(fake, tools={"protected_paths": ["deploy/keys"]})
    (cli.workdir / "s0.sh").write_text("mkdir -p $(dirname %s) && echo 'touch PWNED' > %s\n" % (path, path))
    fake.add({"tool_calls": [tool_call("terminal", command="sh s0.sh")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", timeout=90)
    assert r.returncode == 0, r.stderr
    [result] = tool_results(fake)
    assert result.startswith("Error: the command made %s (a protected path)" % top), result
    assert not os.path.lexists(str(cli.workdir / path))


def test_existing_repositories_and_ordinary_files_are_left_alone(cli, fake):
    subprocess.run(["git", "init", "-q", str(cli.workdir)], check=True)
    [result] = run_script(cli, fake, "mkdir -p lib/x && echo hi > lib/x/y.txt && git status --short >/dev/null; echo ok")
    assert result.startswith("exit code: 0") and "ok" in result, result
    assert (cli.workdir / ".git" / "HEAD").exists() and (cli.workdir / "lib" / "x" / "y.txt").exists()


def test_a_person_keeps_what_they_approve_and_is_not_asked_again(tmp_path):
    asked = []
    ctx = ToolContext(str(tmp_path), {}, Approvals(True, ask=lambda tool, args, detail: asked.append(detail) or True),
                      autonomy=FULL)
    reg = build_registry("write", ctx)
    try:
        (tmp_path / "s.sh").write_text(hook_script("."))
        r = reg.execute("terminal", {"command": "sh s.sh"})
        assert r.success, r.error
        assert len(asked) == 1 and asked[0].startswith("the command made .git (hooks/post-checkout)")
        assert asked[0].endswith("Keep it (no removes it)?")
        (tmp_path / "t.sh").write_text("echo again >> .git/hooks/post-checkout")
        r = reg.execute("terminal", {"command": "sh t.sh"})
        assert r.success and len(asked) == 1, (r.error, asked)
        assert (tmp_path / ".git" / "hooks" / "post-checkout").read_text().endswith("again\n")
    finally:
        ctx.sandbox.close()


def test_a_person_who_says_no_gets_it_removed(tmp_path):
    ctx = ToolContext(str(tmp_path), {}, Approvals(True, ask=lambda tool, args, detail: False), autonomy=FULL)
    try:
        (tmp_path / "s.sh").write_text("echo x > .bashrc")
        r = build_registry("write", ctx).execute("terminal", {"command": "sh s.sh"})
        assert r.error.startswith("the command made .bashrc (a protected path)") and "the user declined" in r.error
        assert not (tmp_path / ".bashrc").exists()
    finally:
        ctx.sandbox.close()


def test_a_bare_repository_made_by_a_command_is_judged_like_a_dot_git(cli, fake):
    results = run_script(cli, fake, "git init -q --bare mirror.git && echo made",
                         "printf '#!/bin/sh\\ntouch ../PWNED\\n' > mirror.git/hooks/post-receive")
    assert results[0].startswith("exit code: 0") and "made" in results[0], results[0]  # inert: kept
    assert results[1].startswith("Error: the command made mirror.git (hooks/post-receive)"), results[1]
    assert not os.path.lexists(str(cli.workdir / "mirror.git"))


def test_an_existing_bare_repository_is_read_only_for_commands_and_protected_for_the_file_tools(cli, fake):
    subprocess.run(["git", "init", "-q", "--bare", str(cli.workdir / "vendor" / "x.git")], check=True)
    (cli.workdir / "s0.sh").write_text("echo '#!/bin/sh' > vendor/x.git/hooks/post-checkout; echo rc=$?")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="sh s0.sh"),
                             tool_call("write_file", path="vendor/x.git/hooks/post-checkout", content="#!/bin/sh\n"),
                             tool_call("edit_file", path="vendor/x.git/config", old_text="bare = true",
                                       new_text="bare = true\n\tfsmonitor = touch PWNED"),
                             tool_call("write_file", path="newbare/hooks/pre-push", content="#!/bin/sh\n"),
                             tool_call("write_file", path="newbare/objects/x", content="x"),
                             tool_call("write_file", path="newbare/HEAD", content="ref: refs/heads/main\n")]},
             {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", timeout=90)
    assert r.returncode == 0, r.stderr
    term, hook, config, pre, objects, head = tool_results(fake)
    assert "rc=1" in term or "rc=2" in term, term  # a read-only bind mount
    for result in (hook, config, head):  # the last HEAD would make newbare/ a repository with a hook
        assert result.startswith("Error: ") and result.endswith(HEADLESS), result
    assert not pre.startswith("Error") and not objects.startswith("Error"), (pre, objects)  # not a repository yet
    assert not (cli.workdir / "vendor" / "x.git" / "hooks" / "post-checkout").exists()
    assert "fsmonitor" not in (cli.workdir / "vendor" / "x.git" / "config").read_text()
    assert not (cli.workdir / "newbare" / "HEAD").exists()
