"""The working-directory jail's resolver, in-process and table-driven, with openat2 and without."""

import os
import threading

import pytest

import xzatoma_tools
from xzatoma_tools import (Jail, JailError, PathError, ToolContext, ToolError, build_registry, path_verdict,
                           protected_paths)


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


def test_protected_paths_contract(tmp_path):
    root = str(tmp_path)
    paths = protected_paths(root, xzatoma_home=str(tmp_path / "xzh"), extra=["deploy/keys", "/elsewhere"])
    for name in (".git", ".bashrc", ".profile", ".zshrc", ".ssh", ".gnupg", ".aws", ".config/git", "xzh",
                 "deploy/keys"):
        assert os.path.join(root, name) in paths
    assert all(p.startswith(root + "/") for p in paths)  # only what lies under the root


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
