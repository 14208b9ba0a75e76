"""A node's link cut mid-epoch, with the library's default settings: how long
until every rank's process has ended, what each says, and what mpirun does.

    python examples/benchmarks/cluster_faults.py --repeat 2 \
        --out docs/benchmarks/cluster_faults.json

Three emulated nodes at 1 Gbit/s, one rank each, train the small model of
tests/mpi_scripts/cluster_train.py with AtomicModelCheckpoint; when rank 0 is
half-way through epoch 2, node 3's link goes down. Two launcher settings:

  plain      the harness's mpirun flags only
  keepalive  plus `--prtemca oob_tcp_keepalive_time 10
             --prtemca oob_tcp_keepalive_intvl 5 --prtemca oob_tcp_keepalive_probes 3`:
             mpirun's own connections to its node daemons probe a silent
             peer after 10 s and give up after 3 missed probes 5 s apart

Per run: seconds from the cut until each rank's process is gone, its exit
status (from a wrapper; "killed" when the wrapper was killed with it), the
first keras_mpfp16 line it printed, and mpirun's exit status and time (mpirun
is killed after 120 s if still running). Needs root.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from cluster import Cluster  # noqa: E402  (examples/benchmarks/cluster.py)
from mpi_launch import SCRIPTS, mpi_env  # noqa: E402

KEEPALIVE = [
    "--prtemca",
    "oob_tcp_keepalive_time",
    "10",
    "--prtemca",
    "oob_tcp_keepalive_intvl",
    "5",
    "--prtemca",
    "oob_tcp_keepalive_probes",
    "3",
]
NODES, CUT = 3, 3


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def one_run(cluster: Cluster, variant: str) -> dict:
    d = Path(tempfile.mkdtemp(prefix="kmp_cut_"))
    wrapped = (
        f"{sys.executable} {SCRIPTS / 'cluster_train.py'} cut {d} "
        f"2>{d}/err.$OMPI_COMM_WORLD_RANK; echo $? >{d}/rc.$OMPI_COMM_WORLD_RANK"
    )
    extra = KEEPALIVE if variant == "keepalive" else []
    proc = subprocess.Popen(
        cluster.mpirun_command(["sh", "-c", wrapped], extra=extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=mpi_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (d / "reached").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"job ended or stalled before the cut: {proc.poll()}"
                )
            time.sleep(0.05)
        cluster.link(CUT, up=False)
        cut = time.monotonic()
        pids = {r: int((d / f"pid.{r}").read_text()) for r in range(NODES)}
        gone = {}
        mpirun_exit = None
        while time.monotonic() - cut < 120:
            now = time.monotonic() - cut
            for r, pid in pids.items():
                if r not in gone and not alive(pid):
                    gone[r] = now
            if mpirun_exit is None and proc.poll() is not None:
                mpirun_exit = (now, proc.returncode)
            if len(gone) == NODES and mpirun_exit is not None:
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        # The cut node's daemons outlive mpirun and hold its output pipe open:
        # end everything in the nodes before reading the output to its end.
        cluster.kill_all()
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        cluster.link(CUT, up=True)
    ranks = {}
    for r in range(NODES):
        err = (d / f"err.{r}").read_text() if (d / f"err.{r}").exists() else ""
        rc = (
            (d / f"rc.{r}").read_text().strip()
            if (d / f"rc.{r}").exists()
            else "killed"
        )
        first = next((x for x in err.splitlines() if x.startswith("keras_mpfp16")), "")
        ranks[r] = {
            "host": cluster.node(r + 1),
            "ended_after_cut_s": gone.get(r),
            "exit_status": rc,
            "message": first,
        }
    shutil.rmtree(d, ignore_errors=True)
    tail = [x for x in out.splitlines() if x.strip()][-6:]
    return {
        "variant": variant,
        "ranks": ranks,
        "all_ranks_ended_s": max(gone.values()) if len(gone) == NODES else None,
        "mpirun": (
            {"ended_after_cut_s": mpirun_exit[0], "exit_status": mpirun_exit[1]}
            if mpirun_exit
            else {"ended_after_cut_s": None, "exit_status": "still running after 120 s"}
        ),
        "mpirun_output_tail": tail,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    cluster = Cluster(NODES, "1gbit")
    cluster.up()
    runs = []
    try:
        for i in range(args.repeat):
            for variant in ("plain", "keepalive"):
                run = one_run(cluster, variant)
                runs.append(run)
                print(f"run {i + 1} {variant}: ranks ended", flush=True)
                for r, x in run["ranks"].items():
                    print(
                        f"  rank {r} ({x['host']}): {x['ended_after_cut_s']} s, "
                        f"status {x['exit_status']}: {x['message'][:160]}"
                    )
                print(f"  mpirun: {run['mpirun']}", flush=True)
    finally:
        cluster.down()
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%d %H:%M"),
                    "command": "python " + " ".join(sys.argv),
                    "args": {"repeat": args.repeat},
                    "heartbeat_timeout_s": os.environ.get(
                        "KERAS_MPFP16_HEARTBEAT_TIMEOUT", "default (30)"
                    ),
                    "runs": runs,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
