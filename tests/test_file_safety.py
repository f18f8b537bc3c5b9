"""The file tools' safety end to end: tool calls from the fake model against real trees, harmless payloads."""

import os
import socket
import stat
import threading
import time

import pytest

from conftest import needs_landlock, run_calls, snapshot, tool_call, wait_for


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
    r, results = run_calls(cli, fake, [tool_call("read_file", path="notes.txt"),
                                       tool_call("write_file", path="notes.txt", content="beta\n"),
                                       tool_call("edit_file", path="notes.txt", old_text="beta", new_text="gamma"),
                                       tool_call("write_file", path="new.txt", content="fresh\n")])
    assert r.returncode == 0, r.stderr
    assert results[1] == ("Overwrote notes.txt (5 bytes; it had 6 before: its whole content was replaced). "
                          "Its content before was:\nalpha")
    assert results[3] == "Created new.txt (6 bytes)"
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


@needs_landlock
def test_the_audit_log_never_follows_a_link_or_opens_a_fifo(tmp_path):
    from xzatoma_tools import AuditLog
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    os.symlink(str(victim), str(tmp_path / "linked.log"))
    os.mkfifo(str(tmp_path / "fifo.log"))
    for name in ("linked.log", "fifo.log"):
        with pytest.raises(OSError):
            AuditLog(str(tmp_path / name)).record(str(tmp_path), "echo hi", "exit:0", 0.1, "allow")
    assert victim.read_text() == "victim\n"


# ---- special files: FIFOs, sockets, devices ----


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
    # git takes no repository here (no HEAD): it says so, or the command waits for a person
    assert results[1].startswith("Error: ") or "needs a person" in results[1] or \
        "not a git repository" in results[1], results


# ---- copy, move and delete: destinations, links, deep trees, races ----


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


def test_a_swap_race_never_lets_a_copy_move_or_delete_touch_outside(cli, fake, outside):
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


def test_the_fingerprint_after_a_move_stops_at_the_deadline_and_undo_then_asks_for_force(tmp_path):
    """After move_path and copy_path the tree was hashed whole with no deadline: 300 sparse 63 MB files ran a
    run 50 s past --timeout 5 (round 19b). The hash stops there; undo then wants --force, not a guess."""
    from xzatoma_store import Store
    from xzatoma_tools import ToolContext, UndoError, build_registry, undo_change
    root = tmp_path / "work"
    (root / "big").mkdir(parents=True)
    for i in range(100):
        with open(root / "big" / ("f%03d" % i), "wb") as fh:
            fh.truncate(63 << 20)  # holes: nothing on disk, 6 GB of zeros to hash
    store = Store(str(tmp_path / "u.db")).open()
    ctx = ToolContext(str(root), {}, store=store, conversation_id=None, deadline=time.monotonic() + 1)
    started = time.monotonic()
    result = build_registry("write", ctx).execute("move_path", {"source_path": "big", "destination_path": "big2"})
    assert result.success, result.to_message()
    assert time.monotonic() - started < 4
    record = store.undo_records()[0]
    with pytest.raises(UndoError, match="time limit"):
        undo_change(store, record, root=str(root))
    assert (root / "big2").is_dir()
    assert undo_change(store, record, force=True, root=str(root)).startswith("moved")
    assert (root / "big").is_dir() and not (root / "big2").exists()


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


def test_hard_link_to_outside_is_never_written_through(cli, fake, outside):
    work = cli.workdir
    os.link(str(outside / "victim.txt"), str(work / "hl.txt"))
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("read_file", path="hl.txt"),
                                       tool_call("write_file", path="hl.txt", content="x\n"),
                                       tool_call("edit_file", path="hl.txt", old_text="x", new_text="y")])
    assert r.returncode == 0, r.stderr
    assert (outside / "victim.txt").read_text() == "untouched\n"
    assert (work / "hl.txt").read_text() == "y\n"


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


# ---- sparse and huge files ----


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


def test_copying_a_sparse_file_does_not_fill_the_disk(cli, fake):
    """A 4 KB sparse file of 8 GB apparent size (`truncate -s`, a tar --sparse) copied with copy_path was
    written out as 8 GB of real zeros, a minute of I/O and the disk's free space."""
    work = cli.workdir
    with open(str(work / "sparse.bin"), "wb") as fh:
        fh.write(b"head\n")
        fh.seek(4 << 30)
        fh.write(b"middle\n")
        fh.truncate(8 << 30)
    if os.stat(str(work / "sparse.bin")).st_blocks * 512 > 1 << 20:
        pytest.skip("this filesystem does not keep holes")
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("copy_path", source_path="sparse.bin", destination_path="copy.bin")],
                           timeout=60)
    assert r.returncode == 0, r.stderr
    assert results == ["Copied sparse.bin to copy.bin (1 item)"]
    copy = str(work / "copy.bin")
    assert os.path.getsize(copy) == 8 << 30 and os.stat(copy).st_blocks * 512 < 16 << 20
    with open(copy, "rb") as fh:
        assert fh.read(5) == b"head\n"
        fh.seek(4 << 30)
        assert fh.read(7) == b"middle\n"
        fh.seek((4 << 30) - 4096)
        assert fh.read(4096) == b"\0" * 4096
