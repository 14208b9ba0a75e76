"""Why TensorFlow "flips between two speed modes exactly 2x apart" on a shared
Linux machine: a competing job in another session, whatever its `nice`.

    python examples/benchmarks/autogroup.py --rounds 3 --out docs/benchmarks/autogroup.json

Runs the benchmark LSTM in one process pinned to core 0 (peers.py's "pinned"
configuration), interleaved, in three conditions:

  quiet        nothing else on core 0
  nice19       a busy loop pinned to core 0, started with `nice -n 19` in its
               own session (setsid), as a background job from another terminal
               would be
  autogroup19  the same busy loop with its session's autogroup niceness set
               to 19 (`echo 19 > /proc/<pid>/autogroup`)

With the kernel's autogroup scheduling (`/proc/sys/kernel/sched_autogroup_enabled`
= 1, the default on most distributions), CPU time is shared fairly between
sessions first, so per-process `nice` only ranks processes within one session:
the niced loop still takes half of core 0. Lowering the loop's whole autogroup
gives the core back. Linux only.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from interleave import median_ratios, run_rounds

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "peer_worker.py")
BUSY = "while True: pass"


def pinned_throughput(steps: int) -> float:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = ["taskset", "-c", "0", sys.executable, WORKER, "--impl", "keras"]
    cmd += ["--steps", str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1]
    return float(json.loads(line)["samples_per_s"])


def start_busy_loop(autogroup_nice: int | None) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["taskset", "-c", "0", "nice", "-n", "19", sys.executable, "-c", BUSY],
        start_new_session=True,  # its own session, hence its own autogroup
    )
    time.sleep(0.5)
    if autogroup_nice is not None:
        Path(f"/proc/{proc.pid}/autogroup").write_text(str(autogroup_nice))
    return proc


def measure(condition: str, steps: int) -> float:
    loop = None
    if condition == "nice19":
        loop = start_busy_loop(None)
    elif condition == "autogroup19":
        loop = start_busy_loop(19)
    try:
        return pinned_throughput(steps)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    autogroup = enabled.read_text().strip() if enabled.exists() else "absent"
    print(f"sched_autogroup_enabled = {autogroup}")
    conditions = ["quiet", "nice19", "autogroup19"]
    raw = run_rounds(conditions, lambda c: measure(c, args.steps), args.rounds)
    rel = median_ratios(raw, "quiet")
    print("throughput relative to quiet (median): ", end="")
    print("  ".join(f"{c}={v:.2f}" for c, v in rel.items()))
    if args.out:
        out = {
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "sched_autogroup_enabled": autogroup,
            "samples_per_s": raw,
            "relative_to_quiet": rel,
        }
        Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
