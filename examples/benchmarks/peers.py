"""Peer comparison on one machine, interleaved: ours vs plain Keras vs MWMS.

    python examples/benchmarks/peers.py --rounds 5 --out docs/benchmarks/peers.json

Per policy and round, in this order (A B C ... A B C ...):
  plain          plain Keras 3, one process, TensorFlow's default threads
  pinned         plain Keras 3, one process pinned to core 0 (taskset)
  ours2          keras_mpfp16 at np=2 with the library's defaults: one core
                 per rank (mpirun --bind-to core), one intra- and one
                 inter-op thread per rank
  mwms2_bound    legacy tf_keras + MultiWorkerMirroredStrategy, 2 workers,
                 with ours2's settings: worker i pinned to core i (taskset),
                 TF_NUM_INTRAOP_THREADS=TF_NUM_INTEROP_THREADS=OMP_NUM_THREADS=1
                 (the variables keras_mpfp16 sets for a one-core rank)
  ours2_tfdef    keras_mpfp16 at np=2, unbound (--bind-to none), TensorFlow's
                 default threads (KERAS_MPFP16_THREADS=off)
  mwms2          MultiWorkerMirroredStrategy, 2 workers, unbound, TensorFlow's
                 default threads (how it runs out of the box)
Same model (the stacked LSTM of docs/measurement-conditions.md), same per-rank
batch (64).

Printed per policy: the median over rounds of per-round ratios
  ours2 / mwms2_bound     like for like, both pinned with one thread each
  ours2_tfdef / mwms2     like for like, both unpinned with TF's defaults
  ours2 / mwms2           each with its own defaults
  ours2 / (2 x pinned)    scaling efficiency
  ours2 / plain
and every raw samples/s figure, so the machine's 2x speed modes are visible.

On a shared machine: during every run the share of the CPU that *other*
processes used is measured (interleave.OthersCPU) and recorded; a round in
which it exceeded --max-others in any run is measured again, up to --retries
times (then the last attempt is kept, with its share on record).
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


# What keras_mpfp16 sets for a rank bound to one core (runtime/threads.py);
# mwms2_bound gives the peer the same.
ONE_CORE_THREADS = {
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def _ours(common, bind, extra_env=None):
    cmd = [mpirun_path(), "-np", "2", "--bind-to", bind]
    if bind == "core":
        cmd += ["--map-by", "core"]
    cmd += [sys.executable, WORKER, "--impl", "ours", *common]
    return _run(cmd, env=mpi_env(extra_env))


def run_config(name, policy, steps):
    common = ["--policy", policy, "--steps", str(steps)]
    py = sys.executable
    if name == "plain":
        return _run([py, WORKER, "--impl", "keras", *common])
    if name == "pinned":
        return _run(["taskset", "-c", "0", py, WORKER, "--impl", "keras", *common])
    if name == "ours2":
        return _ours(common, "core")
    if name == "ours2_tfdef":
        return _ours(common, "none", {"KERAS_MPFP16_THREADS": "off"})
    if name in ("mwms2", "mwms2_bound"):
        bound = name == "mwms2_bound"
        ports = free_ports(2)
        cluster = {"worker": [f"localhost:{p}" for p in ports]}
        procs = []
        for i in range(2):
            env = mpi_env(
                {
                    "TF_CONFIG": json.dumps(
                        {"cluster": cluster, "task": {"type": "worker", "index": i}}
                    ),
                    **(ONE_CORE_THREADS if bound else {}),
                }
            )
            pin = ["taskset", "-c", str(i % (os.cpu_count() or 1))] if bound else []
            procs.append(
                subprocess.Popen(
                    [*pin, py, WORKER, "--impl", "mwms", *common],
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
    p.add_argument(
        "--max-others",
        type=float,
        default=None,
        help="measure a round again when other processes used more than this "
        "share of the machine's CPU during one of its runs (default: never)",
    )
    p.add_argument("--retries", type=int, default=3, help="at most, per round")
    p.add_argument("--out")
    args = p.parse_args()
    try:
        import tf_keras  # noqa: F401

        configs = ["plain", "pinned", "ours2", "mwms2_bound", "ours2_tfdef", "mwms2"]
    except ImportError:
        print("tf_keras not installed: skipping the MWMS peer", flush=True)
        configs = ["plain", "pinned", "ours2", "ours2_tfdef"]
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "command": "python examples/benchmarks/peers.py " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "steps": args.steps,
        "max_others": args.max_others,
        "retries": args.retries,
        "configs": configs,
        "policies": {},
    }
    for policy in args.policies.split(","):
        contention = {}
        raw = run_rounds(
            configs,
            lambda c, pol=policy: run_config(c, pol, args.steps)["samples_per_s"],
            args.rounds,
            label=f"{policy} ",
            max_others=args.max_others,
            retries=args.retries,
            contention=contention,
        )
        ratios = {
            "ours2_over_2x_pinned (scaling efficiency)": [
                o / (2 * s) for o, s in zip(raw["ours2"], raw["pinned"])
            ],
            "ours2_over_plain": [o / s for o, s in zip(raw["ours2"], raw["plain"])],
        }
        if "mwms2" in raw:
            for ours, peer in (
                ("ours2", "mwms2_bound"),
                ("ours2_tfdef", "mwms2"),
                ("ours2", "mwms2"),
            ):
                ratios[f"{ours}_over_{peer}"] = [
                    o / m for o, m in zip(raw[ours], raw[peer])
                ]
        med = {k: statistics.median(v) for k, v in ratios.items()}
        report["policies"][policy] = {
            "samples_per_s": raw,
            "ratios": ratios,
            "median_ratios": med,
            "others_cpu_share": {c: contention[c] for c in configs},
            "repeated_rounds": contention["repeated_rounds"],
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
