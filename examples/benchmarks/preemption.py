"""Preemption: seconds from the signal to the end of `mpirun`, and steps lost.

    python examples/benchmarks/preemption.py --repeat 2 --lead 10 \
        --out docs/benchmarks/preemption.json

Runs tests/mpi_scripts/preempt.py (np=2, 20 steps per epoch, steps padded to
about 0.3 s from epoch 2 step 6 on, so a signal lands mid-epoch) two ways:

- keras_mpfp16's preemption: SIGUSR1 to mpirun at the marker step (what
  `#SBATCH --signal=USR1@<lead>` or `scancel --signal=USR1` sends); the job
  exits 75 with a backup at the agreed step. Steps lost = steps trained
  minus steps in the backup.
- `BackupAndRestore` alone (save_freq="epoch", `KERAS_MPFP16_PREEMPTION=0`):
  the job is killed (SIGKILL, the end of the grace period) `--lead`
  seconds after the same marker. Steps lost = steps trained minus the
  steps of the epochs in the backup.

`signal_to_backup_s`: from the signal to the moment every rank has the
backup on disk and raises `Preempted` (the rest of `signal_to_exit_s` is
the processes' and mpirun's exit). Prints one line per run and the medians;
writes JSON with --out.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from mpi_launch import SCRIPTS, mpi_env, mpirun_path  # noqa: E402

STEPS = 20  # per epoch, as in preempt.py
NP = 2


def _run(out_dir: Path, backup: str, env: dict, lead: float | None) -> dict:
    """One job: `lead` None sends SIGUSR1 to mpirun at the marker, else
    SIGKILLs the job `lead` s after it."""
    log = out_dir / "steps.log"
    env = {**env, "PREEMPT_STEP_LOG": str(log)}
    cmd = [
        mpirun_path(),
        "-np",
        str(NP),
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        str(SCRIPTS / "preempt.py"),
        str(out_dir),
        "run",
        backup,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=mpi_env(env),
        start_new_session=True,
    )
    markers = [out_dir / f"ready.{r}" for r in range(NP)]
    while not all(m.exists() for m in markers):
        if proc.poll() is not None:
            raise RuntimeError(proc.communicate()[1][-3000:])
        time.sleep(0.02)
    sent = time.time()
    if lead is None:
        os.kill(proc.pid, signal.SIGUSR1)
    else:
        time.sleep(lead)
        os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    ended = time.time()
    stops = [json.loads(line) for line in out.splitlines() if '"preempted"' in line]
    trained = len(log.read_text().splitlines())
    meta = (
        json.loads((out_dir / "backup" / "training_metadata.json").read_text())
        if (out_dir / "backup").exists()
        else None
    )
    if lead is None:
        meta = json.loads(
            next((out_dir / "own").glob("fit-*/training_metadata.json")).read_text()
        )
    kept = 0
    if meta is not None:
        kept = meta["epoch"] * STEPS + meta.get("keras_mpfp16", {}).get("steps_done", 0)
    backed_up = max((r["t_exit"] for r in stops), default=None)
    return {
        "returncode": proc.returncode,
        "signal_to_exit_s": round(ended - sent, 2),
        "signal_to_backup_s": None if backed_up is None else round(backed_up - sent, 2),
        "steps_trained": trained,
        "steps_in_backup": kept,
        "steps_lost": trained - kept,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument(
        "--lead",
        type=float,
        default=10.0,
        help="seconds between the warning and the kill (stock run)",
    )
    p.add_argument("--out")
    args = p.parse_args()
    rows = {"preemption": [], "backup_and_restore_only": []}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            env = {"KERAS_MPFP16_PREEMPTION_DIR": str(d / "own")}
            r = _run(d, "own", env, None)
            rows["preemption"].append(r)
            print("preemption (SIGUSR1 to mpirun):", r, flush=True)
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            r = _run(d, "user", {"KERAS_MPFP16_PREEMPTION": "0"}, args.lead)
            rows["backup_and_restore_only"].append(r)
            print(f"BackupAndRestore only (killed {args.lead} s later):", r, flush=True)
    summary = {
        k: {
            m: statistics.median(r[m] for r in v)
            for m in ("signal_to_exit_s", "steps_lost", "steps_trained")
        }
        for k, v in rows.items()
    }
    print("medians:", json.dumps(summary))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "np": NP,
                    "steps_per_epoch": STEPS,
                    "step_padding_s": 0.3,
                    "lead_s": args.lead,
                    "command": " ".join(["python", *sys.argv]),
                    "runs": rows,
                    "medians": summary,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
