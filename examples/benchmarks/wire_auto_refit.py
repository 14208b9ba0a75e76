"""`wire_dtype="auto"` as a user who calls `fit` twice meets it (issue 40, item 4).

    python examples/benchmarks/wire_auto_refit.py --model dense --rounds 3 \\
        --before HEAD --out docs/benchmarks/wire_auto_refit.json

Each job (`mpirun -np 2` on this machine, one job per measurement) builds
the model, runs a warm-up `fit` of `--warmup` steps, then a timed `fit` of
`--steps` steps of the same model, the pattern of scripts that call `fit` in
a loop. Configurations, interleaved (the order rotates every round): `auto`
(the working tree), `float16` and `float32` (fixed wires), and with
`--before C` `auto@C` (the package at commit C, exported with `git archive`
and put first on PYTHONPATH).

`--force-trial` replaces the reductions' timings by numbers that favour
float16 (`wire_tuner.timings_hook`, the tests' seam), so that `auto` runs
its whole-step trial as it does on a slow link, which it rarely does on one
box; everything else (the steps, their timing, the trial's own step times)
is real. The JSON says when it was used.

Per job, from rank 0 (step times are the slowest rank's): the timed fit's
samples/s over its steps after the first (as cluster_worker.py times), the
whole timed fit's wall time, each timed step's time, and what `auto` did in
each fit: traces of the train step (Python runs of
`DistributedOptimizer._reduce_and_apply`, which happen only while the step is
traced), measurements of the reductions (`tune_wire`) and whole-step
confirmations (`wire_tuner.confirm`), and the decision.

Printed: the raw numbers per round; saved with `--out` as JSON. The machine
is shared: the numbers are as loaded as it was (the JSON records the load
average before and after each job).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))


def worker(args) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    from cluster_models import build, data
    from mpi4py import MPI

    import keras_mpfp16 as kmp
    from keras_mpfp16.optimizer import distributed_optimizer as do
    from keras_mpfp16.runtime.mpi import wire_tuner

    count: dict = {}

    def bump(what):
        count[what] = count.get(what, 0) + 1

    own_reduce = do.DistributedOptimizer._reduce_and_apply
    own_tune = do.DistributedOptimizer.tune_wire
    own_confirm = wire_tuner.confirm

    def reduce_and_apply(self, grads, variables):
        bump("traces")
        return own_reduce(self, grads, variables)

    def tune_wire(self):
        bump("measurements")
        return own_tune(self)

    def confirm(*a, **k):
        bump("confirmations")
        return own_confirm(*a, **k)

    if args.force_trial:
        wire_tuner.timings_hook = lambda sizes: {
            s: {"float32": [2e-3] * 3, "float16": [1e-3] * 3} for s in sizes
        }
    do.DistributedOptimizer._reduce_and_apply = reduce_and_apply
    do.DistributedOptimizer.tune_wire = tune_wire
    wire_tuner.confirm = confirm

    class Stamps(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.begin, self.ends = time.perf_counter(), []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

        def on_train_end(self, logs=None):
            self.end = time.perf_counter()

    net, opt, batch = build(keras, args.model)
    opt = kmp.DistributedOptimizer(opt, wire_dtype=args.wire)
    net.compile(optimizer=opt, loss="binary_crossentropy", jit_compile=False)
    x, y = data(args.model, batch * max(args.warmup, args.steps), kmp.rank())
    comm = MPI.COMM_WORLD
    fits = []
    for steps in (args.warmup, args.steps):
        count = {}
        stamps = Stamps()
        net.fit(
            x[: batch * steps],
            y[: batch * steps],
            batch_size=batch,
            shuffle=False,
            verbose=0,
            callbacks=[stamps],
        )
        mine = np.diff([stamps.begin, *stamps.ends])
        slowest = np.empty_like(mine)
        comm.Allreduce(mine, slowest, op=MPI.MAX)
        step_times = slowest.tolist()
        wall = comm.allreduce(stamps.end - stamps.begin, op=MPI.MAX)
        fits.append({"steps": steps, "step_s": step_times, "wall_s": wall, **count})
    timed = fits[-1]
    after_first = sum(timed["step_s"][1:])
    decision = getattr(opt, "wire_decision", None)
    if kmp.rank() == 0:
        out = {
            "wire": args.wire,
            "effective": getattr(opt, "effective_wire_dtype", args.wire),
            "decision": None if decision is None else decision.as_dict(),
            "samples_per_s": batch * kmp.size() * (args.steps - 1) / after_first,
            "fit_samples_per_s": batch * kmp.size() * args.steps / timed["wall_s"],
            "fits": fits,
        }
        print("RESULT " + json.dumps(out), flush=True)


def run_job(config: str, args, pythonpath: str) -> dict:
    from mpi_launch import mpi_env, mpirun_path

    wire = config.split("@")[0]
    env = mpi_env({"PYTHONPATH": pythonpath})
    cmd = [
        mpirun_path(),
        "-np",
        str(args.np),
        "--oversubscribe",
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--model",
        args.model,
        "--wire",
        wire,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        *(["--force-trial"] if args.force_trial else []),
    ]
    load0 = os.getloadavg()[0]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    load1 = os.getloadavg()[0]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"{config} failed ({res.returncode}):\n{res.stderr[-4000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    out.update(config=config, load=[load0, load1])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--wire", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--model", default="dense", choices=("facts", "dense", "imdb"))
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", help="also run auto at this commit (auto@C)")
    p.add_argument("--configs", default="auto,float16,float32")
    p.add_argument("--force-trial", action="store_true")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from interleave import export_commit

    here = f"{ROOT}{os.pathsep}{HERE}"
    paths = {c: here for c in args.configs.split(",")}
    tmp = None
    if args.before:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        tmp = tempfile.TemporaryDirectory(prefix="kmp-before-")
        export_commit(commit, Path(tmp.name))
        paths[f"auto@{commit}"] = f"{tmp.name}{os.pathsep}{HERE}"
    configs = list(paths)
    rounds = []
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        row = {}
        for config in order:
            res = run_job(config, args, paths[config])
            row[config] = res
            timed = res["fits"][-1]
            print(
                f"round {r + 1} {config:>14}: timed fit {res['samples_per_s']:.1f} "
                f"samples/s after its first step, {res['fit_samples_per_s']:.1f} "
                f"over the whole fit; steps (ms) "
                f"{[round(1e3 * s) for s in timed['step_s']]}; second fit: "
                f"traces {timed.get('traces', 0)}, measurements "
                f"{timed.get('measurements', 0)}, confirmations "
                f"{timed.get('confirmations', 0)}; ran {res['effective']} "
                f"(load {res['load'][0]:.1f}-{res['load'][1]:.1f})",
                flush=True,
            )
        rounds.append(row)
    summary = {}
    for config in configs:
        if config == "float16":
            continue
        summary[f"{config} / float16"] = statistics.median(
            row[config]["samples_per_s"] / row["float16"]["samples_per_s"]
            for row in rounds
        )
    print(json.dumps({"median of per-round ratios (samples/s)": summary}, indent=1))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": " ".join(["python", *sys.argv]),
                    "np": args.np,
                    "model": args.model,
                    "warmup": args.warmup,
                    "steps": args.steps,
                    "force_trial": args.force_trial,
                    "rounds": args.rounds,
                    "per_round": rounds,
                    "summary": summary,
                },
                indent=1,
            )
            + "\n"
        )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
