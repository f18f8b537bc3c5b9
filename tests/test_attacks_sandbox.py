"""The sandbox's walls of issue 23, attacked as a prompt-injected model would: a script it runs with
--allow-dangerous, so that only the kernel stands in the way. Harmless payloads: marker files, a System V
segment, a kernel key and unix sockets the test owns, and files of its own outside the working directory.
Then the other side: everyday commands still run (over-blocking stays under 10%)."""

import ctypes
import errno
import os
import socket
import subprocess
import sys

import pytest

from conftest import configure, run_commands, script
from xzatoma_tools import (FULL, Confinement, Sandbox, ToolContext, build_registry, git_dirs, landlock_abi,
                           program_dirs, sandbox_rules, trusted_realpath)

pytestmark = pytest.mark.skipif(not landlock_abi(), reason="the kernel has no Landlock: nothing to attack")

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
#: add_key and keyctl by architecture
KEY_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine)
IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0
KEY_SPEC_SESSION_KEYRING, KEYCTL_READ, KEYCTL_UNLINK, KEYCTL_SEARCH = -3, 11, 9, 10


def syscall(*args):
    result = LIBC.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result, ctypes.get_errno() if result == -1 else 0


def report_lines(out, prefix):
    return dict(line.split("=", 1) for line in out.splitlines() if line.startswith(prefix) and "=" in line)


# ---- objects the kernel does not put behind a path: System V IPC and the keyring ----

@pytest.mark.skipif(KEY_CALLS is None, reason="keyring syscall numbers unknown for this architecture")
def test_host_ipc_objects_and_kernel_keys_are_out_of_reach_and_nothing_planted_outlives_the_run(cli, fake):
    add_key, keyctl = KEY_CALLS
    key = 0x5A7A0000 | (os.getpid() & 0xFFFF)
    body = ("import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\n"
            "def call(*a):\n"
            "    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a])\n"
            "    return '%%d/%%d' %% (r, ctypes.get_errno() if r == -1 else 0)\n"
            "key = %d\n"
            "print('host-shm=%%d/%%d' %% (libc.shmget(key, 0, 0), ctypes.get_errno()))\n"
            "print('own-shm=%%s' %% (libc.shmget(key + 1, 4096, 0o1666) >= 0))\n"
            "print('own-msg=%%s' %% (libc.msgget(key + 2, 0o1666) >= 0))\n"
            "buf = ctypes.create_string_buffer(64)\n"
            "print('read-key=' + call(%d, %d, int(sys.argv[1]), buf, 64), buf.value)\n"
            "print('search-key=' + call(%d, %d, -3, b'user', b'xz-host-key-%d', 0))\n"
            "print('session=' + call(%d, 0, -3, 0))\n"
            "print('keys-listed=%%d' %% open('/proc/keys').read().count('xz-host-key'))\n"
            "for ring in (-3, -4, -5):\n"
            "    print('plant%%d=' %% ring + call(%d, b'user', b'xz-planted-%d', b'P', 1, ring))\n"
            % (key, keyctl, KEYCTL_READ, keyctl, KEYCTL_SEARCH, os.getpid(), keyctl, add_key, os.getpid()))
    shmid = LIBC.shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0o666)  # readable by anyone: only a namespace stands
    serial, _ = syscall(add_key, b"user", b"xz-host-key-%d" % os.getpid(), b"HOST-KEY-4731", 13, KEY_SPEC_SESSION_KEYRING)
    try:
        assert shmid >= 0 and serial > 0, os.strerror(ctypes.get_errno())
        configure(cli, fake)
        r, [out] = run_commands(cli, fake, "python3 %s %d" % (script(cli, "ipc.py", body).split()[1], serial))
        got = report_lines(out, ("host-shm", "own-", "read-key", "search-key", "session", "plant"))
        assert got["host-shm"] == "-1/%d" % errno.ENOENT, out  # not refused: not there at all
        assert got["own-shm"] == got["own-msg"] == "True", out  # IPC itself works, in a namespace of its own
        assert got["read-key"].startswith("-1/") and "HOST-KEY" not in out, out
        assert got["search-key"].startswith("-1/") and got["session"].startswith("-1/"), out
        assert report_lines(out, ("keys-listed",)) == {"keys-listed": "0"}, out  # not even by name
        assert [got["plant%d" % ring] for ring in (-3, -4, -5)] == ["-1/%d" % errno.EACCES] * 3, out
        # what the run made is gone with it; what the host had is untouched
        assert LIBC.shmget(key + 1, 0, 0) == -1 and LIBC.msgget(key + 2, 0) == -1
        buf = ctypes.create_string_buffer(64)
        assert syscall(keyctl, KEYCTL_READ, serial, buf, 64)[0] == 13 and buf.value == b"HOST-KEY-4731"
        assert syscall(keyctl, KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user",
                       b"xz-planted-%d" % os.getpid(), 0)[1] == errno.ENOKEY
    finally:
        LIBC.shmctl(shmid, IPC_RMID, None)
        for get, ctl, k in ((LIBC.shmget, LIBC.shmctl, key + 1), (LIBC.msgget, LIBC.msgctl, key + 2)):
            leaked = get(k, 0, 0) if get is LIBC.shmget else get(k, 0)  # only where the wall failed
            if leaked >= 0:
                ctl(leaked, IPC_RMID, None)
        syscall(keyctl, KEYCTL_UNLINK, serial, KEY_SPEC_SESSION_KEYRING)
        for ring in (-3, -4, -5):  # only where the wall failed
            planted, _ = syscall(keyctl, KEYCTL_SEARCH, ring, b"user", b"xz-planted-%d" % os.getpid(), 0)
            if planted > 0:
                syscall(keyctl, KEYCTL_UNLINK, planted, ring)


# ---- unix sockets by name, whatever call reaches them ----

def test_no_unix_socket_a_command_holds_can_be_pointed_at_a_name(cli, fake):
    """socket(AF_UNIX) was refused, but socketpair(AF_UNIX, SOCK_DGRAM) then sendto()/connect() reached any
    named datagram socket (/dev/log, journald). Listeners the test owns, outside the tree and inside it."""
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(str(cli.tmp / "log.sock"))
    inside = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inside.bind(str(cli.workdir / "dev.sock"))  # a host process's socket in the working directory
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(str(cli.tmp / "bus.sock"))
    stream.listen(4)
    names = [str(cli.tmp / "log.sock"), "dev.sock", str(cli.tmp / "bus.sock")]
    body = ("import socket\n"
            "names = %r\n"
            "def attempt(label, fn):\n"
            "    try:\n"
            "        fn()\n"
            "        print(label + '=reached')\n"
            "    except OSError as exc:\n"
            "        print(label + '=%%d' %% exc.errno)\n"
            "for kind in ('SOCK_DGRAM', 'SOCK_RAW'):\n"
            "    attempt('pair-' + kind, lambda: [s.sendto(b'PWN', n) for s in socket.socketpair(socket.AF_UNIX, "
            "getattr(socket, kind)) for n in names])\n"
            "a, b = socket.socketpair()\n"
            "a.send(b'pair-ok'); print(b.recv(16).decode())\n"
            "c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
            "for i, n in enumerate(names):\n"
            "    attempt('stream-sendto%%d' %% i, lambda: a.sendto(b'PWN', n))\n"
            "    attempt('stream-connect%%d' %% i, lambda: a.connect(n))\n"
            "    attempt('seq-connect%%d' %% i, lambda: c.connect(n))\n"
            "    c.sendto(b'to-peer', n)  # a connected seqpacket pair ignores the name\n"
            "    attempt('dgram%%d' %% i, lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'PWN', n))\n"
            "print('peer', d.recv(16), d.recv(16), d.recv(16))\n" % names)
    try:
        configure(cli, fake)
        r, [out] = run_commands(cli, fake, "python3 " + script(cli, "sock.py", body).split()[1])
        for s in (dgram, inside, stream):
            s.setblocking(False)
        with pytest.raises(BlockingIOError):
            dgram.recv(16)
        with pytest.raises(BlockingIOError):
            inside.recv(16)
        with pytest.raises(BlockingIOError):
            stream.accept()
    finally:
        for s in (dgram, inside, stream):
            s.close()
    got = report_lines(out, ("pair-", "stream-", "seq-", "dgram"))
    assert got and "reached" not in got.values(), out
    assert got["pair-SOCK_DGRAM"] == got["pair-SOCK_RAW"] == str(errno.EACCES), out
    assert "pair-ok" in out and "peer b'to-peer' b'to-peer' b'to-peer'" in out, out


# ---- metadata outside the writable roots ----

def test_chmod_setuid_utime_and_xattrs_fail_on_every_file_outside_the_writable_roots(cli, fake):
    tools = cli.tmp / "tools" / "bin"  # on PATH: granted for reading, as a program's directory is
    tools.mkdir(parents=True)
    prog = tools / "prog"
    prog.write_text("#!/bin/sh\necho prog\n")
    prog.chmod(0o755)
    outside = cli.tmp / "outside.txt"  # not even readable to commands
    outside.write_text("outside\n")
    own = cli.workdir / "own.sh"
    own.write_text("#!/bin/sh\necho own\n")
    targets = [str(prog), str(outside), str(tools)]
    before = {t: (os.stat(t).st_mode, os.stat(t).st_mtime_ns, os.listxattr(t)) for t in targets}
    body = ("import os\n"
            "for i, p in enumerate(%r + ['own.sh']):\n"
            "    for label, fn in (('chmod', lambda: os.chmod(p, 0o777)), ('utime', lambda: os.utime(p, (0, 0))),\n"
            "                      ('setuid', lambda: os.chmod(p, 0o4755)),\n"
            "                      ('xattr', lambda: os.setxattr(p, 'user.pwn', b'1')),\n"
            "                      ('chown', lambda: os.chown(p, os.getuid(), os.getgid())),\n"
            "                      ('link', lambda: os.link(p, 'linked%%d' %% i)),\n"
            "                      ('rename', lambda: os.rename(p, p + '.moved'))):\n"
            "        try:\n"
            "            fn(); print('%%s%%d=done' %% (label, i))\n"
            "        except OSError as exc:\n"
            "            print('%%s%%d=%%d' %% (label, i, exc.errno))\n"
            "for label, fn in (('suid-chmod', lambda: os.chmod('own.sh.moved', 0o4755)),\n"  # in the tree either:
            "                  ('sgid-open', lambda: os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o2755))),\n"
            "                  ('suid-mknod', lambda: os.mknod('node', 0o104755))):\n"  # the host knows the uid
            "    try:\n"
            "        fn(); print(label + '=done')\n"
            "    except OSError as exc:\n"
            "        print('%%s=%%d' %% (label, exc.errno))\n" % targets)
    configure(cli, fake)
    env = {"PATH": "%s:%s" % (tools, os.environ["PATH"])}
    r, [out] = run_commands(cli, fake, "python3 " + script(cli, "meta.py", body).split()[1], env=env)
    got = report_lines(out, ("chmod", "utime", "xattr", "chown", "link", "rename", "setuid"))
    for i in range(len(targets)):
        assert all(got[op + str(i)] != "done" for op in ("chmod", "utime", "xattr", "chown", "rename", "setuid")), out
        assert not os.path.lexists(str(cli.workdir / ("linked%d" % i)))
    for t in targets:
        assert (os.stat(t).st_mode, os.stat(t).st_mtime_ns, os.listxattr(t)) == before[t], t
    # inside the tree the same calls are everyday work, but for setuid and setgid bits
    assert got["chmod3"] == got["utime3"] == "done" and os.stat(str(cli.workdir / "own.sh.moved")).st_mode & 0o777 \
        == 0o777, out
    suid = report_lines(out, ("suid-", "sgid-"))
    assert suid and set(suid.values()) == {str(errno.EPERM)}, out
    assert not [f for f in os.listdir(str(cli.workdir)) if os.stat(str(cli.workdir / f)).st_mode & 0o6000]


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


# ---- running as root: what only root may read stays so ----

@pytest.mark.skipif(os.getuid() != 0, reason="only a run as root has root's files to keep")
def test_as_root_files_only_root_may_read_stay_unreadable_and_the_tree_stays_the_commands(cli, fake):
    tools = cli.tmp / "tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "token").write_text("ROOT-ONLY-4733\n")
    (tools / "token").chmod(0o600)
    (cli.workdir / "mine.txt").write_text("mine\n")
    (cli.workdir / "mine.txt").chmod(0o600)
    subprocess.run(["git", "init", "-q", str(cli.workdir)], check=True)
    configure(cli, fake)
    env = {"PATH": "%s:%s" % (tools, os.environ["PATH"])}
    body = ("cat %s; cat /etc/shadow; ls /root; echo uid=$(id -u)\n"
            "cat mine.txt && echo made > made.txt && chmod 600 made.txt && echo WRITE-OK\n"
            "git status --short >/dev/null && echo GIT-OK\n" % (tools / "token"))
    r, [out] = run_commands(cli, fake, script(cli, "root.sh", body), env=env)
    assert "ROOT-ONLY-4733" not in out and "root:" not in out, out
    assert out.count("Permission denied") == 3, out
    assert "uid=0" in out and "mine\n" in out and "WRITE-OK" in out and "GIT-OK" in out, out
    made = os.stat(str(cli.workdir / "made.txt"))
    assert (made.st_uid, made.st_gid) == (0, 0)  # what commands make is root's, as the person's files are
    policy = cli.run("policy", "sandbox").stdout
    assert "root-only files: closed: commands are root inside, nobody to the kernel" in policy, policy


# ---- resource limits ----

def test_processes_memory_and_file_size_are_limited_as_configured(cli, fake):
    configure(cli, fake, terminal={"limits": {"processes": 40, "memory_mb": 200, "file_size_mb": 1}})
    body = ("head -c 3000000 /dev/zero > big; echo big=$?; wc -c < big\n"
            "python3 -c 'b = bytearray(400 << 20)' 2>/dev/null; echo mem=$?\n"
            "python3 -c 'b = bytearray(50 << 20); print(\"small-ok\")'\n"
            "python3 -c '\nimport subprocess\nstarted = []\nfor i in range(60):\n    try:\n"
            "        started.append(subprocess.Popen([\"sleep\", \"30\"]))\n    except OSError:\n        pass\n"
            "print(\"started=%d\" % len(started))'\n")
    r, [out] = run_commands(cli, fake, script(cli, "limits.sh", body))
    assert "big=153" in out or "big=1" in out, out  # SIGXFSZ (128 + 25), or EFBIG where it is ignored
    assert os.path.getsize(str(cli.workdir / "big")) <= 1 << 20
    assert "mem=1" in out and "small-ok" in out, out
    started = int(report_lines(out, ("started",))["started"])
    assert 0 < started < 40, out
    policy = cli.run("policy", "sandbox").stdout
    assert "limits: 40 processes, 200 MB of memory per process, files up to 1 MB" in policy, policy


# ---- what `policy sandbox` says, wall by wall ----

def test_policy_sandbox_names_each_wall_and_what_is_missing(cli):
    out = cli.run("policy", "sandbox").stdout
    for line in ("ipc: a namespace of its own", "keyring: a fresh session keyring", "metadata: read-only outside",
                 "root-only files: closed", "limits: 4096 processes", "unix sockets: none reachable by name",
                 "read grants: never derived", "not enforced here: nothing this mode needs"):
        assert ("\n" + line) in out, (line, out)
    cli.write_config({"agent": {"terminal": {"sandbox_assume_missing": ["readonly-view", "seccomp", "idmap"]}}})
    out = cli.run("policy", "sandbox").stdout
    missing = [line for line in out.splitlines() if line.startswith("not enforced here:")][0]
    assert "read-only metadata outside the writable roots" in missing
    assert "keeping the kernel keyring out of reach" in missing and "unix sockets" in missing
    assert ("keeping files only root may read" in missing) == (os.getuid() == 0)


# ---- everyday commands still run ----

EVERYDAY = [
    "ls -la", "grep -rn 'def ' src", "sed -i 's/old/new/' src/app.py && grep -c new src/app.py",
    "find . -name '*.py' | sort", "wc -l README.md", "head -3 README.md; tail -1 README.md", "du -sh src",
    "git status --short", "git log --oneline -3", "git diff --stat", "git show --stat HEAD", "git branch -a",
    "git grep -n old", "git blame README.md", "git stash list",
    "git init -q fresh && cd fresh && git -c user.email=a@b -c user.name=n commit -q --allow-empty -m x && git log",
    "python3 -c 'print(sum(range(10)))'", "python3 -m unittest discover -s tests -q",
    "python -m pytest -q -p no:cacheprovider tests",
    "python3 -c 'import multiprocessing as m; print(m.Pool(2).map(abs, [-1, -2]))'",
    "python3 -c \"import sqlite3; c = sqlite3.connect('db.sqlite'); c.execute('create table t(x)'); print('ok')\"",
    "python3 -c 'import tempfile; print(tempfile.mkstemp())'",
    "python3 -c 'import subprocess; print(subprocess.run([\"echo\", \"hi\"], capture_output=True).stdout)'",
    "python3 -c 'import asyncio; asyncio.run(asyncio.sleep(0)); print(\"loop\")'",
    "python3 -m venv --without-pip venv2 && venv2/bin/python -c 'import sys; print(sys.prefix)'",
    "python -m pip --version", "python -m venv --without-pip --system-site-packages v3 && v3/bin/python -m pip "
                               "install -q --no-index --no-deps ./demo-1.0-py3-none-any.whl && v3/bin/python -c "
                               "'import demo; print(demo.X)'",
    "make", "make -j2 clean all", "npm test", "node -e 'console.log(1 + 1)'",
    "printf 'int main(void){return 0;}' > a.c && cc a.c -o a.out && ./a.out && echo built",
    "tar czf $TMPDIR/src.tgz src && tar tzf $TMPDIR/src.tgz", "zip -qr $TMPDIR/a.zip src && unzip -l $TMPDIR/a.zip",
    "sort README.md | uniq -c | awk '{print $1}' | head -2", "echo a b c | xargs -n1 echo",
    "chmod +x run.sh && ./run.sh", "ln -sf src link && ls link/", "mkdir -p a/b && mv a/b c && rm -rf a c",
    "cp -r src src2 && diff -ru src src2 && rm -rf src2", "diff -u README.md README.md && echo same",
    "echo '{\"a\": 1}' | jq .a", "touch $TMPDIR/.x && ls -a $TMPDIR", "env | sort | head -3", "date +%Y",
    "which python3", "file src/app.py", "xxd README.md | head -1", "sh -c 'sleep 0.1 & wait' && echo waited",
    "perl -e 'print 42'", "java -version",
]


def everyday_tree(root):
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def old():\n    return 'old'\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_app.py").write_text("import unittest\n\nclass T(unittest.TestCase):\n"
                                                "    def test_x(self):\n        self.assertTrue(True)\n")
    (root / "README.md").write_text("# demo\nold\nold\n")
    (root / "Makefile").write_text("all: build/out.txt\nbuild/out.txt:\n\tmkdir -p build && echo ok > $@\n"
                                   "clean:\n\trm -rf build\n")
    (root / "package.json").write_text('{"name": "demo", "version": "1.0.0", "scripts": {"test": "node t.js"}}')
    (root / "t.js").write_text("console.log('npm-ok')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    import zipfile
    with zipfile.ZipFile(str(root / "demo-1.0-py3-none-any.whl"), "w") as whl:  # a wheel: nothing to build
        for name, text in (("demo.py", "X = 1\n"), ("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\n"
                                                                                 "Version: 1.0\n"),
                           ("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                        "Tag: py3-none-any\n"),
                           ("demo-1.0.dist-info/RECORD", "demo.py,,\ndemo-1.0.dist-info/METADATA,,\n"
                                                         "demo-1.0.dist-info/WHEEL,,\ndemo-1.0.dist-info/RECORD,,\n")):
            whl.writestr(name, text)
    git = ["git", "-C", str(root), "-c", "user.email=a@b", "-c", "user.name=n"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)


def test_everyday_commands_still_run_in_the_sandbox(tmp_path):
    """Each command of the list that works unconfined must work confined; the sandbox may refuse under
    10% of them (the issue's bar), and the ones it refuses are named."""
    environ = dict(os.environ, PATH="%s:%s" % (os.path.dirname(sys.executable), os.environ.get("PATH", "")))
    results = {}
    for mode in ("off", "workspace-write"):
        root = tmp_path / mode
        everyday_tree(root)
        sandbox = Sandbox(str(root), mode, environ=environ)
        ctx = ToolContext(Confinement(str(root), terminal={"timeout_seconds": 120, "max_timeout_seconds": 120},
                                      sandbox=sandbox), {}, autonomy=FULL)
        reg = build_registry("write", ctx)
        try:
            results[mode] = {c: reg.execute("terminal", {"command": c, "timeout_seconds": 120}) for c in EVERYDAY}
        finally:
            sandbox.close()
    usable = [c for c in EVERYDAY if results["off"][c].output.startswith("exit code: 0")]
    refused = [c for c in usable if not results["workspace-write"][c].output.startswith("exit code: 0")]
    assert len(usable) >= len(EVERYDAY) // 2, [results["off"][c].output for c in EVERYDAY if c not in usable]
    print("everyday: %d of %d usable commands refused by the sandbox: %s" % (len(refused), len(usable), refused))
    assert len(refused) < 0.1 * len(usable), "\n\n".join(results["workspace-write"][c].output for c in refused)
