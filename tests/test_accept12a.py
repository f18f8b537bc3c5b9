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
    assert "+two" in edit and copy.startswith("Copied ") and delete.startswith("Deleted "), results
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
