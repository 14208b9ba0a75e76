"""A node lost mid-epoch, restarted on the survivors: the timeline.

    python examples/benchmarks/cluster_restart.py --repeat 3 [--cut 1] \
        --out docs/benchmarks/cluster_restart.json

Three emulated nodes at 1 Gbit/s, one rank each, each node with its own
/tmp (the run directory is shared, under /var/tmp), run the stock Keras script
tests/mpi_scripts/cluster_restart.py (`BackupAndRestore(save_freq=10)`,
`kmp.shard`, 3 epochs of 40 steps at 3 ranks) under

    python -m keras_mpfp16.runtime.launch --max-restarts 1 \
        mpirun -np 3 --host N1:1,N2:1,N3:1 <cluster flags> python cluster_restart.py DIR

When rank 0 has done 35 steps of epoch 2 (the backup of step 30 on disk),
node 3's link (`--cut 1`: node 1's, rank 0's) is cut and left cut. The
wrapper runs on this machine, outside the nodes (a login node). Per run,
seconds from the cut to:

  detected   rank 0's message that rank 2 is unreachable (the heartbeat
             timeout, default 30 s; with node 1 cut, the survivors' message
             that rank 0 is, after they agree who speaks), as the launch
             wrapper's output shows it
  killed     the wrapper's line that the job lost a rank (the launcher ended
             or was killed after the wrapper's 5 s grace)
  relaunch   the wrapper's restart line (it relaunches at once)
  started    the relaunched script's first line (before importing Keras)
  ready      the relaunched script done importing and building its model
  restored   the first batch begins (backup restored, ranks synchronised)
  first step the first step on the survivors ends

and the work redone: global samples processed across both launches minus
those of an uninterrupted run (3 epochs x 480). Default settings (heartbeat
30 s). Needs root. `run_once` is also the harness of
tests/test_cluster_restart.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from cluster import Cluster  # noqa: E402  (examples/benchmarks/cluster.py)
from mpi_launch import SCRIPTS, mpi_env  # noqa: E402

NODES, CUT = 3, 3
SCRIPT = SCRIPTS / "cluster_restart.py"
WRAPPER = "keras_mpfp16.runtime.launch"


def _lines(stream, sink: list) -> None:
    for line in iter(stream.readline, ""):
        sink.append((time.time(), line.rstrip("\n")))


def _first(lines: list, text: str) -> float | None:
    return next((t for t, line in lines if text in line), None)


def read_launches(run_dir: Path) -> list[list[dict]]:
    """The events of each launch (`launch-K.jsonl`, in launch order)."""
    out, k = [], 1
    while (run_dir / f"launch-{k}.jsonl").exists():
        text = (run_dir / f"launch-{k}.jsonl").read_text()
        out.append([json.loads(x) for x in text.splitlines() if x.strip()])
        k += 1
    return out


def _start_wrapper(cmd: list[str], env: dict | None):
    """Starts the wrapper's command in a session of its own; returns the
    process, the lists its stdout and stderr lines are read into (by the
    returned reader threads, already started) and those threads."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=mpi_env(env),
        start_new_session=True,
    )
    out, err = [], []
    readers = [
        threading.Thread(target=_lines, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_lines, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    return proc, out, err, readers


def run_once(
    cluster: Cluster,
    run_dir: Path,
    env: dict | None = None,
    timeout: float = 420,
    cut_node: int = CUT,
    launcher: list[str] | None = None,
) -> dict:
    """One run: launch under the wrapper with `--max-restarts 1` (from this
    machine: the "login node", outside the nodes), cut node `cut_node` (1: rank
    0's) when the script says so, wait for the wrapper to end. `run_dir`
    must be seen by every node (`cluster.shared_dir()` when the nodes have
    their own /tmp). `launcher`: another launcher command running the script
    (default Open MPI's `cluster.mpirun_command`; e.g. `cluster.hydra_command`).
    Returns the wrapper's status, output, the launches' events and the
    timeline."""
    mpirun = launcher or cluster.mpirun_command(
        [sys.executable, str(SCRIPT), str(run_dir)]
    )
    cmd = [sys.executable, "-m", WRAPPER, "--max-restarts", "1", *mpirun]
    proc, out, err, readers = _start_wrapper(cmd, env)
    cut = ended = None
    try:
        deadline = time.monotonic() + timeout
        while not (run_dir / "reached").exists():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the job ended before the cut (status {proc.returncode}):\n"
                    + "\n".join(x for _, x in err[-40:])
                )
            if time.monotonic() > deadline:
                raise RuntimeError("training never reached the cut")
            time.sleep(0.05)
        cluster.link(cut_node, up=False)
        cut = time.time()
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
            ended = time.time()
        except subprocess.TimeoutExpired:
            pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # The cut node's daemon holds the output pipes open: end it.
        cluster.kill_all()
        cluster.link(cut_node, up=True)
        for r in readers:
            r.join(timeout=30)
    launches = read_launches(run_dir)

    def since(t):
        return None if t is None or cut is None else round(t - cut, 2)

    timeline = {
        # rank 0's message naming the lost rank, or (rank 0's node cut) the
        # survivors' naming rank 0
        "detected": since(_first(err, "is unreachable")),
        "killed": since(_first(err, f"{WRAPPER}: the job lost a rank")),
        "relaunch": since(_first(err, f"{WRAPPER}: restart 1 of 1")),
    }
    second = launches[1] if len(launches) > 1 else []
    first_of = {}
    for e in second:
        first_of.setdefault(e["event"], e["t"])
    timeline.update(
        started=since(first_of.get("start")),
        ready=since(first_of.get("ready")),
        restored=since(first_of.get("begin")),
        first_step=since(first_of.get("step")),
        job_ended=since(ended),
    )
    head = launches[0][0] if launches else {}
    samples = [sum(e["samples"] for e in x if e["event"] == "step") for x in launches]
    uninterrupted = head.get("epochs", 0) * head.get("rows", 0)
    steps = [
        [(e["epoch"], e["batch"]) for e in x if e["event"] == "step"] for x in launches
    ]
    return {
        "status": proc.returncode if ended is not None else None,
        "stdout": [x for _, x in out],
        "stderr_tail": [x for _, x in err][-60:],
        "launches": launches,
        "sizes": [x[0]["n"] for x in launches if x],
        "steps": steps,
        "samples_per_launch": samples,
        "uninterrupted_samples": uninterrupted,
        "redone_samples": sum(samples) - uninterrupted,
        "global_batch_before": head.get("n", 0) * head.get("batch_per_rank", 0),
        "save_freq": head.get("save_freq"),
        "timeline_s": timeline,
    }


def run_cuts(
    cluster: Cluster,
    run_dir: Path,
    cuts: list,
    max_restarts: int = 1,
    env: dict | None = None,
    timeout: float = 420,
) -> dict:
    """A run under the wrapper with `--max-restarts max_restarts` (from this
    machine, outside the nodes) with one or more cuts, each `(when, node)`:
    node `node`'s link is cut (and left cut) as soon as `when(run_dir)` is
    true, the cuts in order (e.g. a start-up marker the script wrote, or an
    event of a relaunch). Waits for the wrapper to end (at most `timeout`
    seconds). Returns the wrapper's status (None: still running at the
    timeout, then killed), its output, the launches' events, the times of
    the cuts and of the end (`time.time()`)."""
    mpirun = cluster.mpirun_command([sys.executable, str(SCRIPT), str(run_dir)])
    cmd = [sys.executable, "-m", WRAPPER, "--max-restarts", str(max_restarts), *mpirun]
    proc, out, err, readers = _start_wrapper(cmd, env)
    cut_at, ended = [], None
    try:
        deadline = time.monotonic() + timeout
        pending = list(cuts)
        while proc.poll() is None and time.monotonic() < deadline:
            if pending and pending[0][0](run_dir):
                cluster.link(pending.pop(0)[1], up=False)
                cut_at.append(time.time())
                continue
            time.sleep(0.02)
        if proc.poll() is not None:
            ended = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        cluster.kill_all()
        for _, node in cuts:
            cluster.link(node, up=True)
        for r in readers:
            r.join(timeout=30)
    return {
        "status": proc.returncode if ended is not None else None,
        "stdout": [x for _, x in out],
        "stderr": [x for _, x in err],
        "stderr_times": [t for t, _ in err],
        "launches": read_launches(run_dir),
        "cuts": cut_at,
        "ended": ended,
    }


def summary(run: dict) -> dict:
    """What a benchmark file keeps of a run (not the per-step events)."""
    steps = run["steps"]
    return {
        "status": run["status"],
        "sizes": run["sizes"],
        "steps_per_launch": [len(s) for s in steps],
        "last_step_before_cut": list(steps[0][-1]) if steps and steps[0] else None,
        "first_step_after": list(steps[1][0]) if len(steps) > 1 and steps[1] else None,
        "samples_per_launch": run["samples_per_launch"],
        "uninterrupted_samples": run["uninterrupted_samples"],
        "redone_samples": run["redone_samples"],
        "global_batch_before": run["global_batch_before"],
        "timeline_s": run["timeline_s"],
        "lost_line": next(
            (x for x in run["stderr_tail"] if f"{WRAPPER}: the job lost a rank" in x),
            None,
        ),
        "restart_line": next(
            (x for x in run["stderr_tail"] if f"{WRAPPER}: restart" in x), None
        ),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out")
    p.add_argument(
        "--cut", type=int, default=CUT, help="the node cut (1: rank 0's; default 3)"
    )
    args = p.parse_args()
    cluster = Cluster(
        NODES,
        "1gbit",
        prefix="kmpb",
        subnet="10.78.10",
        bridge="kmpbbr0",
        private_tmp=True,
    )
    cluster.up()
    runs = []
    try:
        for i in range(args.repeat):
            run_dir = cluster.shared_dir("restart")
            run = summary(run_once(cluster, run_dir, cut_node=args.cut))
            shutil.rmtree(run_dir, ignore_errors=True)
            runs.append(run)
            print(f"run {i + 1}: {json.dumps(run)}", flush=True)
    finally:
        cluster.down()
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%d %H:%M"),
                    "command": "python " + " ".join(sys.argv),
                    "args": {"repeat": args.repeat, "cut": args.cut},
                    "node_local_tmp": True,
                    "nodes": NODES,
                    "rate": "1gbit",
                    "cores": os.cpu_count(),
                    "heartbeat_timeout_s": os.environ.get(
                        "KERAS_MPFP16_HEARTBEAT_TIMEOUT", "default (30)"
                    ),
                    "runs": runs,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
