#!/usr/bin/env python3
"""Benchmark: agent-loop overhead against conversation length, and cold start.

1. One run of 500 turns against a zero-latency fake model in another process
   (so its work is not ours); each turn reads a 2 KB file, pruning is active.
   The client's CPU time per turn (process_time, so the server is excluded)
   around turn 10 and around turn 500 of the same run: target ratio < 1.5.
2. Cold start of `xzatoma --version` against `python3 -c pass`, interleaved:
   target ratio < 2.

Usage: python bench/agent_loop.py [--turns 500] [--runs 30]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import xzatoma  # noqa: E402


def start_server(turns, provider_path):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "fake_model.py"),
                             "--loop-tool", "read_file", "--loop-args", json.dumps({"path": "blob.txt"}),
                             "--turns", str(turns + 1)], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, "http://127.0.0.1:%d" % port


def loop_benchmark(turns, provider, max_tokens):
    work = tempfile.mkdtemp(prefix="xzbench-")
    with open(os.path.join(work, "blob.txt"), "w") as fh:
        fh.write(("0123456789abcdef" * 4 + "\n") * 31)  # ~2 KB
    server, url = start_server(turns, provider)
    try:
        home = tempfile.mkdtemp(prefix="xzbench-home-")  # apart from the working directory: no tool reaches it
        env = {"HOME": home, "XDG_CONFIG_HOME": home, "XZATOMA_HOME": home}
        cfg = xzatoma.load_config({"provider.type": provider, "agent.max_turns": turns + 10,
                                   "provider.ollama.host": url, "provider.openai.base_url": url + "/v1",
                                   "agent.conversation.max_tokens": max_tokens,
                                   "agent.conversation.min_retain_turns": 5, "agent.conversation.prune_threshold": 0.8,
                                   "agent.persistence.enabled": False, "agent.quota.max_total_tokens": 10 ** 12},
                                  env=env)
        console = xzatoma.Console(quiet=True)
        session = xzatoma.Session.open(cfg, console, "write", work, "restricted_autonomous")
        session.start("run")
        conv = session.conversation
        conv.add_user("Read blob.txt again and again.")
        cpu, wall, sizes = [], [], []
        last = [time.process_time(), time.perf_counter()]

        def on_step(a):
            now_cpu, now_wall = time.process_time(), time.perf_counter()
            cpu.append(now_cpu - last[0])
            wall.append(now_wall - last[1])
            sizes.append(len(a.conversation.messages))
            last[0], last[1] = now_cpu, now_wall
        result = session.agent(on_step=on_step).run()
        session.close()
        assert result.status == "completed", (result.status, result.error)
    finally:
        server.terminate()
        server.wait()
    return cpu, wall, sizes, conv


def window(values, center, half=5):
    lo, hi = max(0, center - half), min(len(values), center + half)
    return statistics.median(values[lo:hi])


def cold_start(runs):
    script = os.path.join(ROOT, "xzatoma.py")
    installed = os.path.join(os.path.dirname(sys.executable), "xzatoma")
    commands = {"python3 -c pass": [sys.executable, "-c", "pass"],
                "python3 xzatoma.py --version": [sys.executable, script, "--version"]}
    if os.path.exists(installed):
        commands["xzatoma --version (installed)"] = [installed, "--version"]
    times = {k: [] for k in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=500)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=8000,
                   help="conversation budget; small enough that pruning is active from about turn 12")
    args = p.parse_args()

    print("== agent loop: %d turns, 2 KB tool result each, max_tokens %d ==" % (args.turns, args.max_tokens))
    for provider in ("ollama", "openai"):
        cpu, wall, sizes, conv = loop_benchmark(args.turns, provider, args.max_tokens)
        early, late = window(cpu, 10), window(cpu, args.turns - 5)
        print("%-7s turn 10: %.3f ms cpu (%.3f ms wall, %d msgs)   turn %d: %.3f ms cpu (%.3f ms wall, %d msgs)"
              "   ratio %.2f  (target < 1.5)  prunes: %d"
              % (provider, early * 1e3, window(wall, 10) * 1e3, sizes[9], args.turns, late * 1e3,
                 window(wall, args.turns - 5) * 1e3, sizes[args.turns - 6], late / early, conv.pruned["count"]))

    print("== cold start (median of %d, interleaved) ==" % args.runs)
    results = cold_start(args.runs)
    base = results["python3 -c pass"]
    for name, value in results.items():
        print("%-32s %6.1f ms   ratio %.2f%s" % (name, value * 1e3, value / base,
                                                  "  (target < 2)" if name != "python3 -c pass" else ""))


if __name__ == "__main__":
    main()
