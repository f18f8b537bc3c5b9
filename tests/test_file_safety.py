"""The file tools' safety end to end: tool calls from the fake model against real trees, harmless payloads."""

import os
import subprocess
import threading
import time

import pytest

from conftest import tool_call
from ptyrun import PtyProcess

HEADLESS = "needs a person's approval; not available in this run"


def tool_results(fake, index=-1):
    return [m["content"] for m in fake.model_requests()[index]["body"]["messages"] if m["role"] == "tool"]


def run_calls(cli, fake, calls, *extra, timeout=60):
    """One model turn making `calls`, then an answer; returns the CLI result and the tool results."""
    fake.add({"tool_calls": calls}, {"content": "done"})
    r = cli.run("run", "--prompt", "go", *extra, timeout=timeout)
    return r, tool_results(fake)


@pytest.fixture
def outside(cli):
    d = cli.tmp / "outside"
    d.mkdir()
    (d / "victim.txt").write_text("untouched\n")
    return d


def test_planted_temp_name_symlinks_are_never_written_through(cli, fake, outside):
    """A repository ships <file>.xzatoma-<pid>.tmp links for every likely pid (the old temp-name scheme)."""
    work = cli.workdir
    (work / "notes.txt").write_text("alpha\n")
    victim = str(outside / "victim.txt")
    for pid in range(1, 4097):
        for base in ("notes.txt", "new.txt"):
            os.symlink(victim, str(work / ("%s.xzatoma-%d.tmp" % (base, pid))))
        os.symlink(victim, str(work / (".xzatoma-%d.tmp" % pid)))
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="notes.txt", content="beta\n"),
                                       tool_call("edit_file", path="notes.txt", old_text="beta", new_text="gamma"),
                                       tool_call("write_file", path="new.txt", content="fresh\n")])
    assert r.returncode == 0, r.stderr
    assert results[0] == ("Overwrote notes.txt (5 bytes; it had 6 before: its whole content was replaced). "
                          "Its content before was:\nalpha")
    assert results[2] == "Created new.txt (6 bytes)"
    assert (work / "notes.txt").read_text() == "gamma\n" and (work / "new.txt").read_text() == "fresh\n"
    assert (outside / "victim.txt").read_text() == "untouched\n" and os.listdir(str(outside)) == ["victim.txt"]
    assert not [n for n in os.listdir(str(work)) if n.endswith(".tmp") and not os.path.islink(str(work / n))]


def renameat2_libc():
    """libc with renameat2 (exchanges two names atomically), or the test is skipped."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this libc")
    return libc


def swap_while_running(libc, proc, a, b):
    """Exchange `a` and `b` (RENAME_EXCHANGE) over and over while `proc` runs; returns its (stdout, stderr).
    Each round exchanges twice, so between rounds the tree is as it was."""
    a, b = str(a).encode(), str(b).encode()
    swaps = 0
    while proc.poll() is None and swaps < 500000:  # bounded by iterations and by the run's end
        libc.renameat2(-100, a, -100, b, 2)
        libc.renameat2(-100, a, -100, b, 2)
        swaps += 1
    out, err = proc.communicate(timeout=60)
    assert swaps > 50, "the run ended before the race got going"
    return out, err


def test_symlink_swap_race_through_tool_calls(cli, fake, outside):
    """While the run reads and writes under d/, a thread keeps exchanging d with a link to outside."""
    libc = renameat2_libc()
    work = cli.workdir
    (work / "d").mkdir()
    (work / "d" / "f.txt").write_text("inside\n")
    (outside / "f.txt").write_text("OUTSIDE-SECRET\n")
    os.symlink(str(outside), str(work / "lnk"))
    turn = [tool_call("read_file", path="d/f.txt"), tool_call("write_file", path="d/w.txt", content="w\n"),
            tool_call("edit_file", path="d/f.txt", old_text="inside", new_text="inside"),
            tool_call("grep", pattern="SECRET", path="d"), tool_call("list_directory", path="d", recursive=True),
            tool_call("copy_path", source_path="d/f.txt", destination_path="d/c.txt", overwrite=True),
            tool_call("delete_path", path="d/c.txt")]
    fake.add(*[{"tool_calls": turn} for _ in range(40)])
    fake.add({"content": "done"})
    cli.use(fake, max_turns=100)
    proc = cli.popen("run", "--prompt", "go")
    out, err = swap_while_running(libc, proc, work / "d", work / "lnk")
    assert proc.returncode == 0, err
    assert sorted(os.listdir(str(outside))) == ["f.txt", "victim.txt"]
    assert (outside / "f.txt").read_text() == "OUTSIDE-SECRET\n"
    for request in fake.model_requests():
        for m in request["body"]["messages"]:
            assert "OUTSIDE-SECRET" not in (m.get("content") or "")


def test_fifo_never_hangs_a_tool(cli, fake):
    work = cli.workdir
    (work / "sub").mkdir()
    (work / "sub" / "a.txt").write_text("needle\n")
    os.mkfifo(str(work / "sub" / "pipe"))
    os.mkfifo(str(work / "pipe"))
    cli.use(fake)
    started = time.monotonic()
    r, results = run_calls(cli, fake, [
        tool_call("read_file", path="pipe"), tool_call("write_file", path="pipe", content="x"),
        tool_call("edit_file", path="pipe", old_text="a", new_text="b"), tool_call("grep", pattern="needle"),
        tool_call("grep", pattern="needle", path="pipe"), tool_call("diff_files", path1="pipe", path2="sub/a.txt"),
        tool_call("file_metadata", path="pipe"), tool_call("copy_path", source_path="pipe", destination_path="p2"),
        tool_call("copy_path", source_path="sub", destination_path="sub2"), tool_call("plan", path="pipe"),
        tool_call("list_directory", path="sub"), tool_call("delete_path", path="pipe")], timeout=30)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 25
    (read, write, edit, grep_all, grep_one, diff, meta, copy, copy_dir, plan, listing, delete) = results
    assert read == "Error: pipe is a FIFO, not a regular file; read_file only reads regular files"
    assert write == "Error: pipe is a FIFO, not a regular file; write_file only replaces regular files"
    assert edit == "Error: pipe is a FIFO, not a regular file; edit_file only edits regular files"
    assert grep_all.startswith("sub/a.txt:1: needle") and "skipped 2 special files" in grep_all
    assert "pipe" in grep_one and "skipped 1 special file" in grep_one
    assert diff == "Error: pipe is not a text file"
    assert "type: other (FIFO)" in meta
    assert copy.startswith("Error: pipe is a FIFO") and not os.path.lexists(str(work / "p2"))
    assert copy_dir.startswith("Copied sub to sub2 (2 items); skipped 1 special file") and \
        sorted(os.listdir(str(work / "sub2"))) == ["a.txt"]
    assert plan.startswith("Error: pipe is a FIFO")
    assert "FIFO" in listing and "pipe" in listing
    assert delete == "Deleted pipe (1 item)" and not os.path.lexists(str(work / "pipe"))


@pytest.mark.parametrize("call,path", [
    (tool_call("write_file", path=".git/hooks/pre-commit", content="#!/bin/sh\ntouch ../pwned\n"), ".git/hooks/pre-commit"),
    (tool_call("edit_file", path=".git/config", old_text="bare = false", new_text="fsmonitor = touch pwned"),
     ".git/config"),
    (tool_call("write_file", path=".bashrc", content="touch pwned\n"), ".bashrc"),
    (tool_call("write_file", path=".GIT/hooks/post-checkout", content="x"), ".GIT/hooks/post-checkout"),
    (tool_call("write_file", path="vendor/lib/.git/hooks/pre-commit", content="x"), "vendor/lib/.git/hooks/pre-commit"),
    (tool_call("write_file", path="hooklink/pre-push", content="x"), ".git/hooks/pre-push"),
    (tool_call("write_file", path=".ssh/authorized_keys", content="ssh-ed25519 AAAA attacker\n"), ".ssh/authorized_keys"),
    (tool_call("write_file", path=".config/fish/config.fish", content="x"), ".config/fish/config.fish"),
    (tool_call("delete_path", path=".git", recursive=True), ".git/config"),
    (tool_call("delete_path", path="vendor", recursive=True), "vendor/lib/.git/config"),
    (tool_call("move_path", source_path=".git/config", destination_path="gitconfig.bak"), ".git/config"),
    (tool_call("move_path", source_path="notes.txt", destination_path=".git/info/exclude"), ".git/info/exclude"),
    (tool_call("copy_path", source_path="notes.txt", destination_path=".profile", overwrite=True), ".profile"),
    (tool_call("create_directory", path=".git/hooks/deeper"), ".git/hooks/deeper"),
    (tool_call("write_file", path="deploy/keys/id", content="x"), "deploy/keys/id"),
])
def test_protected_paths_are_refused_headless(cli, fake, call, path):
    work = cli.workdir
    (work / ".git" / "hooks").mkdir(parents=True)
    (work / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (work / ".git" / "description").write_text("repo\n")
    (work / "vendor" / "lib" / ".git").mkdir(parents=True)
    (work / "vendor" / "lib" / ".git" / "config").write_text("[core]\n")
    (work / ".profile").write_text("# profile\n")
    (work / "notes.txt").write_text("notes\n")
    os.symlink(".git/hooks", str(work / "hooklink"))
    before = snapshot(work)
    cli.use(fake, tools={"protected_paths": ["deploy/keys"]})
    r, results = run_calls(cli, fake, [call])
    assert r.returncode == 0, r.stderr
    assert results[0].startswith("Error: ") and results[0].endswith(HEADLESS), results[0]
    assert snapshot(work) == before  # nothing changed, anywhere


@pytest.mark.parametrize("layout", ["symlink", "gitdir-file"])
def test_where_git_really_lives_is_protected(cli, fake, layout):
    """.git may be a link to the repository's metadata, or a file naming its gitdir (worktrees, submodules)."""
    work = cli.workdir
    (work / "meta" / "hooks").mkdir(parents=True)
    if layout == "symlink":
        os.symlink("meta", str(work / ".git"))
    else:
        (work / ".git").write_text("gitdir: meta\n")
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="meta/hooks/pre-commit", content="x"),
                                       tool_call("write_file", path="META/config", content="x"),
                                       tool_call("write_file", path="elsewhere.txt", content="ok")])
    assert results[0].endswith(HEADLESS) and results[1].endswith(HEADLESS), results
    assert results[2] == "Created elsewhere.txt (2 bytes)"
    assert sorted(os.listdir(str(work / "meta"))) == ["hooks"] and os.listdir(str(work / "meta" / "hooks")) == []


def snapshot(root):
    out = {}
    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            full = os.path.join(base, name)
            out[os.path.relpath(full, str(root))] = (os.readlink(full) if os.path.islink(full) else
                                                     open(full, "rb").read() if os.path.isfile(full) else "dir")
    return out


def test_protected_write_is_asked_in_chat_even_in_yolo(cli, fake):
    work = cli.workdir
    (work / ".git" / "hooks").mkdir(parents=True)
    fake.add({"tool_calls": [tool_call("write_file", path=".git/hooks/pre-commit", content="#!/bin/sh\necho hi\n")]},
             {"content": "declined noted"},
             {"tool_calls": [tool_call("write_file", path=".bashrc", content="alias ll='ls -l'\n")]},
             {"content": "written"})
    cli.use(fake)
    p = PtyProcess(cli.command("chat", "--mode", "write", "--safety", "yolo"), dict(cli.env, TERM="xterm"),
                   str(work))
    try:
        p.expect(r"\[WRITE\]\[YOLO\] >> ")
        p.line("add a hook")
        p.expect(r"Allow write_file\? write_file \.git/hooks/pre-commit changes \.git, a protected path")
        p.expect(r"\[y\]es / \[n\]o")
        p.line("n")
        p.expect("declined noted")
        assert tool_results(fake)[0].startswith("Error: the user declined: write_file .git/hooks/pre-commit")
        assert not (work / ".git" / "hooks" / "pre-commit").exists()
        p.line("add an alias")
        p.expect(r"Allow write_file\? write_file \.bashrc changes \.bashrc, a protected path")
        p.line("y")
        p.expect("written")
        assert (work / ".bashrc").read_text() == "alias ll='ls -l'\n"
        p.expect(r"\[WRITE\]\[YOLO\] >> ")
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()


def test_run_refuses_home_or_root_as_an_implicit_working_directory(cli, fake):
    cli.use(fake)
    for where in (cli.home, "/"):
        r = cli.run("run", "--prompt", "go", cwd=where)
        assert r.returncode == 2 and r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "--working-dir DIR" in lines[0] and "refusing" in lines[0], r.stderr
    assert fake.model_requests() == []


def test_home_named_deliberately_keeps_its_protected_paths(cli, fake):
    home = cli.home
    (home / ".bashrc").write_text("# mine\n")
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path=".bashrc", content="touch pwned\n"),
                                       tool_call("write_file", path=".ssh/authorized_keys", content="k\n"),
                                       tool_call("write_file", path="scratch.txt", content="ok\n")],
                           "--working-dir", str(home))
    assert r.returncode == 0, r.stderr
    assert results[0].endswith(HEADLESS) and results[1].endswith(HEADLESS)
    assert results[2] == "Created scratch.txt (3 bytes)"
    assert (home / ".bashrc").read_text() == "# mine\n" and not (home / ".ssh").exists()


def test_a_directory_above_home_is_refused_and_given_deliberately_protects_home(cli, fake):
    cli.use(fake)
    r = cli.run("run", "--prompt", "go", cwd=cli.tmp)  # cli.tmp holds the test's HOME
    assert r.returncode == 2 and "a directory above your home directory" in r.stderr and "--working-dir" in r.stderr
    (cli.home / ".ssh").mkdir()
    r, results = run_calls(cli, fake, [tool_call("write_file", path="home/.ssh/authorized_keys", content="k\n"),
                                       tool_call("write_file", path="home/.zshenv", content="touch pwned\n"),
                                       tool_call("write_file", path="home/notes.txt", content="ok\n")],
                           "--working-dir", str(cli.tmp))
    assert r.returncode == 0, r.stderr
    assert results[0].endswith(HEADLESS) and results[1].endswith(HEADLESS) and results[2].startswith("Created")
    assert os.listdir(str(cli.home / ".ssh")) == [] and not (cli.home / ".zshenv").exists()


def test_configured_protected_globs(cli, fake):
    cli.use(fake, tools={"protected_paths": ["*.pem", "secrets/**", "deploy/prod.env"]})
    (cli.workdir / "secrets").mkdir()
    r, results = run_calls(cli, fake, [
        tool_call("write_file", path="certs/server.PEM", content="x"),
        tool_call("write_file", path="secrets/a/b.txt", content="x"),
        tool_call("write_file", path="deploy/prod.env", content="x"),
        tool_call("delete_path", path="secrets", recursive=True),
        tool_call("write_file", path="deploy/dev.env", content="x")])
    assert [x.endswith(HEADLESS) for x in results] == [True, True, True, True, False], results
    assert sorted(os.listdir(str(cli.workdir))) == ["deploy", "secrets"]
    assert os.listdir(str(cli.workdir / "deploy")) == ["dev.env"]


def test_chat_refuses_home_as_an_implicit_working_directory(cli, fake):
    cli.use(fake)
    r = subprocess.run(cli.command("chat"), input="", capture_output=True, text=True, env=cli.env,
                       cwd=str(cli.home), timeout=60)
    assert r.returncode == 2 and "--working-dir DIR" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_copy_and_move_onto_the_working_directory_are_refused(cli, fake):
    work = cli.workdir
    (work / "src").mkdir()
    (work / "src" / "a.py").write_text("a\n")
    (work / "keep.txt").write_text("keep\n")
    cli.use(fake)
    before = snapshot(work)
    r, results = run_calls(cli, fake, [
        tool_call("copy_path", source_path="src", destination_path=".", overwrite=True),
        tool_call("move_path", source_path="src", destination_path=".", overwrite=True),
        tool_call("move_path", source_path="src", destination_path="./", overwrite=True),
        tool_call("copy_path", source_path="src/a.py", destination_path="src", overwrite=True),
        tool_call("move_path", source_path="src/a.py", destination_path="src/../src", overwrite=True),
        tool_call("copy_path", source_path="src", destination_path="src/inner"),
        tool_call("move_path", source_path=".", destination_path="elsewhere")])
    assert r.returncode == 0, r.stderr
    assert results[0] == "Error: refusing to copy onto the working directory itself (.)"
    assert results[1] == "Error: refusing to move onto the working directory itself (.)"
    assert results[2] == "Error: refusing to move onto the working directory itself (./)"
    assert results[3] == "Error: source and destination are the same: src/a.py"
    assert results[4] == "Error: source and destination are the same: src/a.py"
    assert results[5] == "Error: cannot put src inside itself"
    assert results[6] == "Error: refusing to move the working directory itself"
    assert snapshot(work) == before


def test_destination_that_contains_the_source_is_refused(cli, fake):
    work = cli.workdir
    (work / "a" / "b").mkdir(parents=True)
    (work / "a" / "b" / "f.txt").write_text("f\n")
    (work / "a" / "x.txt").write_text("x\n")
    cli.use(fake)
    r, results = run_calls(cli, fake, [
        tool_call("move_path", source_path="a/b", destination_path="a", overwrite=True),
        tool_call("copy_path", source_path="a/b/f.txt", destination_path="a/b/../..", overwrite=True)])
    assert results[0] == "Error: the destination a contains the source a/b; replacing it would destroy the source"
    assert (work / "a" / "b" / "f.txt").read_text() == "f\n" and (work / "a" / "x.txt").exists()
    assert results[1].startswith("Copied a/b/f.txt to f.txt")  # into the directory, like cp


def test_deleting_a_symlink_removes_the_link_not_the_target(cli, fake, outside):
    work = cli.workdir
    (work / "data").mkdir()
    (work / "data" / "keep.txt").write_text("keep\n")
    os.symlink("data", str(work / "dlink"))
    os.symlink(str(outside), str(work / "olink"))
    (work / "tree" / "inner").mkdir(parents=True)
    os.symlink("../../data", str(work / "tree" / "inner" / "back"))
    os.symlink(str(outside), str(work / "tree" / "out"))
    cli.use(fake)
    r, results = run_calls(cli, fake, [
        tool_call("delete_path", path="dlink"), tool_call("delete_path", path="olink", recursive=True),
        tool_call("delete_path", path="tree", recursive=True)])
    assert results == ["Deleted dlink (1 item)", "Deleted olink (1 item)", "Deleted tree (4 items)"]
    assert (work / "data" / "keep.txt").read_text() == "keep\n"
    assert sorted(os.listdir(str(outside))) == ["victim.txt"]
    assert not os.path.lexists(str(work / "dlink")) and not (work / "tree").exists()


def test_policy_path_reports_loops_and_long_names_as_errors(cli):
    os.symlink("loop2", str(cli.workdir / "loop1"))
    os.symlink("loop1", str(cli.workdir / "loop2"))
    for path, words in (("loop1", "error: too many levels of symbolic links: loop1"),
                        ("x" * 256, "error: file name too long: 256 bytes"),
                        ("ok/" + "y" * 255, "inside: resolves to ok/" + "y" * 255 + "\n"),
                        (".git/hooks/pre-commit", "inside: resolves to .git/hooks/pre-commit; protected (.git): "
                                                  "changes need a person's yes")):
        r = cli.run("policy", "path", path)
        assert r.returncode == (1 if words.startswith("error") else 0) and r.stdout.startswith(words), (
            path, r.stdout, r.stderr)
