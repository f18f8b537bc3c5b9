"""The working-directory jail: its resolver in-process and table-driven, with openat2 and without; then every spelling
of a way out of the tree, through tool calls from the fake model against a real tree (the CLI as a subprocess)."""

import os
import threading

import pytest

import xzatoma_tools
from conftest import run_calls, snapshot, tool_call
from xzatoma_tools import Jail, JailError, PathError, ToolContext, ToolError, build_registry, path_verdict


@pytest.fixture(params=["openat2", "walk"])
def mode(request):
    """Every resolver test runs through openat2 (where the kernel has it) and the portable walk."""
    xzatoma_tools.use_openat2(request.param == "openat2")
    yield request.param
    xzatoma_tools.use_openat2(True)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "README.md").write_text("hi\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    links = {
        "rel_in": "src/pkg", "abs_in": str(root / "src"), "up_in": "src/pkg/../../README.md",
        "rel_out": "../outside/secret.txt", "abs_out": str(outside), "to_root": ".", "dangling": "nowhere/file",
        "loop_a": "loop_b", "loop_b": "loop_a", "self": "self", "chain1": "chain2", "chain2": "rel_out",
        "deep_up": "src/../../root/README.md",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    os.symlink("../../README.md", root / "src" / "pkg" / "back")
    os.symlink("../../..", root / "src" / "pkg" / "escape")
    return root


LONG = "n" * 256

# path, follow, expected: a path relative to the root, or an exception class (and words of its message)
CASES = [
    (".", True, "."), ("", True, "."), ("src", True, "src"), ("src/", True, "src"), ("./src/./pkg", True, "src/pkg"),
    ("src/pkg/mod.py", True, "src/pkg/mod.py"), ("src/pkg/../../README.md", True, "README.md"),
    ("rel_in/mod.py", True, "src/pkg/mod.py"), ("abs_in/pkg/mod.py", True, "src/pkg/mod.py"),
    ("up_in", True, "README.md"), ("to_root/src", True, "src"), ("to_root", True, "."),
    ("dangling", True, "nowhere/file"), ("new/deeper/file.txt", True, "new/deeper/file.txt"),
    ("src/missing/../pkg/mod.py", True, "src/pkg/mod.py"), ("src/pkg/back", True, "README.md"),
    ("deep_up", True, (JailError, "outside")), ("src/pkg/escape/..", True, (JailError, "outside")),
    ("src/pkg/escape", True, (JailError, "outside")), ("src/pkg/escape/root/README.md", True, (JailError, "outside")),
    ("..", True, (JailError, "outside")), ("../outside/secret.txt", True, (JailError, "outside")),
    ("src/../..", True, (JailError, "outside")), ("rel_out", True, (JailError, "outside")),
    ("abs_out/secret.txt", True, (JailError, "outside")), ("chain1", True, (JailError, "outside")),
    ("/etc/passwd", True, (JailError, "outside")), ("~/x", True, (JailError, "home paths")),
    ("src/\x00", True, (JailError, "NUL")),
    ("loop_a", True, (PathError, "too many levels of symbolic links")),
    ("self/x", True, (PathError, "too many levels of symbolic links")),
    (LONG, True, (PathError, "file name too long")), ("src/" + LONG + "/x", True, (PathError, "file name too long")),
    ("a/" * 2100, True, (PathError, "path too long")),
    ("README.md/x", True, (ToolError, "not a directory")),
    # follow=False: the last component is the link itself (delete, move, metadata)
    ("rel_out", False, "rel_out"), ("loop_a", False, "loop_a"), ("rel_in", False, "rel_in"),
    ("rel_in/mod.py", False, "src/pkg/mod.py"), ("abs_out/secret.txt", False, (JailError, "outside")),
]


@pytest.mark.parametrize("path,follow,expected", CASES, ids=[repr(c[0])[:40] + ("" if c[1] else "-nofollow")
                                                            for c in CASES])
def test_resolve_table(tree, mode, path, follow, expected):
    jail = Jail(str(tree))
    if isinstance(expected, tuple):
        with pytest.raises(expected[0]) as err:
            jail.resolve(path, follow=follow).close()
        assert expected[1] in str(err.value)
        return
    with jail.resolve(path, follow=follow) as target:
        assert target.real == os.path.normpath(os.path.join(jail.root, expected))
        st = target.lstat()
        if st is not None:  # the descriptor and name really are that entry
            assert (st.st_dev, st.st_ino) == (lambda s: (s.st_dev, s.st_ino))(os.lstat(target.real))


def test_absolute_paths_inside_are_relative(tree, mode):
    jail = Jail(str(tree))
    with jail.resolve(str(tree / "src" / "pkg" / "mod.py")) as target:
        assert target.real.endswith("src/pkg/mod.py")
    # the root spelled through a symlink still names the root
    alias = tree.parent / "alias"
    os.symlink(tree, alias)
    with jail.resolve(str(alias / "README.md")) as target:
        assert target.real == os.path.join(jail.root, "README.md")


def test_make_parents_refuses_a_symlink_planted_after_the_check(tree, mode):
    jail = Jail(str(tree))
    target = jail.resolve("fresh/sub/file.txt")
    try:
        assert target.missing == ["fresh", "sub"]
        os.symlink(str(tree.parent / "outside"), tree / "fresh")  # the attacker wins the race to create it
        with pytest.raises(OSError):
            target.make_parents()
    finally:
        target.close()
    assert sorted(os.listdir(tree.parent / "outside")) == ["secret.txt"]


def test_policy_path_verdicts(tree, mode):
    assert path_verdict("loop_a", str(tree)) == ("error", "too many levels of symbolic links: loop_a")
    verdict, reason = path_verdict(LONG, str(tree))
    assert verdict == "error" and "file name too long: 256 bytes" in reason
    assert path_verdict("rel_out", str(tree))[0] == "outside"
    assert path_verdict("rel_in/mod.py", str(tree)) == ("inside", "resolves to src/pkg/mod.py")


def test_swap_race_never_leaves_the_tree(tmp_path, mode):
    """A directory swapped for a symlink to outside, over and over, while tools read and write through it."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (root / "d" / "f.txt").write_text("inside\n")
    (outside / "f.txt").write_text("OUTSIDE-SECRET\n")
    reg = build_registry("write", ToolContext(str(root), {}))
    stop = threading.Event()
    swaps = [0]

    exchange = _exchange()
    os.symlink(str(outside), str(root / "lnk"))

    def swapper():
        d, lnk = str(root / "d"), str(root / "lnk")
        while not stop.is_set() and swaps[0] < 200000:
            exchange(d, lnk)  # d becomes the link to outside, atomically, and then the directory again
            exchange(d, lnk)
            swaps[0] += 1
    t = threading.Thread(target=swapper)
    t.start()
    results = []
    try:
        for i in range(600):
            results.append(reg.execute("read_file", {"path": "d/f.txt"}))
            results.append(reg.execute("write_file", {"path": "d/w%d.txt" % (i % 5), "content": "w\n"}))
            results.append(reg.execute("edit_file", {"path": "d/f.txt", "old_text": "inside", "new_text": "inside"}))
            results.append(reg.execute("grep", {"pattern": "SECRET", "path": "d"}))
            results.append(reg.execute("list_directory", {"path": "d"}))
    finally:
        stop.set()
        t.join()
    assert swaps[0] > 100  # the race really ran
    assert sorted(os.listdir(outside)) == ["f.txt"] and (outside / "f.txt").read_text() == "OUTSIDE-SECRET\n"
    for r in results:
        assert "OUTSIDE-SECRET" not in r.to_message()
    assert any(r.success for r in results[::5])  # reads did work between swaps


def _exchange():
    """renameat2(RENAME_EXCHANGE): swap two names atomically, so `d` is always there, a dir or a link."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this libc")

    def exchange(a, b):
        if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
    return exchange


def test_tools_stop_at_the_runs_deadline(tmp_path):
    import time
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("needle\n")
    reg = build_registry("write", ToolContext(str(root), {}, deadline=time.monotonic() - 1))
    for name, args in (("grep", {"pattern": "needle"}), ("find_path", {"glob": "**/*.txt"}),
                       ("list_directory", {"recursive": True}), ("copy_path", {"source_path": "a", "destination_path": "c"}),
                       ("delete_path", {"path": "a", "recursive": True}), ("read_file", {"path": "a/b/f.txt"})):
        r = reg.execute(name, args)
        assert r.error == "%s stopped: the run's time limit was reached" % name, (name, r.to_message())
    assert (root / "a" / "b" / "f.txt").exists()
    live = build_registry("write", ToolContext(str(root), {}, deadline=time.monotonic() + 60))
    assert live.execute("grep", {"pattern": "needle"}).output == "a/b/f.txt:1: needle"


def test_undo_restores_through_the_jail(tmp_path):
    """A directory swapped for a link to outside after the change: undo never writes through it."""
    from xzatoma_store import Store
    from xzatoma_tools import UndoError, undo_change
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "f.txt").write_text("original\n")
    store = Store(str(tmp_path / "u.db")).open()
    reg = build_registry("write", ToolContext(str(root), {}, store=store, conversation_id="C"))
    assert reg.execute("read_file", {"path": "sub/f.txt"}).success
    assert reg.execute("write_file", {"path": "sub/f.txt", "content": "changed\n"}).success
    os.rename(str(root / "sub"), str(root / "aside"))
    os.symlink(str(outside), str(root / "sub"))
    record = store.undo_records()[0]
    with pytest.raises(UndoError) as err:
        undo_change(store, record, force=True, root=str(root))
    assert "outside" in str(err.value)
    with pytest.raises(UndoError) as err:  # without a stored working directory: the record's own parent
        undo_change(store, record, force=True)
    assert "a symlink now stands in its path" in str(err.value)
    assert os.listdir(str(outside)) == []


def test_the_walk_holds_a_bounded_number_of_directories_and_climbs_back_only_the_way_it_came(tmp_path):
    """walk_at keeps _WALK_OPEN directories open; deeper, it goes back up by `..`, and only while that is the
    directory it came down from: one moved away meanwhile stops the walk (ESTALE), never walks elsewhere."""
    import errno
    from xzatoma_tools import _WALK_OPEN, walk_at
    names = ["d%d" % i for i in range(_WALK_OPEN + 8)]
    deep = tmp_path.joinpath("t", *names)
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    (tmp_path / "t" / "d0" / "z").write_text("after the deep branch")
    fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        before = len(os.listdir("/proc/self/fd"))
        seen = []
        for rel, _, _, _, _ in walk_at(fd, "t"):
            seen.append(rel)
            if rel.endswith("/f"):
                assert len(os.listdir("/proc/self/fd")) - before <= _WALK_OPEN + 1
        assert seen == [""] + ["/".join(names[:i + 1]) for i in range(len(names))] + [
            "/".join(names + ["f"]), "d0/z"]
        walk = walk_at(fd, "t")
        for rel, _, _, _, _ in walk:
            if rel.endswith("/f"):
                os.rename(str(tmp_path / "t" / "d0" / "d1"), str(tmp_path / "elsewhere"))
                break
        with pytest.raises(OSError) as caught:
            list(walk)
        assert caught.value.errno == errno.ESTALE
    finally:
        os.close(fd)


# ---- end to end: tool calls from the fake model against a real tree ----


SECRET = "OUTSIDE-SECRET-5150"


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


def test_names_that_begin_with_two_dots_are_inside_and_shown_relative(cli, fake):
    """`..name` and `...` are names in the tree; they were shown as absolute paths, as if outside."""
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="..name", content="a\n"),
                                       tool_call("write_file", path="sub/...", content="b\n"),
                                       tool_call("copy_path", source_path="..name", destination_path="..copy")])
    assert results == ["Created ..name (2 bytes)", "Created sub/... (2 bytes)", "Copied ..name to ..copy (1 item)"]
    assert str(cli.tmp) not in r.stdout + r.stderr


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
