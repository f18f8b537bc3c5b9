"""Metrics are a side product: a textfile that cannot be written is a warning, a port in use a usage error, and a
missing client library names how to install it. The CLI as a subprocess against the fake model server."""

import os
import socket
import subprocess
import sys


def test_an_unwritable_metrics_textfile_is_a_warning(cli, fake, tmp_path):
    cli.use(fake)
    not_a_dir = tmp_path / "a-file"  # unwritable even for root, unlike a mode-0555 folder
    not_a_dir.write_text("")
    for path, code, reply in ((tmp_path / "missing" / "m.prom", 0, {"content": "the answer"}),
                              (not_a_dir / "m.prom", 1, {"status": 400, "body": '{"error": "bad request"}'})):
        fake.add(reply)
        r = cli.run("run", "--metrics-textfile", path, "--prompt", "x")
        assert r.returncode == code, r.stderr
        assert r.stdout == ("the answer\n" if code == 0 else "")
        assert "warning: cannot write the metrics textfile %s" % path in r.stderr
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_metrics_port_in_use_is_a_usage_error(cli, fake):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        cli.use(fake)
        r = cli.run("run", "--metrics-port", busy.getsockname()[1], "--prompt", "x")
        assert r.returncode == 2 and "cannot serve metrics on 127.0.0.1:%d" % busy.getsockname()[1] in r.stderr
        assert not fake.model_requests()
    finally:
        busy.close()


def test_metrics_install_hint_under_pipx(cli, fake, tmp_path):
    """pipx keeps xzatoma in a venv of its own: the hint must name `pipx inject`."""
    import sysconfig
    venv = tmp_path / "pipx-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "pipx_metadata.json").write_text("{}")
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shadow = tmp_path / "shadow"  # the test environment has prometheus_client: hide it
    shadow.mkdir()
    (shadow / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    with open(os.path.join(purelib, "deps.pth"), "w") as fh:
        fh.write("%s\n%s\n" % (shadow, sysconfig.get_paths()["purelib"]))
    cli.use(fake)
    r = subprocess.run([python, cli.command()[1], "run", "--metrics-port", "1", "--prompt", "x"],
                       capture_output=True, text=True, env=cli.env, cwd=str(cli.workdir))
    assert r.returncode == 2, r.stderr
    assert "pipx inject xzatoma prometheus_client" in r.stderr and "pip install" not in r.stderr
    assert not fake.model_requests()
