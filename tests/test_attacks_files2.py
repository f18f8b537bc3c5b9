"""A second red-team pass over the file tools, the jail, protected paths, hostile bytes and secrets
(issue 12): tool calls from the fake model against real trees, with harmless payloads. Each test here
failed on the code before its fix."""

import os

import pytest

from conftest import tool_call
from test_file_safety import HEADLESS, outside, run_calls, snapshot  # noqa: F401 (outside is a fixture)


# -- undo: a person's command must not be turned into a write the agent could not make --


def test_undo_never_restores_through_a_link_planted_since(cli, fake):
    """The agent writes a/pre-commit and deletes it; a later `git pull` (here: the test) turns a/ into a link
    to .git/hooks. `xzatoma undo` restored the deleted payload *into .git/hooks*, where no tool may write."""
    work = cli.workdir
    (work / ".git" / "hooks").mkdir(parents=True)
    (work / "a").mkdir()
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("write_file", path="a/pre-commit", content="#!/bin/sh\ntouch pwned\n"),
                                       tool_call("delete_path", path="a/pre-commit")])
    assert r.returncode == 0 and results[1] == "Deleted a/pre-commit (1 item)", (r.stderr, results)
    os.rmdir(str(work / "a"))
    os.symlink(".git/hooks", str(work / "a"))
    for flags in ((), ("--force",)):
        u = cli.run("undo", *flags)
        assert u.returncode == 1, (u.stdout, u.stderr)
        assert "not restored" in u.stderr and len(u.stderr.strip().splitlines()) == 1, u.stderr
    assert os.listdir(str(work / ".git" / "hooks")) == []
