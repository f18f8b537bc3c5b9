#!/usr/bin/env python3
"""Benchmark: the terminal tool's overhead and its memory under an output flood.

1. `true` run 200 times through the terminal tool inside the OS sandbox
   (policy check, the run's sandbox helper starting it as PID 1 of its own PID
   namespace under Landlock, streaming capture, audit line) against
   subprocess.run(["true"]) 200 times, interleaved in the same run: target
   ratio <= 2. The unconfined tool (--sandbox off) is shown for reference; the
   helper's one-time start-up is measured apart.
2. Peak RSS of a process whose terminal tool runs `yes` for 10 s under the
   default caps (10 MB stdout, 1 MB stderr): target < 60 MB.

Usage: python bench/terminal.py [--runs 200] [--flood-seconds 10]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xzatoma_tools import FULL, AuditLog, Confinement, Sandbox, ToolContext, build_registry  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--flood-seconds", type=int, default=10)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="xzterm-")
    term = {"timeout_seconds": 30, "max_stdout_bytes": 10485760, "max_stderr_bytes": 1048576}

    def registry(mode):
        sandbox = Sandbox(work, mode)
        ctx = ToolContext(Confinement(work, terminal=term, sandbox=sandbox), {}, autonomy=FULL,
                          audit=AuditLog(os.path.join(work, "audit-%s.log" % mode)))
        return build_registry("write", ctx), sandbox

    t = time.perf_counter()
    confined, sandbox = registry("workspace-write")
    report = sandbox.report()
    startup = time.perf_counter() - t
    unconfined, _ = registry("off")
    missing = sandbox.not_enforced()
    for reg in (confined, unconfined):  # warm up: the first command pays for imports and the policy's caches
        assert reg.execute("terminal", {"command": "true"}).success

    ours = off = theirs = 0.0
    for _ in range(args.runs):
        t = time.perf_counter()
        r = confined.execute("terminal", {"command": "true"})
        ours += time.perf_counter() - t
        assert r.success, r.error
        t = time.perf_counter()
        r = unconfined.execute("terminal", {"command": "true"})
        off += time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run(["true"])
        theirs += time.perf_counter() - t
    sandbox.close()
    print("== `true` x %d ==" % args.runs)
    print("sandbox: landlock ABI %s, enforced: %s" % (report.get("landlock"), "all" if not missing else
                                                       "NOT " + "; ".join(missing)))
    print("subprocess.run(['true'])           %6.2f ms each" % (theirs / args.runs * 1e3))
    print("terminal tool, sandboxed           %6.2f ms each   ratio %.2f   (target <= 2)"
          % (ours / args.runs * 1e3, ours / theirs))
    print("terminal tool, --sandbox off       %6.2f ms each   ratio %.2f   (reference)"
          % (off / args.runs * 1e3, off / theirs))
    print("sandbox helper start-up (once per run)  %.0f ms" % (startup * 1e3))

    code = ("import resource, sys; sys.path.insert(0, %r)\n"
            "from xzatoma_tools import FULL, Confinement, ToolContext, build_registry\n"
            "ctx = ToolContext(Confinement(%r, terminal={'max_stdout_bytes': 10485760, 'max_stderr_bytes': 1048576}),\n"
            "                  {}, autonomy=FULL)\n"
            "r = build_registry('write', ctx).execute('terminal', {'command': 'yes', 'timeout_seconds': %d})\n"
            "assert 'timed out' in r.error\n"
            "ctx.sandbox.close()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,\n"
            "      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n" % (ROOT, work, args.flood_seconds))
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    peak, children = (int(n) for n in out.split())
    print("== `yes` flood for %ds under the default caps (sandboxed) ==" % args.flood_seconds)
    print("peak RSS %.1f MB   (target < 60 MB; wall %.1fs)" % (peak / 1024, time.perf_counter() - t))
    print("largest child (the sandbox helper or `yes`) %.1f MB" % (children / 1024))


if __name__ == "__main__":
    main()
