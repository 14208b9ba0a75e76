"""Time from an injected fault on rank 1 to the end of the whole `mpirun` job.

    python examples/benchmarks/fault_exit_times.py --repeat 3

Runs tests/mpi_scripts/faults.py (np=2) for the exception and SIGKILL faults
and prints seconds from the fault (stamped by the faulty rank) to mpirun's
exit, per run.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from mpi_launch import run_mpi  # noqa: E402

FAULTS = ["exception-layer", "exception-callback", "exception-input", "sigkill", "exit"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    rows = {}
    for fault in FAULTS:
        times = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as d:
                stamp = Path(d) / "t"
                result = run_mpi(
                    2, "faults.py", "--fault", fault, "--stamp", str(stamp), timeout=180
                )
                ended = time.time()
                assert result.returncode != 0, result.describe()
                times.append(ended - float(stamp.read_text()))
        rows[fault] = times
        print(
            f"{fault:20s} exit {result.returncode:3d}  seconds to job end: "
            + ", ".join(f"{t:.2f}" for t in times),
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
