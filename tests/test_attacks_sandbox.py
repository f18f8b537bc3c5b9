"""The sandbox's walls of issue 23, attacked as a prompt-injected model would: a script it runs with
--allow-dangerous, so that only the kernel stands in the way. Harmless payloads: marker files, a System V
segment, a kernel key and unix sockets the test owns, and files of its own outside the working directory.
Then the other side: everyday commands still run (over-blocking stays under 10%)."""

import os
import subprocess

import pytest

from test_accept12c import configure, run_commands, script
from xzatoma_tools import git_dirs, landlock_abi, program_dirs, sandbox_rules, trusted_realpath

pytestmark = pytest.mark.skipif(not landlock_abi(), reason="the kernel has no Landlock: nothing to attack")

# ---- read grants come from nothing a command can write ----

def test_a_link_planted_in_an_activated_venv_or_a_gitdir_file_never_widens_the_next_runs_reads(cli, fake):
    ssh = cli.home / ".ssh"
    ssh.mkdir()
    (ssh / "id_rsa").write_text("SSH-SECRET-4732\n")
    venv_bin = cli.workdir / ".venv" / "bin"
    env = {"PATH": "%s:%s" % (venv_bin, os.environ["PATH"])}  # an activated virtualenv in the tree
    configure(cli, fake)
    plant = "mkdir -p .venv/bin && ln -s %s .venv/bin/helper && ln -s %s .venv/bin/keys && echo PLANTED" % (
        ssh / "id_rsa", ssh)
    r, [out] = run_commands(cli, fake, script(cli, "plant.sh", plant), env=env)  # a script: the policy is no wall
    assert "stdout ---\nPLANTED" in out and os.path.islink(str(venv_bin / "helper"))
    (cli.workdir / ".git").write_text("gitdir: %s\n" % ssh)  # kept by a person, or made before
    r, [out] = run_commands(cli, fake, script(cli, "read.sh", "cat %s; ls %s; cat .venv/bin/helper; echo END" % (
        ssh / "id_rsa", ssh)), env=env)
    assert "SSH-SECRET-4732" not in out and "id_rsa\n" not in out.split("--- stderr")[0] and "END" in out, out
    assert out.count("Permission denied") + out.count("No such file or directory") == 3, out  # as root: not there


def test_grants_are_resolved_without_following_links_in_the_writable_roots(tmp_path):
    work, outside, tmp = tmp_path / "work", tmp_path / "outside", tmp_path / "tmp"
    for d in (work / "bin", outside / "bin", outside / "secret", tmp):
        d.mkdir(parents=True)
    (outside / "secret" / "key").write_text("k")
    (work / "hop").symlink_to(outside / "secret")
    (outside / "bin" / "tool").symlink_to(work / "hop" / "key")  # the person's link, through a planted one
    (outside / "lnk").symlink_to(work / "hop")
    untrusted = (str(work), str(tmp))
    assert trusted_realpath(str(outside / "bin" / "tool"), untrusted) is None
    assert trusted_realpath(str(outside / "bin" / "tool")) == str(outside / "secret" / "key")
    assert trusted_realpath(str(outside / "lnk" / "key"), untrusted) is None
    dirs = program_dirs("%s:%s:%s" % (outside / "bin", outside / "lnk", work / "bin"), untrusted=untrusted)
    assert str(outside / "secret") not in dirs and str(work / "bin") not in dirs
    assert str(outside / "bin") in dirs
    rules = dict(sandbox_rules(str(work), "workspace-write", str(tmp), "%s:%s" % (outside / "bin", work / "bin")))
    assert str(outside / "secret") not in rules


def test_a_worktree_or_submodule_gitdir_outside_is_granted_and_a_planted_one_is_not(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "protocol.file.allow=always"]
    main, wt = tmp_path / "main", tmp_path / "wt"
    subprocess.run(git + ["init", "-q", str(main)], check=True)
    subprocess.run(git + ["-C", str(main), "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    subprocess.run(git + ["-C", str(main), "worktree", "add", "-q", str(wt)], check=True)
    dirs = git_dirs(str(wt), (str(wt),))
    assert str(main / ".git" / "worktrees" / "wt") in dirs and str(main / ".git") in dirs
    subprocess.run(git + ["-C", str(main), "submodule", "add", "-q", str(main), "lib/sub"], check=True,
                   capture_output=True)
    sub = main / "lib" / "sub"
    assert str(main / ".git" / "modules" / "lib" / "sub") in git_dirs(str(sub), (str(sub),))
    planted = tmp_path / "planted"
    (planted / "secret").mkdir(parents=True)
    (planted / ".git").write_text("gitdir: %s\n" % (tmp_path / "main" / ".git" / "worktrees" / "wt"))
    assert git_dirs(str(planted), (str(planted),)) == []  # wt's gitdir names wt/.git, not this one
    (planted / ".git").write_text("gitdir: %s\n" % (tmp_path / "main"))
    assert git_dirs(str(planted), (str(planted),)) == [] and git_dirs(str(planted)) == [str(tmp_path / "main")]
