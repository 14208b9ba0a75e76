"""Start-up time and resident memory of the launch wrapper, before vs now.

    python examples/benchmarks/launch_startup.py --before ed0c1b1 --rounds 7 \\
        --out docs/benchmarks/launch_startup.json

Runs `python -m keras_mpfp16.runtime.launch true` (the wrapper starting, then
running a launcher that exits at once) under `/usr/bin/time`-like accounting
(`os.wait4`: wall seconds, the wrapper's peak resident set in MB; `true`'s
own is tiny), with the package as it was at `--before` (exported with `git
archive`, first on PYTHONPATH) and with the working tree, alternating which
goes first per round. Also records whether Keras, TensorFlow or mpi4py were
imported (`-X importtime`, one extra run each). Printed and saved: each
round, the medians, and other processes' share of the CPU per run.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from interleave import OthersCPU, export_commit  # noqa: E402

COMMAND = ["-m", "keras_mpfp16.runtime.launch", "true"]
HEAVY = ("keras", "tensorflow", "mpi4py")


# `python -m` puts the working directory first on sys.path: run from an empty
# one, so PYTHONPATH decides which package is measured.
EMPTY = tempfile.mkdtemp(prefix="launch_startup_")


def _env(path: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(path), TF_CPP_MIN_LOG_LEVEL="2")


def measure(path: Path) -> dict:
    """One start: wall seconds and peak resident MB of the wrapper process."""
    with OthersCPU() as others:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *COMMAND],
            env=_env(path),
            cwd=EMPTY,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the wrapper failed (status {status}) with {path}")
    return {
        "seconds": round(wall, 3),
        "max_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        "others_cpu": None if others.share is None else round(others.share, 2),
    }


def heavy_imports(path: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *COMMAND],
        env=_env(path),
        cwd=EMPTY,
        capture_output=True,
        text=True,
        check=True,
    )
    names = {
        line.rsplit("|", 1)[-1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    return sorted(n for n in names if n.split(".")[0] in HEAVY and "." not in n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="ed0c1b1", help="commit to compare against")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        export_commit(args.before, before)
        paths = {"before": before, "after": ROOT}
        runs = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for which in order:
                runs[which].append(measure(paths[which]))
            print(
                f"round {r + 1}: "
                + ", ".join(
                    f"{w} {runs[w][-1]['seconds']:.2f} s "
                    f"{runs[w][-1]['max_rss_mb']:.0f} MB"
                    for w in ("before", "after")
                ),
                flush=True,
            )
        heavy = {w: heavy_imports(paths[w]) for w in paths}
    median = {
        w: {
            k: statistics.median(run[k] for run in runs[w])
            for k in ("seconds", "max_rss_mb")
        }
        for w in runs
    }
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python " + " ".join(COMMAND),
        "before": args.before,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "runs": runs,
        "median": median,
        "heavy_imports": heavy,
    }
    print(json.dumps({"median": median, "heavy_imports": heavy}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
