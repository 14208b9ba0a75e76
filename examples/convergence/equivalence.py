"""Checks that one process with batch N*b trains exactly like N real MPI ranks.

The scaling study (`scaling.py`) simulates N workers in one process. This
script runs `common.train_run` both ways on the same data, from the same
initial weights, without shuffling, with the study's optimizer and a
learning-rate warmup that ramps within the run:

- simulated: `python equivalence.py --role simulate --workers N`
  (batch N*b, `LearningRateScaler(num_workers=N)`);
- real: `mpirun -np N python equivalence.py --role real --workers N`
  (each rank its `kmp.shard(..., batch_size=b)`, batch b, gradients averaged
  by `kmp.DistributedOptimizer`, logs made global by `GlobalMetrics`);

and compares every step's logged loss and learning rate and the final
weights. The driver does all of it:

    python examples/convergence/equivalence.py --np 2 4 \
        --out docs/benchmarks/convergence_equivalence.json

The two differ only by float32 rounding: the sum of N per-rank mean
gradients is added in a different order than one mean over N*b rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.abspath(__file__)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--np", type=int, nargs="+", default=[2, 4], help="values of N to check"
    )
    p.add_argument("--role", choices=["driver", "simulate", "real"], default="driver")
    p.add_argument("--workers", type=int, default=2, help="N (simulate/real roles)")
    p.add_argument("--batch", type=int, default=32, help="per-worker batch b")
    p.add_argument("--steps", type=int, default=6, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--rule", default="linear")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--result", help="(simulate/real) .npz written by rank 0")
    p.add_argument("--out", help="(driver) JSON with the comparison")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launch")
    return p.parse_args(argv)


def train_and_save(args):
    """One side of the comparison; rank 0 writes losses, rates and weights."""
    import common
    import numpy as np

    import keras_mpfp16 as kmp

    n = args.workers
    x, y = common.shot_windows(args.steps * n * args.batch, 32, seed=5, strength=0.5)
    model, record, seconds, _ = common.train_run(
        x,
        y,
        workers=n,
        batch=args.batch,
        rule=args.rule,
        warmup_epochs=args.warmup_epochs,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        momentum=0.9,
        units=32,
        seed=7,
        shuffle=False,
    )
    if kmp.rank() == 0:
        np.savez(
            args.result,
            losses=np.asarray(record.losses),
            rates=np.asarray(record.rates),
            ranks=np.asarray(kmp.size()),
            **{f"w{i}": w for i, w in enumerate(model.get_weights())},
        )


def launch(cmd, timeout):
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )


def mpirun():
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else "mpirun"


def compare(simulated, real):
    import numpy as np

    weights = [k for k in simulated.files if k.startswith("w")]
    rel = [
        float(
            np.max(np.abs(real[k] - simulated[k]))
            / (np.max(np.abs(simulated[k])) + 1e-12)
        )
        for k in weights
    ]
    return {
        "ranks": int(real["ranks"]),
        "steps": len(simulated["losses"]),
        "max_weight_rel_diff": max(rel),
        "max_loss_abs_diff": float(
            np.max(np.abs(real["losses"] - simulated["losses"]))
        ),
        "max_rate_abs_diff": float(np.max(np.abs(real["rates"] - simulated["rates"]))),
        "losses_simulated": simulated["losses"].tolist(),
        "losses_real": real["losses"].tolist(),
        "rates": simulated["rates"].tolist(),
    }


def drive(args):
    import numpy as np

    common_args = [
        "--batch", str(args.batch), "--steps", str(args.steps),
        "--epochs", str(args.epochs), "--learning-rate", str(args.learning_rate),
        "--rule", args.rule, "--warmup-epochs", str(args.warmup_epochs),
    ]  # fmt: skip
    results = {
        "check": "convergence_equivalence",
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(
            ["python", "examples/convergence/equivalence.py", *sys.argv[1:]]
        ),
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("role", "result", "out")
        },
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.np:
            sim, real = (
                os.path.join(tmp, f"sim{n}.npz"),
                os.path.join(tmp, f"real{n}.npz"),
            )
            base = [HERE, "--workers", str(n), *common_args]
            launch(
                [sys.executable, *base, "--role", "simulate", "--result", sim],
                args.timeout,
            )
            launch(
                [mpirun(), "-np", str(n), "--oversubscribe", "--bind-to", "none",
                 sys.executable, *base, "--role", "real", "--result", real],
                args.timeout,
            )  # fmt: skip
            with np.load(sim) as s, np.load(real) as r:
                row = {"workers": n, **compare(s, r)}
            results["results"].append(row)
            print(
                f"N={n}: {row['steps']} steps, max weight rel diff "
                f"{row['max_weight_rel_diff']:.2e}, max loss diff "
                f"{row['max_loss_abs_diff']:.2e}, max rate diff {row['max_rate_abs_diff']:.2e}",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


def main(argv=None):
    args = parse_args(argv)
    if args.role == "driver":
        return drive(args)
    train_and_save(args)
    return None


if __name__ == "__main__":
    main()
