"""keras.io's bi-LSTM IMDB script: the whole job at np=2 vs one unmodified process.

    python examples/benchmarks/imdb_job.py --rounds 3 --out docs/benchmarks/imdb_job.json

Per round, interleaved (A B C, A B C, ...), each a fresh process measured
from start to exit (TensorFlow import, data, model, one epoch with the
25,000-review validation pass, teardown):

  single   examples/benchmarks/imdb_plain.py: keras.io's script unmodified,
           one process, TensorFlow's default threads
  kmp_np1  examples/imdb_lstm.py (the three lines) with plain `python`:
           one process, keras_mpfp16's defaults (only the tf.data
           teardown workaround applies at size 1)
  kmp_np2  the same script under `mpirun -np 2 --bind-to core`
  hvd_np2  examples/benchmarks/imdb_horovod.py: keras.io's script with
           Horovod's documented adoption, Horovod 0.28.1 on TF 2.15's Keras 2
           (--horovod-venv, made by horovod_setup.sh), same mpirun flags;
           only with --configs naming it

`--data DIR` runs every config on a folder with a `load.py` (the real
reviews: ../shared/data/imdb); the default is the synthetic stand-in (examples/imdb_synthetic.py: 25,000 train /
25,000 validation reviews, 200 tokens, vocabulary 20,000), batch 32 per
rank, float32. Printed and saved: every raw figure, each run's phases
(training, validation, the gaps around them, fit's teardown) and the median
over rounds of the per-round ratios kmp_np2 / single and kmp_np1 / single,
for the whole job and for the validation pass.
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))

from interleave import run_rounds  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402


def command(name: str, data: str = "synthetic", horovod_venv: str = "") -> list[str]:
    script = [str(ROOT / "examples" / "imdb_lstm.py"), "--data", data]
    script += ["--epochs", "1", "--report-json"]
    if name == "single":
        return [sys.executable, str(HERE / "imdb_plain.py"), data]
    if name == "kmp_np1":
        return [sys.executable, *script]
    if name == "kmp_np2":
        return [mpirun_path(), "-np", "2", "--bind-to", "core", sys.executable, *script]
    if name == "hvd_np2":
        venv = Path(horovod_venv).resolve() / "bin"
        hvd = [str(venv / "python"), str(HERE / "imdb_horovod.py"), "--data", data]
        return [str(venv / "mpirun"), "-np", "2", "--bind-to", "core", *hvd]
    raise ValueError(name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--configs", default="single,kmp_np1,kmp_np2")
    p.add_argument(
        "--data", default="synthetic", help="'synthetic' or a load.py folder"
    )
    p.add_argument("--horovod-venv", default=".venv-horovod")
    args = p.parse_args(argv)
    names = args.configs.split(",")
    phases: dict[str, list[dict]] = {n: [] for n in names}

    def measure(name: str) -> float:
        t0 = time.perf_counter()
        out = subprocess.run(
            command(name, args.data, args.horovod_venv),
            capture_output=True,
            text=True,
            env=mpi_env(),
            cwd=ROOT,
            timeout=3600,
        )
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(
                f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            )
        report = [
            json.loads(line)
            for line in out.stdout.splitlines()
            if line.startswith('{"phases"')
        ]
        phases[name].append({"wall_s": wall, **report[0]})
        return wall

    raw = run_rounds(
        names, measure, args.rounds, label="imdb job: ", fmt="{:.1f}s".format
    )

    def ratio(name, key=None):
        if key is None:
            pairs = zip(raw[name], raw["single"])
        else:
            pairs = (
                (a["phases"][key], b["phases"][key])
                for a, b in zip(phases[name], phases["single"])
            )
        return statistics.median(a / b for a, b in pairs)

    result = {
        "command": "python examples/benchmarks/imdb_job.py "
        + " ".join(argv or sys.argv[1:]),
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d"),
        "rounds": args.rounds,
        "data": args.data,
        "wall_s": raw,
        "runs": phases,
        "ratios": {
            f"{n}/single": {
                "whole_job": ratio(n),
                "validation": ratio(n, "validation_s"),
                "train": ratio(n, "train_s"),
            }
            for n in names
            if n != "single"
        },
    }
    print(json.dumps(result["ratios"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
