"""Project instructions (AGENTS.md): found from the git root down, nearest last, read through the jail and capped,
skipped where others can write them, and given to subagents and chat too. The CLI against the fake model server."""

import os

from conftest import tool_call


def system_text(fake, index=0):
    """The system prompt and the environment message after it (where AGENTS.md goes)."""
    return "\n".join(m["content"] for m in fake.model_requests()[index]["body"]["messages"][:2])


def test_agents_md_from_the_git_root_down_nearest_last(cli, fake):
    repo = cli.tmp / "repo"
    sub = repo / "pkg" / "sub"
    sub.mkdir(parents=True)
    (repo / ".git").mkdir()
    (cli.tmp / "AGENTS.md").write_text("ABOVE THE REPO: never shown\n")  # above the git root
    (repo / "AGENTS.md").write_text("Use tabs. REPO-RULE\n")
    (sub / "AGENTS.md").write_text("In this package use spaces. SUB-RULE\n")
    (sub / "CLAUDE.md").symlink_to("AGENTS.md")  # the same file under another name: once
    (repo / ".github").mkdir()
    (repo / ".github" / "copilot-instructions.md").write_text("COPILOT-RULE\n")
    cli.use(fake, instructions_files=["AGENTS.md", "CLAUDE.md", ".github/copilot-instructions.md"])
    fake.add({"content": "ok"})
    r = cli.run("--verbose", "run", "-C", sub, "--prompt", "x")
    assert r.returncode == 0, r.stderr
    prompt = system_text(fake)
    assert "ABOVE THE REPO" not in prompt
    assert prompt.index("REPO-RULE") < prompt.index("COPILOT-RULE") < prompt.index("SUB-RULE")
    assert prompt.count("SUB-RULE") == 1
    assert "--- ../../AGENTS.md ---" in prompt and "--- AGENTS.md ---" in prompt
    assert "project instructions: ../../AGENTS.md, ../../.github/copilot-instructions.md, AGENTS.md" in r.stderr


def test_instructions_are_read_through_the_jail_and_capped(cli, fake, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-KEY-MATERIAL\n")
    (cli.workdir / "AGENTS.md").symlink_to(secret)
    (cli.workdir / "CLAUDE.md").write_text("A" * 300 + "TAIL-NEVER-SENT")
    (cli.workdir / "fifo.md").parent.mkdir(exist_ok=True)
    os.mkfifo(str(cli.workdir / "fifo.md"))  # a reader would block forever on a FIFO
    (cli.tmp / "AGENTS.md").write_text("SHARED-PARENT: no git root or home above, so never read\n")
    cli.use(fake, instructions_files=["AGENTS.md", "fifo.md", "CLAUDE.md"], instructions_max_bytes=100)
    fake.add({"content": "ok"})
    r = cli.run("--verbose", "run", "--prompt", "x", timeout=20)
    assert r.returncode == 0, r.stderr
    prompt = system_text(fake)
    assert "SECRET-KEY-MATERIAL" not in prompt and "SHARED-PARENT" not in prompt
    assert "A" * 100 in prompt and "A" * 101 not in prompt and "TAIL-NEVER-SENT" not in prompt
    assert "AGENTS.md skipped: it leads outside" in r.stderr
    assert "fifo.md skipped: not a regular file" in r.stderr
    assert "CLAUDE.md cut at agent.instructions_max_bytes" in r.stderr


def test_parent_instructions_others_can_write_are_skipped(cli, fake):
    work = cli.home / "project"  # no git root: the walk stops at the home directory
    work.mkdir()
    (cli.home / "AGENTS.md").write_text("HOME-RULE\n")
    (cli.home / "AGENTS.md").chmod(0o666)
    (work / "AGENTS.md").write_text("PROJECT-RULE\n")
    cli.use(fake)
    fake.add({"content": "ok"}, {"content": "ok"})
    r = cli.run("--verbose", "run", "--prompt", "x", cwd=work)
    assert "PROJECT-RULE" in system_text(fake) and "HOME-RULE" not in system_text(fake)
    assert "../AGENTS.md skipped: others can write it" in r.stderr
    (cli.home / "AGENTS.md").chmod(0o644)
    cli.run("run", "--prompt", "x", cwd=work)
    assert system_text(fake, 1).index("HOME-RULE") < system_text(fake, 1).index("PROJECT-RULE")


def test_subagents_and_chat_get_the_instructions_too(cli, fake):
    (cli.workdir / "AGENTS.md").write_text("Always answer in French. FRENCH-RULE\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("subagent", label="look", task_prompt="look around")]},
             {"content": "sub done"}, {"content": "summary"}, {"content": "fini"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    assert all("FRENCH-RULE" in system_text(fake, i) for i in range(4))
    from ptyrun import PtyProcess
    fake.add({"content": "bonjour"})
    p = PtyProcess(cli.command("chat"), dict(cli.env, TERM="xterm"), str(cli.workdir))
    try:
        p.expect(r"\[PLANNING\]\[SAFE\] >> ")
        p.line("/status")
        p.expect(r"Instructions: +AGENTS\.md")
        p.line("salut")
        p.expect("bonjour")
        p.expect(r"\[PLANNING\]\[SAFE\] >> ")
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    assert "FRENCH-RULE" in system_text(fake, -1)


def test_a_credential_quoted_in_agents_md_reaches_the_model_redacted(cli, fake):
    """Round 19d: read_file of AGENTS.md gave the model [REDACTED], the instructions block the key itself."""
    key = "qZ7xKp2LmN9vR4tW8yB3cD6fG1hJ5kLs"
    (cli.workdir / "AGENTS.md").write_text("Deploys use the token %s. Use tabs.\n" % key)
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="AGENTS.md")]}, {"content": "ok"})
    r = cli.run("run", "--prompt", "hello", env={"MY_SERVICE_TOKEN": key})
    assert r.returncode == 0, r.stderr
    sent = fake.model_requests()[-1]["body"]["messages"]
    assert not any(key in m["content"] for m in sent), sent
    assert "Deploys use the token [REDACTED]. Use tabs." in system_text(fake)
