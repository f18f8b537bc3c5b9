"""XZATOMA_HOME inside the working directory (`--working-dir ~`, or XZATOMA_HOME=./.xz) is hidden from the
file tools as it is from commands: its credentials, every project's conversations, the undo data and key.

The attacker is a prompt-injected model that knows where the home is and asks for it every way it can.
"""

import json

from conftest import tool_call
from test_file_safety import tool_results

HIDDEN = "is inside XZATOMA_HOME"


def test_no_file_tool_reads_lists_copies_or_changes_the_home_inside_the_tree(cli, fake):
    home = cli.workdir / ".xz"
    cli.env["XZATOMA_HOME"] = str(home)
    key = "sk-proj-hiddenhomekey0123456789abcdef"
    cli.use(fake, provider="openai")
    cli.env["OPENAI_API_KEY"] = key
    (cli.workdir / "data").mkdir()
    (cli.workdir / "notes.txt").write_text("see .xz\n")
    fake.add({"content": "first run: fills the history"})
    assert cli.run("run", "--prompt", "remember the launch code 4242-ALPHA").returncode == 0
    assert (home / "conversations.db").exists()
    (cli.workdir / "via").symlink_to(".xz")
    calls = [
        tool_call("read_file", path=".xz/conversations.db"),
        tool_call("read_file", path="via/credentials.json"),
        tool_call("grep", pattern="4242-ALPHA", fixed_string=True),
        tool_call("grep", pattern="launch", path=".xz"),
        tool_call("list_directory", path=".", recursive=True),
        tool_call("find_path", glob="**/conversations.db"),
        tool_call("copy_path", source_path=".xz", destination_path="data/copy"),
        tool_call("file_metadata", path=".xz/undo.key"),
        tool_call("write_file", path=".xz/config.yaml", content="x"),
        tool_call("delete_path", path=".xz"),
    ]
    fake.add({"tool_calls": calls}, {"content": "done"})
    r = cli.run("run", "--prompt", "look around")
    assert r.returncode == 0, r.stderr
    (read_db, read_creds, grep_all, grep_home, listing, found, copy, meta, write, delete) = tool_results(fake)
    for result in (read_db, read_creds, grep_home, copy, meta, write, delete):
        assert result.startswith("Error: ") and HIDDEN in result, result
    assert grep_all == "no matches for 4242-ALPHA in the files' contents (list_directory lists names)"
    assert ".xz" not in listing and "via" not in listing and "notes.txt" in listing, listing
    assert found == "no paths match **/conversations.db"
    assert not (cli.workdir / "data" / "copy").exists()
    assert (home / "conversations.db").exists()
    assert "launch code" not in json.dumps(tool_results(fake))  # the first run's words never came back
