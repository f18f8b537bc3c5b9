"""Acceptance-style attacks on the jail, special files, protected paths, the home/`/` refusal and copy/move/delete
destinations (issue 12), written the way a held-out set would: tool calls from the fake model against real
trees, the CLI as a subprocess, harmless payloads (marker files, tmp dirs; HOME is a tmp dir)."""

import os
import socket
import stat
import threading
import time

import pytest

from conftest import tool_call, wait_for
from test_file_safety import HEADLESS, outside, run_calls, snapshot, tool_results  # noqa: F401 (outside: fixture)

SECRET = "OUTSIDE-SECRET-5150"


def _mknod(path, kind):
    """A device node (char: like /dev/zero, block: like /dev/loop0); skips where the test may not make one."""
    mode = (stat.S_IFCHR if kind == "char" else stat.S_IFBLK) | 0o666
    try:
        os.mknod(str(path), mode, os.makedev(1, 5) if kind == "char" else os.makedev(7, 0))
    except (PermissionError, AttributeError, OSError) as exc:
        pytest.skip("cannot make a device node here: %s" % exc)


def _plant_specials(where):
    """A FIFO, a listening unix socket, a char device and a block device in `where`; returns the socket."""
    os.mkfifo(str(where / "fifo"))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(where / "sock"))
    sock.listen(1)
    _mknod(where / "chr", "char")
    _mknod(where / "blk", "block")
    return sock


SPECIALS = ("fifo", "sock", "chr", "blk")


# -- special files: every tool, reached directly, through a link, inside what a tool walks or copies --


def test_special_files_are_an_error_for_every_file_tool_directly_and_through_links(cli, fake):
    work = cli.workdir
    sock = _plant_specials(work)
    try:
        (work / "t.txt").write_text("hello\n")
        for name in SPECIALS:
            os.symlink(name, str(work / ("l" + name)))
        calls = []
        for name in SPECIALS + tuple("l" + n for n in SPECIALS):
            calls += [tool_call("read_file", path=name), tool_call("write_file", path=name, content="x"),
                      tool_call("edit_file", path=name, old_text="a", new_text="b"),
                      tool_call("copy_path", source_path=name, destination_path=name + ".copy"),
                      tool_call("diff_files", path1="t.txt", path2=name), tool_call("plan", path=name),
                      tool_call("grep", pattern="x", path=name)]
        cli.use(fake)
        started = time.monotonic()
        r, results = run_calls(cli, fake, calls, timeout=60)
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - started < 45
        for call, result in zip(calls, results):
            args = call["arguments"]
            shown = (call["name"], args)
            if call["name"] == "grep":
                # a search reads nothing there and says so: never a silent "no matches"
                assert "skipped 1 special file" in result and "not read" in result, shown + (result,)
            else:
                assert result.startswith("Error: "), shown + (result,)
                assert "FIFO" in result or "socket" in result or "device" in result or "not a text file" in result, \
                    shown + (result,)
        for name in SPECIALS:
            assert not os.path.lexists(str(work / (name + ".copy")))
            assert not os.path.lexists(str(work / ("l" + name + ".copy")))
        assert stat.S_ISFIFO(os.lstat(str(work / "fifo")).st_mode)
        assert stat.S_ISCHR(os.lstat(str(work / "chr")).st_mode)
    finally:
        sock.close()


def test_a_search_never_opens_a_fifo_it_is_pointed_at(cli, fake):
    """Opening a FIFO is already an effect: a writer waiting on it (here a thread, in an attack a process the
    repository's tooling started) is released and its data consumed. The tools must look before they open."""
    work = cli.workdir
    os.mkfifo(str(work / "pipe"))
    os.symlink("pipe", str(work / "via"))
    released = []

    def writer():
        try:
            with open(str(work / "pipe"), "w") as fh:  # blocks until someone opens the FIFO to read
                released.append(time.monotonic())
                fh.write("needle\n")
        except OSError:
            released.append(-1)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("grep", pattern="needle", path="pipe"),
                                       tool_call("grep", pattern="need+le", path="via"),
                                       tool_call("read_file", path="via"),
                                       tool_call("file_metadata", path="via")])
    assert r.returncode == 0, r.stderr
    assert released == [], "a tool opened the FIFO: %r" % (results,)
    assert all("needle" not in x.replace("for needle", "").replace("for need+le", "") for x in results), results
    fd = os.open(str(work / "pipe"), os.O_RDONLY | os.O_NONBLOCK)  # release the writer ourselves
    try:
        assert wait_for(lambda: released, timeout=10)
    finally:
        os.close(fd)
    thread.join(timeout=10)


def test_special_files_inside_a_tree_that_is_walked_copied_moved_and_deleted(cli, fake):
    work = cli.workdir
    (work / "d" / "deep").mkdir(parents=True)
    (work / "d" / "a.txt").write_text("needle\n")
    sock = _plant_specials(work / "d" / "deep")
    try:
        os.symlink("deep/fifo", str(work / "d" / "lf"))
        cli.use(fake)
        started = time.monotonic()
        r, results = run_calls(cli, fake, [
            tool_call("grep", pattern="needle"), tool_call("grep", pattern="ne+dle", path="d"),
            tool_call("list_directory", path="d", recursive=True), tool_call("find_path", glob="**/*"),
            tool_call("copy_path", source_path="d", destination_path="copy"),
            tool_call("move_path", source_path="copy", destination_path="moved"),
            tool_call("delete_path", path="moved", recursive=True),
            tool_call("delete_path", path="d/deep/fifo")], timeout=60)
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - started < 45
        grep_all, grep_re, listing, found, copy, move, delete, delete_fifo = results
        for g in (grep_all, grep_re):
            assert g.startswith("d/a.txt:1: needle") and "skipped 5 special files" in g, g
        for name in SPECIALS:
            assert "d/deep/" + name in listing and "d/deep/" + name in found
        assert copy.startswith("Copied d to copy") and "skipped 4 special files" in copy, copy
        assert sorted(os.listdir(str(work / "d" / "deep"))) == sorted(SPECIALS[1:])
        assert move.startswith("Moved copy to moved") and delete.startswith("Deleted moved")
        assert delete_fifo == "Deleted d/deep/fifo (1 item)"
        assert not (work / "moved").exists() and not (work / "copy").exists()
    finally:
        sock.close()


# -- the jail: every spelling of a way out --


def _escape_tree(work, outside):
    (outside / "secret.txt").write_text(SECRET + "\n")
    (work / "d" / "e").mkdir(parents=True)
    os.symlink(str(outside), str(work / "abs_out"))
    os.symlink("../outside", str(work / "rel_out"))
    os.symlink("/proc/self/root" + str(outside), str(work / "proc_out"))
    os.symlink("/proc/self/cwd/../outside", str(work / "cwd_out"))
    os.symlink("../../..", str(work / "d" / "e" / "up3"))
    os.symlink(str(outside / "secret.txt"), str(work / "file_out"))
    os.symlink("/dev/fd/0", str(work / "fd0"))
    os.symlink("/proc/self/environ", str(work / "env"))


ESCAPES = ["../outside/secret.txt", "d/../../outside/secret.txt", "d/e/up3/outside/secret.txt", "abs_out/secret.txt",
           "rel_out/secret.txt", "proc_out/secret.txt", "cwd_out/secret.txt", "file_out", "fd0", "env",
           "/proc/self/root{outside}/secret.txt", "/proc/self/cwd/../outside/secret.txt", "/dev/fd/0",
           "/proc/self/fd/0", "/proc/self/environ", "/dev/stdin", "{work}/../outside/secret.txt",
           "//{outside}/secret.txt", "missing/../../outside/secret.txt", "~/../outside/secret.txt",
           "abs_out/../outside/secret.txt"]


def test_no_spelling_of_a_path_out_of_the_tree_reads_or_writes_there(cli, fake, outside):
    work = cli.workdir
    _escape_tree(work, outside)
    before = snapshot(outside)
    paths = [p.format(outside=outside, work=work) for p in ESCAPES]
    calls = []
    for p in paths:
        calls += [tool_call("read_file", path=p), tool_call("write_file", path=p, content="PWN\n"),
                  tool_call("grep", pattern="SECRET", path=p), tool_call("copy_path", source_path=p, destination_path="got"),
                  tool_call("copy_path", source_path="d", destination_path=p, overwrite=True),
                  tool_call("move_path", source_path="d/e", destination_path=p + "/x"),
                  tool_call("delete_path", path=p, recursive=True), tool_call("list_directory", path=p + "/.."),
                  tool_call("edit_file", path=p, old_text="OUTSIDE", new_text="PWN")]
    cli.use(fake, max_turns=5)
    r, results = run_calls(cli, fake, calls, timeout=90)
    assert r.returncode == 0, r.stderr
    for call, result in zip(calls, results):
        assert SECRET not in result, (call, result)
        if call["name"] in ("write_file", "copy_path", "move_path", "edit_file"):
            assert result.startswith("Error: "), (call, result)
    assert snapshot(outside) == before
    assert not os.path.lexists(str(work / "got"))
    for request in fake.model_requests():
        for m in request["body"]["messages"]:
            assert SECRET not in (m.get("content") or ""), m


def test_symlink_loops_and_over_long_names_are_errors_for_every_tool(cli, fake):
    work = cli.workdir
    os.symlink("self", str(work / "self"))
    os.symlink("b", str(work / "a"))
    os.symlink("a", str(work / "b"))
    os.symlink("deep/x", str(work / "deep"))
    os.symlink("./ring/..", str(work / "ring"))
    for i in range(45):  # a chain longer than the 40 links Linux follows
        os.symlink("c%d" % (i + 1), str(work / ("c%d" % i)))
    (work / "c45").write_text("end\n")
    long_name = "n" * 256
    wide = "\u00e9" * 128  # 256 bytes in UTF-8
    long_path = "/".join(["p" * 200] * 21)
    bad = ["self", "self/x", "a", "a/x", "deep/y", "ring/x", "c0", long_name, wide, long_path, "ok/" + long_name]
    calls = []
    for p in bad:
        calls += [tool_call("read_file", path=p), tool_call("write_file", path=p + "/f", content="x"),
                  tool_call("edit_file", path=p, old_text="a", new_text="b"),
                  tool_call("list_directory", path=p), tool_call("grep", pattern="x", path=p),
                  tool_call("find_path", glob="*", path=p), tool_call("file_metadata", path=p),
                  tool_call("copy_path", source_path=p, destination_path="cp"),
                  tool_call("copy_path", source_path="c45", destination_path=p + "/f"),
                  tool_call("move_path", source_path="c45", destination_path=p + "/f"),
                  tool_call("create_directory", path=p + "/sub"), tool_call("diff_files", path1=p, path2="c45")]
    cli.use(fake)
    before = snapshot(work)
    r, results = run_calls(cli, fake, calls, timeout=90)
    assert r.returncode == 0, r.stderr
    for call, result in zip(calls, results):
        assert result.startswith("Error: "), (call, result)
        assert "unexpectedly" not in result and "Traceback" not in result, (call, result)
    assert snapshot(work) == before


def test_an_edit_deep_in_the_tree_reports_what_it_did(cli, fake):
    """A relative path under the limit whose absolute spelling is over PATH_MAX: the edit was made and then
    reported as 'path too long' (the undo bookkeeping resolved the absolute path again), so the model retried
    an edit that had been done."""
    rel = "/".join(["d" * 200] * 19) + "/f.txt"
    rel = "e" * (4080 - len(rel) - 1) + "/" + rel  # 4,080 bytes: under the limit; the absolute path is over it
    assert len(rel.encode()) < 4096 < len(str(cli.workdir).encode()) + 1 + len(rel.encode())
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path=rel, content="one\n"),
                                       tool_call("edit_file", path=rel, old_text="one", new_text="two"),
                                       tool_call("copy_path", source_path=rel, destination_path=rel + ".bak"),
                                       tool_call("delete_path", path=rel + ".bak")])
    assert r.returncode == 0, r.stderr
    write, edit, copy, delete = results
    assert write.startswith("Created ") and not edit.startswith("Error"), results
    assert edit.endswith("now read:\n     1\ttwo") and copy.startswith("Copied ") and delete.startswith("Deleted "), results
    u = cli.run("undo")
    assert u.returncode == 0, u.stderr
    fd = os.open(str(cli.workdir), os.O_RDONLY)
    try:
        parts = rel.split("/")
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        with os.fdopen(os.open(parts[-1], os.O_RDONLY, dir_fd=fd)) as fh:
            assert fh.read() == "two\n"  # the last change undone: the deleted copy is back; the edit stays
        assert os.path.lexists("/proc/self/fd/%d/%s.bak" % (fd, parts[-1]))
    finally:
        os.close(fd)


def test_policy_path_says_error_with_a_failing_exit_code(cli):
    """`xzatoma policy path` is for scripts: a loop or an over-long name is not an answer a script may take for
    'inside' (it exited 0, as for an inside path)."""
    work = cli.workdir
    os.symlink("l2", str(work / "l1"))
    os.symlink("l1", str(work / "l2"))
    os.symlink("me", str(work / "me"))
    for path in ("l1", "me/x", "x" * 256, "/".join(["y" * 250] * 17)):
        r = cli.run("policy", "path", path)
        assert r.returncode == 1 and r.stdout.startswith("error: "), (path[:40], r.returncode, r.stdout, r.stderr)
    r = cli.run("policy", "path", "fine/new.txt")
    assert r.returncode == 0 and r.stdout.startswith("inside: ")
    r = cli.run("policy", "path", "-", input="ok.txt\nl1\n")
    assert r.returncode == 1 and r.stdout.splitlines()[0].startswith("inside") and \
        r.stdout.splitlines()[1].startswith("error")


def test_names_that_begin_with_two_dots_are_inside_and_shown_relative(cli, fake):
    """`..name` and `...` are names in the tree; they were shown as absolute paths, as if outside."""
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="..name", content="a\n"),
                                       tool_call("write_file", path="sub/...", content="b\n"),
                                       tool_call("copy_path", source_path="..name", destination_path="..copy")])
    assert results == ["Created ..name (2 bytes)", "Created sub/... (2 bytes)", "Copied ..name to ..copy (1 item)"]
    assert str(cli.tmp) not in r.stdout + r.stderr


# -- copy/move destinations: a link keeps its words, not its meaning --


def test_a_link_moved_or_copied_never_comes_to_point_out_of_the_tree(cli, fake, outside):
    """`a/b/up2 -> ../..` is the working directory; moved (or copied inside a tree) two levels up, the same words
    name the directory above it: the next `cat up2/outside/secret.txt` a person, git or a build tool runs leaves
    the tree. The tools themselves never follow it out, but they must not make such a door either."""
    work = cli.workdir
    (outside / "secret.txt").write_text(SECRET + "\n")
    (work / "a" / "b" / "c").mkdir(parents=True)
    os.symlink("../..", str(work / "a" / "b" / "up2"))
    os.symlink("../../../outside/secret.txt", str(work / "a" / "b" / "c" / "o3"))
    os.symlink("c", str(work / "a" / "b" / "inner"))
    (work / "venv" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", str(work / "venv" / "bin" / "python"))
    cli.use(fake)
    r, results = run_calls(cli, fake, [
        tool_call("move_path", source_path="a/b/up2", destination_path="up2"),
        tool_call("move_path", source_path="a/b/up2", destination_path="a"),
        tool_call("move_path", source_path="a/b", destination_path="b2"),
        tool_call("copy_path", source_path="a/b", destination_path="b3"),
        tool_call("copy_path", source_path="a", destination_path="x/a"),
        tool_call("move_path", source_path="a/b", destination_path="a/deeper/still/b"),
        tool_call("copy_path", source_path="venv", destination_path="venv2"),
        tool_call("read_file", path="b3/inner/../../up2/outside/secret.txt")])
    assert r.returncode == 0, r.stderr
    move_link, move_into, move_tree, copy_tree, copy_deeper, move_deeper, copy_venv, read = results
    assert move_link == "Error: moving a/b/up2 to up2 would make the link a/b/up2 lead outside the working " \
                       "directory; not moved"
    assert move_into.startswith("Error: moving a/b/up2 to a would make the link")
    assert move_tree.startswith("Error: moving a/b to b2 would make the links b2/c/o3, b2/up2 lead outside")
    assert copy_tree.startswith("Copied a/b to b3 (3 items); left out 2 links") and "b3/up2" in copy_tree, copy_tree
    assert copy_deeper.startswith("Copied a to x/a (6 items)"), copy_deeper  # one level down: still inside
    assert move_deeper.startswith("Moved a/b to a/deeper/still/b")
    assert copy_venv.startswith("Copied venv to venv2 (3 items)")  # an absolute link means the same anywhere
    assert read.startswith("Error: ") and SECRET not in read
    for top in ("up2", "b2"):
        assert not os.path.lexists(str(work / top))
    assert sorted(os.listdir(str(work / "b3"))) == ["c", "inner"] and os.listdir(str(work / "b3" / "c")) == []
    for base, dirs, files in os.walk(str(work)):
        for name in dirs + files:
            path = os.path.join(base, name)
            if os.path.islink(path) and not os.readlink(path).startswith("/"):
                real = os.path.realpath(path)
                assert real == str(work) or real.startswith(str(work) + "/"), (path, os.readlink(path))
    u = cli.run("undo")  # the refused moves left nothing to undo; the last real change was the venv copy
    assert u.returncode == 0 and not (work / "venv2").exists(), (u.stdout, u.stderr)


# -- protected paths: every mutating tool, every way of naming them, headless and in chat --


def _repository(work):
    git = work / ".git"
    for sub in ("hooks", "objects", "refs", "worktrees/wt", "modules/sm/hooks", "info"):
        (git / sub).mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "config").write_text("[core]\n\tbare = false\n")
    (work / "wt").mkdir()
    (work / "wt" / ".git").write_text("gitdir: %s/.git/worktrees/wt\r\n" % work)  # absolute, CRLF
    (work / "sm").mkdir()
    (work / "sm" / ".git").write_text("gitdir: ../.git/modules/sm\n")
    (work / "meta2" / "hooks").mkdir(parents=True)
    (work / "sub2").mkdir()
    (work / "sub2" / ".git").write_text("gitdir:../meta2/\n")  # no space, a trailing slash
    (work / "src" / "deep" / "repo" / ".git").mkdir(parents=True)
    (work / "notes.txt").write_text("notes\n")
    (work / ".bashrc").write_text("# rc\n")
    (work / ".ssh").mkdir()
    (work / ".config" / "git").mkdir(parents=True)
    (work / "keys").mkdir()
    (work / "keys" / "k").write_text("k\n")
    os.symlink(".git", str(work / "g"))
    os.symlink(".git/hooks/pre-commit", str(work / "hookfile"))
    os.symlink(".", str(work / "here"))


PROTECTED_CALLS = [
    tool_call("write_file", path=".git/hooks/../config", content="PWN\n"),
    tool_call("write_file", path="notes/../.git/config", content="PWN\n"),
    tool_call("write_file", path=".git//hooks///post-merge", content="PWN\n"),
    tool_call("write_file", path="{work}/.git/hooks/pre-push", content="PWN\n"),
    tool_call("write_file", path="g/hooks/post-checkout", content="PWN\n"),
    tool_call("write_file", path="hookfile", content="PWN\n"),
    tool_call("write_file", path="here/here/.git/info/exclude", content="PWN\n"),
    tool_call("write_file", path="here/.BASHRC", content="PWN\n"),
    tool_call("write_file", path="wt/.git", content="gitdir: elsewhere\n"),
    tool_call("write_file", path="sm/.git", content="gitdir: elsewhere\n"),
    tool_call("write_file", path="meta2/hooks/pre-commit", content="PWN\n"),
    tool_call("write_file", path=".git/worktrees/wt/hooks/pre-commit", content="PWN\n"),
    tool_call("write_file", path=".git/modules/sm/hooks/pre-commit", content="PWN\n"),
    tool_call("write_file", path="src/deep/repo/.git/config", content="PWN\n"),
    tool_call("write_file", path="src/deep/repo/.GIT./hooks/pre-commit", content="PWN\n"),
    tool_call("write_file", path=".Bash_Profile", content="PWN\n"),
    tool_call("write_file", path=".zlogin", content="PWN\n"),
    tool_call("write_file", path=".ssh/authorized_keys", content="ssh-ed25519 AAAA attacker\n"),
    tool_call("write_file", path=".gnupg/gpg-agent.conf", content="PWN\n"),
    tool_call("write_file", path=".aws/config", content="PWN\n"),
    tool_call("write_file", path=".config/git/config", content="PWN\n"),
    tool_call("write_file", path="keys/new", content="PWN\n"),
    tool_call("write_file", path="Keys/../keys/k", content="PWN\n"),
    tool_call("edit_file", path="g/config", old_text="bare", new_text="fsmonitor = touch pwned #"),
    tool_call("edit_file", path=".bashrc", old_text="# rc", new_text="touch pwned"),
    tool_call("move_path", source_path=".git", destination_path="gitbak"),
    tool_call("move_path", source_path="src", destination_path="src2"),
    tool_call("move_path", source_path="src/deep", destination_path="deep"),
    tool_call("move_path", source_path="notes.txt", destination_path=".git/hooks/pre-push"),
    tool_call("move_path", source_path="notes.txt", destination_path="here/.bashrc", overwrite=True),
    tool_call("move_path", source_path=".bashrc", destination_path="bashrc.old"),
    tool_call("move_path", source_path="notes.txt", destination_path="g/hooks"),
    tool_call("move_path", source_path="wt", destination_path="wt2"),
    tool_call("move_path", source_path="keys/k", destination_path="k2"),
    tool_call("move_path", source_path="keys", destination_path="keys2"),
    tool_call("copy_path", source_path="notes.txt", destination_path="g/hooks/"),
    tool_call("copy_path", source_path="notes.txt", destination_path=".ssh"),
    tool_call("copy_path", source_path="notes.txt", destination_path=".profile"),
    tool_call("copy_path", source_path="notes.txt", destination_path=".bashrc", overwrite=True),
    tool_call("copy_path", source_path="src", destination_path="src3"),
    tool_call("delete_path", path="src/deep", recursive=True),
    tool_call("delete_path", path="src", recursive=True),
    tool_call("delete_path", path="sm", recursive=True),
    tool_call("delete_path", path="wt", recursive=True),
    tool_call("delete_path", path="sub2/.git"),
    tool_call("delete_path", path=".ssh"),
    tool_call("delete_path", path=".config", recursive=True),
    tool_call("delete_path", path="g/hooks", recursive=True),
    tool_call("delete_path", path="hookfile/.."),
    tool_call("create_directory", path=".git/hooks/x"),
    tool_call("create_directory", path="g/info/sub"),
    tool_call("create_directory", path="new/.git"),
    tool_call("create_directory", path="new/.Hg"),
    tool_call("create_directory", path=".ssh/sub"),
]


def test_every_change_to_a_protected_path_is_refused_headless_however_it_is_named(cli, fake):
    work = cli.workdir
    _repository(work)
    calls = [dict(c, arguments={k: v.format(work=work) if isinstance(v, str) else v
                                for k, v in c["arguments"].items()}) for c in PROTECTED_CALLS]
    before = snapshot(work)
    cli.use(fake, tools={"protected_paths": ["./keys/"]})
    for extra in ((), ("--allow-dangerous",)):
        r, results = run_calls(cli, fake, calls, *extra, timeout=120)
        assert r.returncode == 0, r.stderr
        for call, result in zip(calls, results):
            assert result.startswith("Error: ") and result.endswith(HEADLESS), (call, result)
        assert snapshot(work) == before


def test_protected_questions_come_after_an_always_in_safe_mode_and_name_the_subagent(cli, fake):
    """[a]lways for write_file covers ordinary writes only: a protected path is asked every time, in Safe mode,
    in YOLO, and from a subagent (its label in the question)."""
    from ptyrun import PtyProcess
    from test_subagents import subagent_brain
    work = cli.workdir
    _repository(work)
    (work / "plain.txt").write_text("before\n")  # an overwrite: Safe mode asks
    writes = {"hook it": [tool_call("write_file", path="g/hooks/post-merge", content="#!/bin/sh\ntouch pwned\n")]}
    state = {"turn": 0}
    brain = subagent_brain(tool_call("subagent", label="helper", task_prompt="hook it"),
                           child_tools=lambda task: writes[task])

    def script(body):
        msgs = body["messages"]
        if "You are a subagent" in msgs[1]["content"]:
            return brain(body)
        users = [m for m in msgs if m["role"] == "user"]
        last = users[-1]["content"]
        if msgs[-1]["role"] == "user":
            state["turn"] += 1
            if "ordinary" in last:
                return {"tool_calls": [tool_call("write_file", path="plain.txt", content="ok\n")]}
            if "hook" in last:
                return {"tool_calls": [tool_call("write_file", path=".git/hooks/pre-commit", content="touch pwned\n")]}
            if "rc" in last:
                return {"tool_calls": [tool_call("edit_file", path="here/.bashrc", old_text="# rc", new_text="touch pwned")]}
            if "delegate" in last:
                return {"tool_calls": [tool_call("subagent", label="helper", task_prompt="hook it")]}
        return {"content": "turn done"}
    fake.generator = script
    cli.use(fake)
    p = PtyProcess(cli.command("chat", "--mode", "write"), dict(cli.env, TERM="xterm"), str(work))
    try:
        p.expect(r"\[WRITE\]\[SAFE\] >> ")
        p.line("an ordinary write")
        p.expect(r"Allow write_file\?")
        p.expect(r"ne\[v\]er this session > ")
        p.line("a")
        p.expect("turn done")
        p.expect(r"\[WRITE\]\[SAFE\] >> ")
        p.line("a hook")
        p.expect(r"Allow write_file\? write_file \.git/hooks/pre-commit changes \.git, a protected path")
        p.expect(r"\+touch pwned")
        p.expect(r"\[y\]es / \[n\]o")
        p.line("n")
        p.expect("turn done")
        p.expect(r"\[WRITE\]\[SAFE\] >> ")
        p.line("/yolo")
        p.expect(r"\[WRITE\]\[YOLO\] >> ")
        p.line("the rc file")
        p.expect(r"Allow edit_file\? edit_file \.bashrc changes \.bashrc, a protected path")
        p.line("n")
        p.expect("turn done")
        p.expect(r"\[WRITE\]\[YOLO\] >> ")
        p.line("delegate")
        p.expect(r"Allow write_file\? \[subagent helper\] write_file \.git/hooks/post-merge changes \.git")
        p.line("n")
        p.expect(r"\[WRITE\]\[YOLO\] >> ")
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    assert (work / "plain.txt").read_text() == "ok\n"
    assert os.listdir(str(work / ".git" / "hooks")) == [] and (work / ".bashrc").read_text() == "# rc\n"


# -- where the jail is home or /: refused unless named, and protected when named --


def _refused(r):
    lines = r.stderr.strip().splitlines()
    return r.returncode == 2 and r.stdout == "" and len(lines) == 1 and "--working-dir" in lines[0] \
        and "refusing" in lines[0]


def test_home_and_root_are_refused_however_home_is_spelled(cli, fake):
    cli.use(fake)
    link = cli.tmp / "homelink"
    os.symlink(str(cli.home), str(link))
    for env in ({}, {"HOME": str(cli.home) + "/"}, {"HOME": str(link)}, {"HOME": str(cli.home) + "/./"}):
        for where in (cli.home, link, "/"):
            r = cli.run("run", "--prompt", "go", env=env, cwd=where)
            assert _refused(r), (env, where, r.returncode, r.stderr)
            r = cli.run("chat", env=env, cwd=where, input="")
            assert _refused(r), (env, where, r.returncode, r.stderr)
    r = cli.run("run", "--prompt", "go", "--working-dir", "", cwd=cli.home)  # an empty name is no name
    assert _refused(r), r.stderr
    assert fake.model_requests() == []


def test_root_named_deliberately_still_protects_home(cli, fake):
    """`--working-dir /` on purpose: the whole filesystem is the jail, and the person's start-up files, keys and
    XZATOMA_HOME in it are protected like any other (headless: refused)."""
    home = cli.home
    (home / ".ssh").mkdir()
    (home / ".bashrc").write_text("# mine\n")
    cli.use(fake)
    r, results = run_calls(cli, fake, [
        tool_call("write_file", path=str(home / ".ssh" / "authorized_keys"), content="k\n"),
        tool_call("edit_file", path=str(home / ".bashrc")[1:], old_text="# mine", new_text="touch pwned"),
        tool_call("write_file", path=str(cli.xz_home / "config.yaml"), content="x: 1\n"),
        tool_call("delete_path", path=str(home), recursive=True),
        tool_call("move_path", source_path=str(home / ".ssh"), destination_path=str(cli.tmp / "ssh-moved")),
        tool_call("write_file", path=str(cli.tmp / "scratch.txt"), content="ok\n")],
        "--working-dir", "/")
    assert r.returncode == 0, r.stderr
    for result in results[:2] + results[3:4]:
        assert result.endswith(HEADLESS), results
    assert "is inside XZATOMA_HOME" in results[2], results  # hidden from every tool, not only protected
    assert results[4].startswith("Error: ") and results[5].startswith("Created "), results
    assert (home / ".bashrc").read_text() == "# mine\n" and os.listdir(str(home / ".ssh")) == []


# -- copy and move onto the working directory, a parent of the source, or into the source --


def test_copy_and_move_never_replace_the_tree_or_swallow_their_source(cli, fake):
    work = cli.workdir
    (work / "a" / "b" / "c").mkdir(parents=True)
    (work / "a" / "b" / "c" / "f.txt").write_text("f\n")
    (work / "d" / "e").mkdir(parents=True)
    (work / "keep.txt").write_text("keep\n")
    os.symlink(".", str(work / "here"))
    os.symlink("../..", str(work / "d" / "e" / "up2"))
    os.symlink(str(work), str(work / "absroot"))
    os.symlink("a", str(work / "la"))
    os.symlink("a/b", str(work / "lb"))
    onto_root = ["", " ", ".", "./", "here", "here/", "here/here/.", "d/..", "d/e/up2", "d/e/up2/",
                 "absroot", "la/..", "lb/../..", str(work), str(work) + "/", "/proc/self/cwd"]
    calls = []
    for dest in onto_root:
        for tool in ("copy_path", "move_path"):
            calls.append(tool_call(tool, source_path="a", destination_path=dest, overwrite=True))
            calls.append(tool_call(tool, source_path=dest or ".", destination_path="zz", overwrite=True)
                         if tool == "copy_path" else tool_call(tool, source_path=".", destination_path="zz"))
    swallow = [("move_path", "a/b/c", "a"), ("move_path", "a/b/c", "la"), ("move_path", "a/b/c", "lb/.."),
               ("copy_path", "a/b", "a/b/c/.."), ("copy_path", "a/b", "la"),
               ("move_path", "a", "a/b/c/new"), ("move_path", "a", "lb/new"), ("copy_path", "a", "la/b/c/new"),
               ("copy_path", "la", "a/inner"), ("move_path", "a/b", "lb/x/y")]
    for tool, src, dst in swallow:
        calls.append(tool_call(tool, source_path=src, destination_path=dst, overwrite=True))
    cli.use(fake)
    before = snapshot(work)
    r, results = run_calls(cli, fake, calls, timeout=120)
    assert r.returncode == 0, r.stderr
    for call, result in zip(calls, results):
        assert result.startswith("Error: "), (call, result)
        assert any(w in result for w in ("working directory itself", "contains the source", "inside itself",
                                         "are the same")), (call, result)
    assert snapshot(work) == before


def test_deleting_a_link_to_a_directory_removes_only_the_link_however_it_is_named(cli, fake, outside):
    work = cli.workdir
    (work / "data" / "sub").mkdir(parents=True)
    (work / "data" / "sub" / "keep.txt").write_text("keep\n")
    (work / ".git" / "hooks").mkdir(parents=True)
    for name, target in (("l1", "data"), ("l2", "data/sub"), ("l3", str(work / "data")), ("l4", str(outside)),
                         ("l5", ".git"), ("l6", "../outside"), ("l7", "l1")):
        os.symlink(target, str(work / name))
    cli.use(fake)
    r, results = run_calls(cli, fake, [
        tool_call("delete_path", path="l1/", recursive=True), tool_call("delete_path", path="l2/."),
        tool_call("delete_path", path="./l3", recursive=True), tool_call("delete_path", path=str(work / "l4") + "/",
                                                                         recursive=True),
        tool_call("delete_path", path="l5", recursive=True), tool_call("delete_path", path="l6/", recursive=True),
        tool_call("delete_path", path="l7", recursive=True)])
    assert r.returncode == 0, r.stderr
    for name, result in zip(("l1", "l2", "l3", "l4", "l5", "l6", "l7"), results):
        assert result == "Deleted %s (1 item)" % name, results
    assert (work / "data" / "sub" / "keep.txt").read_text() == "keep\n"
    assert sorted(os.listdir(str(outside))) == ["victim.txt"] and (work / ".git" / "hooks").is_dir()
    assert sorted(os.listdir(str(work))) == [".git", "data"]


def test_a_working_directory_inside_xzatoma_home_is_hidden_whole(cli, fake):
    """`--working-dir $XZATOMA_HOME` (or a directory in it): the tools refused changes there, but read_file gave the
    model credentials.json and undo.key (commands find an empty tmpfs there). Every tool now refuses every path."""
    key = "sk-proj-" + "k3y" * 12
    cli.use(fake)
    fake.add({"content": "first"})
    assert cli.run("run", "--prompt", "remember 4242-ALPHA").returncode == 0  # makes the history and undo key
    (cli.xz_home / "credentials.json").write_text('{"openai": "%s"}' % key)
    os.chmod(str(cli.xz_home / "credentials.json"), 0o600)
    (cli.xz_home / "cache").mkdir(exist_ok=True)
    calls = [tool_call("read_file", path="credentials.json"), tool_call("list_directory", path=".", recursive=True),
             tool_call("grep", pattern="sk-proj", fixed_string=True), tool_call("find_path", glob="**"),
             tool_call("file_metadata", path="undo.key"), tool_call("copy_path", source_path="credentials.json",
                                                                    destination_path="c.json"),
             tool_call("read_file", path="../xzhome/credentials.json"), tool_call("write_file", path="x.txt", content="x")]
    for where in (cli.xz_home, cli.xz_home / "cache"):
        r, results = run_calls(cli, fake, calls, "--working-dir", str(where))
        assert r.returncode == 0, r.stderr
        for call, result in zip(calls, results):
            assert result.startswith("Error: ") and ("XZATOMA_HOME" in result or "outside" in result), (call, result)
            assert key not in result and "4242" not in result
    assert not (cli.xz_home / "c.json").exists() and not (cli.xz_home / "x.txt").exists()


def _deep_tree(top, depth):
    """top/d/d/…/d/f.txt, `depth` levels: made descriptor by descriptor (the path is far over PATH_MAX)."""
    fd = os.open(str(top), os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        with os.fdopen(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
            fh.write("needle\n")
    finally:
        os.close(fd)


def _deep_file(top, depth):
    fd = os.open(str(top), os.O_RDONLY)
    try:
        for _ in range(depth):
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        with os.fdopen(os.open("f.txt", os.O_RDONLY, dir_fd=fd)) as fh:
            return fh.read()
    finally:
        os.close(fd)


def test_a_tree_deeper_than_the_recursion_limit_is_copied_moved_deleted_and_restored_whole(cli, fake):
    """copy_path and delete_path recursed once per level: at ~990 levels they stopped with RecursionError,
    the copy left half made and the delete refused."""
    import resource
    import subprocess
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:  # a copy holds a descriptor per level of the copy it makes (the CLI inherits this limit)
        if hard != resource.RLIM_INFINITY and hard < 4096:
            pytest.skip("too few file descriptors allowed (%d) for a 1,200-level tree" % hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    work = cli.workdir
    (work / "deep").mkdir()
    try:
        _deep_tree(work / "deep", 1200)
        cli.use(fake)
        r, results = run_calls(cli, fake, [
            tool_call("copy_path", source_path="deep", destination_path="copy"),
            tool_call("move_path", source_path="copy", destination_path="moved"),
            tool_call("delete_path", path="moved", recursive=True),
            tool_call("delete_path", path="deep", recursive=True)], timeout=120)
        assert r.returncode == 0, r.stderr
        assert results == ["Copied deep to copy (1202 items)", "Moved copy to moved (1202 items)",
                           "Deleted moved (1202 items)", "Deleted deep (1202 items)"], results
        assert os.listdir(str(work)) == []
        u = cli.run("undo", timeout=120)
        assert u.returncode == 0, u.stderr
        assert _deep_file(work / "deep", 1200) == "needle\n"
    finally:  # pytest's own clean-up of old tmp dirs (shutil.rmtree) recurses per level too
        subprocess.run(["rm", "-rf", str(work)], check=False)


def test_configured_protected_paths_hold_however_they_are_written(cli, fake):
    """agent.tools.protected_paths as people write them: relative with ./ or a trailing slash, absolute, from
    ~, and globs, absolute ones included (those were dropped without a word: `/abs/project/*.key` protected
    nothing)."""
    work = cli.workdir
    (work / "conf").mkdir()
    (work / "conf" / "prod.yaml").write_text("a: 1\n")
    cli.use(fake, tools={"protected_paths": [
        "./secrets/", str(work / "conf" / "prod.yaml"), str(work) + "/*.key", "/**/*.crt",
        "~/../work/deploy/**", str(work / "ops") + "/*/token", "*.PEM"]})
    r, results = run_calls(cli, fake, [
        tool_call("write_file", path="secrets/a.txt", content="x"),
        tool_call("edit_file", path="conf/prod.yaml", old_text="1", new_text="2"),
        tool_call("write_file", path="id.key", content="x"),
        tool_call("write_file", path="certs/site.crt", content="x"),
        tool_call("write_file", path="deploy/prod/env", content="x"),
        tool_call("write_file", path="ops/eu/token", content="x"),
        tool_call("write_file", path="tls/server.pem", content="x"),
        tool_call("move_path", source_path="conf", destination_path="conf2"),
        tool_call("write_file", path="ops/eu/readme", content="fine\n")])
    assert r.returncode == 0, r.stderr
    for result in results[:-1]:
        assert result.endswith(HEADLESS), results
    assert results[-1] == "Created ops/eu/readme (5 bytes)"
    assert sorted(os.listdir(str(work))) == ["conf", "ops"] and (work / "conf" / "prod.yaml").read_text() == "a: 1\n"


# -- every tool and the run's deadline --


def test_a_terabyte_sparse_text_file_is_read_counted_and_copied_at_once(cli, fake):
    """A text head, then a terabyte hole (`truncate -s 1T`, free to make): read_file and file_metadata read every
    zero to count lines (minutes; only --timeout stopped them). Holes hold no newline: they are skipped."""
    work = cli.workdir
    with open(str(work / "huge.txt"), "wb") as fh:
        fh.write(b"hello\n" * 2000)
        fh.seek((1 << 40) - 6)
        fh.write(b"\ntail\n")
    cli.use(fake)
    started = time.monotonic()
    r, results = run_calls(cli, fake, [
        tool_call("read_file", path="huge.txt", start_line=1999, end_line=2000),
        tool_call("read_file", path="huge.txt", start_line=2002),
        tool_call("read_file", path="huge.txt", start_line=2001, end_line=2001),
        tool_call("file_metadata", path="huge.txt"),
        tool_call("copy_path", source_path="huge.txt", destination_path="copy.txt"),
        tool_call("grep", pattern="tail", path="huge.txt")], "--timeout", "30", timeout=90)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 25
    head, tail, hole, meta, copy, grep = results
    assert head.startswith("hello\nhello\n") and "of 2002" not in head, head
    assert tail == "tail\n", tail[:200]
    assert hole.rstrip("\n").endswith("... [line truncated]") and len(hole) < 70000, hole[-100:]
    assert "lines: 2002" in meta and copy == "Copied huge.txt to copy.txt (1 item)", (meta, copy)
    assert grep.startswith("no matches"), grep  # grep reads the first 64 MB of a file, by design
    assert os.stat(str(work / "copy.txt")).st_blocks < 1024


# -- races: a directory swapped for a link to outside while tools create, move, copy and delete under it --


def test_a_swap_race_never_lets_a_copy_move_or_delete_touch_outside(cli, fake, outside):
    from test_file_safety import renameat2_libc, swap_while_running
    libc = renameat2_libc()
    work = cli.workdir
    (work / "d" / "tree" / "in").mkdir(parents=True)
    (work / "d" / "tree" / "in" / "f.txt").write_text("inside\n")
    (work / "d" / "f.txt").write_text("inside\n")
    for name in ("tree", "made", "moved", "copied"):
        (outside / name).mkdir()
        (outside / name / "keep.txt").write_text("OUTSIDE\n")
    (outside / "f.txt").write_text("OUTSIDE\n")
    os.symlink(str(outside), str(work / "lnk"))
    before = snapshot(outside)
    turn = [tool_call("create_directory", path="d/made/x"),
            tool_call("copy_path", source_path="d/tree", destination_path="d/copied", overwrite=True),
            tool_call("move_path", source_path="d/copied", destination_path="d/moved", overwrite=True),
            tool_call("delete_path", path="d/moved", recursive=True),
            tool_call("delete_path", path="d/made", recursive=True),
            tool_call("write_file", path="d/f.txt", content="inside\n"),
            tool_call("copy_path", source_path="d/f.txt", destination_path="d/tree/in/f.txt", overwrite=True)]
    fake.add(*[{"tool_calls": turn} for _ in range(30)])
    fake.add({"content": "done"})
    cli.use(fake, max_turns=100)
    proc = cli.popen("run", "--prompt", "go")
    out, err = swap_while_running(libc, proc, work / "d", work / "lnk")
    assert proc.returncode == 0, err
    assert snapshot(outside) == before


def test_xzatoma_home_in_the_tree_is_hidden_in_every_spelling_a_filesystem_may_fold(tmp_path):
    """On a filesystem that folds names (macOS, Windows, ext4 casefold) `.XZ/credentials.json` opens the home's
    credentials; the protected paths were compared folded, the hidden home was not."""
    from xzatoma_tools import Jail, ToolError
    root = tmp_path / "work"
    for spelling in (".xz", ".XZ", ".Xz.", "\uff0exz"):  # on this filesystem: distinct directories
        (root / spelling).mkdir(parents=True)
        (root / spelling / "credentials.json").write_text("{}")
    jail = Jail(str(root), hidden=[str(root / ".xz")])
    for spelling in (".xz", ".XZ", ".Xz.", "\uff0exz"):
        with pytest.raises(ToolError) as err:
            jail.resolve(spelling + "/credentials.json")
        assert "XZATOMA_HOME" in str(err.value)
        assert jail.hides(str(root / spelling))
    assert not jail.hides(str(root / "xz"))
    inside = Jail(str(root / ".XZ"), hidden=[str(root / ".xz")])  # a jail inside it, spelled otherwise
    with pytest.raises(ToolError):
        inside.resolve("credentials.json")


def test_a_tool_stopped_by_the_deadline_has_changed_nothing_and_recorded_nothing(tmp_path):
    """Past the run's deadline, delete_path still walked the tree to count it, checked the undo cap, scanned for
    protected paths and saved a whole snapshot before its first check; move_path renamed without any."""
    from xzatoma_store import Store
    from xzatoma_tools import ToolContext, build_registry
    root = tmp_path / "work"
    for i in range(20):
        (root / "tree" / ("d%02d" % i)).mkdir(parents=True)
        for j in range(20):
            (root / "tree" / ("d%02d" % i) / ("f%02d.txt" % j)).write_text("x\n")
    before = snapshot(root)
    store = Store(str(tmp_path / "u.db")).open()
    ctx = ToolContext(str(root), {}, store=store, conversation_id=None, deadline=time.monotonic() - 1)
    reg = build_registry("write", ctx)
    for name, args in (("delete_path", {"path": "tree", "recursive": True}),
                       ("move_path", {"source_path": "tree", "destination_path": "moved"}),
                       ("copy_path", {"source_path": "tree", "destination_path": "copy"})):
        result = reg.execute(name, args)
        assert result.error == "%s stopped: the run's time limit was reached" % name, (name, result.to_message())
    assert snapshot(root) == before
    assert store.undo_records() == []


def test_no_spelling_of_the_working_directory_can_be_deleted(cli, fake):
    work = cli.workdir
    (work / "d" / "e").mkdir(parents=True)
    (work / "keep.txt").write_text("keep\n")
    os.symlink("../..", str(work / "d" / "e" / "up2"))
    spellings = ["", " ", ".", "./", "d/..", "d/e/../..", str(work), str(work) + "/", str(work) + "/.",
                 "/proc/self/cwd", "/proc/self/cwd/", "d/e/up2/d/.."]
    cli.use(fake)
    before = snapshot(work)
    r, results = run_calls(cli, fake, [tool_call("delete_path", path=p, recursive=True) for p in spellings])
    assert r.returncode == 0, r.stderr
    assert results == ["Error: refusing to delete the working directory itself"] * len(spellings), results
    assert snapshot(work) == before


def test_policy_path_gives_the_tools_verdict_on_xzatoma_home_in_the_tree(cli):
    """`policy path` said 'inside … protected' for credentials the tools refuse to touch at all."""
    cli.env["XZATOMA_HOME"] = str(cli.workdir / ".xz")
    (cli.workdir / ".xz").mkdir()
    r = cli.run("policy", "path", ".XZ/credentials.json")
    assert r.returncode == 1 and r.stdout.startswith("error: ") and "XZATOMA_HOME" in r.stdout, (r.stdout, r.stderr)
    r = cli.run("policy", "path", "src/main.py")
    assert r.returncode == 0 and r.stdout.startswith("inside: "), r.stdout
