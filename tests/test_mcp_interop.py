"""Interop with real MCP servers through `xzatoma run`: the npm reference servers (filesystem, everything) and
mcp-server-time from PyPI, installed by .ci/run into its throwaway directory (XZ_MCP_NODE_MODULES,
XZ_MCP_TIME_SERVER); skipped, with the reason, where they are not installed."""

import json
import os
import shutil

import pytest

from conftest import tool_call
from test_mcp_cli import offered, tool_results

NODE_MODULES = os.environ.get("XZ_MCP_NODE_MODULES") or ""
TIME_SERVER = os.environ.get("XZ_MCP_TIME_SERVER") or ""


def use(cli, fake, servers):
    cli.use(fake)
    import yaml
    data = yaml.safe_load(cli.config_path.read_text())
    data["mcp"] = {"servers": servers}
    cli.write_config(data)


def node_server(package):
    script = os.path.join(NODE_MODULES, "@modelcontextprotocol", package, "dist", "index.js")
    if not shutil.which("node") or not os.path.isfile(script):
        pytest.skip("the npm reference server %s is not installed (.ci/run installs it; XZ_MCP_NODE_MODULES)" % package)
    return script


def test_the_reference_servers_through_run_inside_the_sandbox(cli, fake, tmp_path):
    filesystem, everything = node_server("server-filesystem"), node_server("server-everything")
    (cli.workdir / "notes.txt").write_text("alpha\nbeta\n")
    outside = tmp_path / "outside.txt"
    # the filesystem server is allowed the whole disk ("/"): only the sandbox keeps it in the tree
    use(cli, fake, {"fs": {"command": "node", "args": [filesystem, "/"], "read_paths": [NODE_MODULES],
                           "read_only": ["read_text_file"], "allow": ["write_file"]},
                    "every": {"command": "node", "args": [everything], "read_paths": [NODE_MODULES],
                              "allow": ["echo", "get-tiny-image"]}})
    fake.add({"tool_calls": [tool_call("mcp__fs__read_text_file", path=str(cli.workdir / "notes.txt"))]},
             {"tool_calls": [tool_call("mcp__fs__write_file", path=str(outside), content="escaped")]},
             {"tool_calls": [tool_call("mcp__every__echo", message="hello from xzatoma")]},
             {"tool_calls": [tool_call("mcp__every__get-tiny-image")]},
             {"tool_calls": [tool_call("mcp__fs__list_directory", path=str(cli.workdir))]},
             {"content": "done"})
    r = cli.run("run", "--prompt", "use the servers", timeout=120)
    assert r.returncode == 0, r.stderr
    read, wrote, echoed, image, listed = tool_results(fake)
    assert read == "alpha\nbeta\n"
    assert wrote.startswith("Error: MCP tool 'write_file' of server 'fs' reported an error: ") and not outside.exists()
    assert "EACCES" in wrote or "denied" in wrote.lower(), wrote  # the kernel's no, not the server's own check
    assert echoed == "Echo: hello from xzatoma"
    assert "[image from the tool: image/png" in image
    assert listed.startswith("Error: MCP tool mcp__fs__list_directory (server 'fs', tool 'list_directory') needs a "
                             "person's approval")
    assert "mcp__fs__read_text_file" in offered(fake, 0)


def test_mcp_server_time_from_pypi_through_run(cli, fake):
    if not os.path.isfile(TIME_SERVER):
        pytest.skip("mcp-server-time is not installed (needs Python >= 3.10; .ci/run installs it; XZ_MCP_TIME_SERVER)")
    use(cli, fake, {"time": {"command": TIME_SERVER, "read_only": ["get_current_time"], "timeout_seconds": 60}})
    fake.add({"tool_calls": [tool_call("mcp__time__get_current_time", timezone="UTC")]}, {"content": "it is now"})
    r = cli.run("run", "--prompt", "what time is it in UTC?", timeout=120)
    assert r.returncode == 0, r.stderr
    answer = json.loads(tool_results(fake)[0])
    assert answer["timezone"] == "UTC" and answer["datetime"]
