"""Peer comparison on one machine, interleaved: ours vs plain Keras vs MWMS.

    python examples/benchmarks/peers.py --rounds 5 --out docs/benchmarks/peers.json

Per policy and round, in this order (A B C D A B C D ...):
  plain    plain Keras 3, one process, default threads
  pinned   plain Keras 3, one process pinned to core 0 (taskset)
  ours2    keras_mpfp16 at np=2, one core per rank (mpirun --bind-to core)
  mwms2    legacy tf_keras + MultiWorkerMirroredStrategy, 2 workers
Same model (FACTS.md's stacked LSTM), same per-rank batch (64).

Printed per policy: the median over rounds of per-round ratios
  ours2 / mwms2, ours2 / (2 x pinned) (scaling efficiency), ours2 / plain,
and every raw samples/s figure, so the machine's 2x speed modes are visible.
Requires `pip install tf-keras==<your TF version> --no-deps` for the MWMS peer
(skipped with a note when tf_keras is missing).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "peer_worker.py")
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from interleave import run_rounds  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402


def _last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no result in output:\n{text[-3000:]}")


def _run(cmd, env=None, timeout=900):
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env or mpi_env(), timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return _last_json(out.stdout)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_config(name, policy, steps):
    common = ["--policy", policy, "--steps", str(steps)]
    py = sys.executable
    if name == "plain":
        return _run([py, WORKER, "--impl", "keras", *common])
    if name == "pinned":
        return _run(["taskset", "-c", "0", py, WORKER, "--impl", "keras", *common])
    if name == "ours2":
        return _run(
            [
                mpirun_path(),
                "-np",
                "2",
                "--bind-to",
                "core",
                "--map-by",
                "core",
                py,
                WORKER,
                "--impl",
                "ours",
                *common,
            ]
        )
    if name == "mwms2":
        ports = free_ports(2)
        cluster = {"worker": [f"localhost:{p}" for p in ports]}
        procs = []
        for i in range(2):
            env = mpi_env(
                {
                    "TF_CONFIG": json.dumps(
                        {"cluster": cluster, "task": {"type": "worker", "index": i}}
                    )
                }
            )
            procs.append(
                subprocess.Popen(
                    [py, WORKER, "--impl", "mwms", *common],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        outs = [p.communicate(timeout=900) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(
                f"MWMS failed:\n{outs[0][1][-3000:]}\n{outs[1][1][-3000:]}"
            )
        return _last_json(outs[0][0])
    raise ValueError(name)


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--policies", default="float32,mixed_bfloat16,mixed_float16")
    p.add_argument("--out")
    args = p.parse_args()
    try:
        import tf_keras  # noqa: F401

        configs = ["plain", "pinned", "ours2", "mwms2"]
    except ImportError:
        print("tf_keras not installed: skipping the MWMS peer", flush=True)
        configs = ["plain", "pinned", "ours2"]
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": os.cpu_count(),
        "policies": {},
    }
    for policy in args.policies.split(","):
        raw = run_rounds(
            configs,
            lambda c, pol=policy: run_config(c, pol, args.steps)["samples_per_s"],
            args.rounds,
            label=f"{policy} ",
        )
        ratios = {
            "ours2_over_2x_pinned (scaling efficiency)": [
                o / (2 * s) for o, s in zip(raw["ours2"], raw["pinned"])
            ],
            "ours2_over_plain": [o / s for o, s in zip(raw["ours2"], raw["plain"])],
        }
        if "mwms2" in raw:
            ratios["ours2_over_mwms2"] = [
                o / m for o, m in zip(raw["ours2"], raw["mwms2"])
            ]
        med = {k: statistics.median(v) for k, v in ratios.items()}
        report["policies"][policy] = {
            "samples_per_s": raw,
            "ratios": ratios,
            "median_ratios": med,
        }
        print(
            f"== {policy}: " + "  ".join(f"{k}={v:.3f}" for k, v in med.items()),
            flush=True,
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
