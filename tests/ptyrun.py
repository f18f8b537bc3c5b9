"""Drive a program under a pseudo-terminal, as a person at a keyboard would (standard library only)."""

import os
import pty
import re
import select
import signal
import subprocess
import time


class PtyProcess:
    def __init__(self, argv, env, cwd, rows=40, cols=200, stdin=None, stderr=None):
        """stdin, stderr: a file (or subprocess.PIPE for stdin) in place of the terminal; the terminal stays the
        program's controlling terminal (/dev/tty) all the same."""
        self.master, slave = pty.openpty()
        import fcntl
        import struct
        import termios
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        name = os.ttyname(slave)

        def controlling_terminal():  # a session of its own, with the pty as its terminal: Ctrl-C sends SIGINT
            os.setsid()
            os.close(os.open(name, os.O_RDWR))  # the first terminal a session leader opens becomes its own

        self.proc = subprocess.Popen(argv, stdin=slave if stdin is None else stdin, stdout=slave,
                                     stderr=slave if stderr is None else stderr, env=env, cwd=cwd,
                                     preexec_fn=controlling_terminal)
        os.close(slave)
        self.buffer = ""
        self.seen = ""

    def _read(self, timeout):
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:
            return None
        if not data:
            return None
        text = data.decode("utf-8", "replace")
        self.buffer += text
        self.seen += text
        return True

    def expect(self, pattern, timeout=20):
        """Wait for a regex in the output since the last match; returns the match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = regex.search(self.buffer)
            if m:
                self.buffer = self.buffer[m.end():]
                return m
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._read(min(remaining, 0.5)) is None and not regex.search(self.buffer):
                if remaining <= 0 or self.proc.poll() is not None:
                    raise AssertionError("timed out waiting for %r; output so far:\n%s" % (pattern, self.seen[-3000:]))

    def send(self, text):
        os.write(self.master, text.encode())

    def line(self, text):
        self.send(text + "\r")

    def wait_idle(self, timeout=10):
        """Wait until the program's main thread sleeps (waiting for input or for its work).

        CPython's readline shows the prompt and only then enters select(): a SIGINT that lands
        in between is held until the next key. A person never types that fast; a test can.
        """
        stat = "/proc/%d/stat" % self.proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(stat) as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # no /proc here, or the program has ended
            if state == "S":
                return
            time.sleep(0.005)

    def interrupt(self):
        self.wait_idle()
        self.send("\x03")

    def eof(self):
        self.send("\x04")

    def wait(self, timeout=20):
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.1)
        code = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        while self._read(0.05):
            pass
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)
