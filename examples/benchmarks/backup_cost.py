"""What step-level backups cost: step time with and without
`keras.callbacks.BackupAndRestore(dir, save_freq=10)`, interleaved.

    mpirun -np 2 --bind-to none python examples/benchmarks/backup_cost.py \\
        --rounds 9 --steps 60 --out docs/benchmarks/backup_cost.json

The benchmark model (`python -m keras_mpfp16.benchmark`'s stacked LSTM,
2 x LSTM(128) over 128 x 16 inputs, Adam, batch 64 per rank), one job, one
model, rounds of two `fit`s of `--steps` steps each: "off" (no backup) and
"on" (a stock `BackupAndRestore(dir, save_freq=--freq)` in a fresh
directory; rank 0 copies the state in the step and writes it in the
background), in alternating order (off-on, on-off, ...). The step time of a
fit is the slowest rank's mean seconds per step over its steps after the
first 3 (backup steps included: that is the cost). The cost is the median
of per-round on/off ratios, minus 1. Also reported: the backups each "on"
fit wrote (rank 0 counts the renames it sees) and the time the in-step copy
takes (rank 0, best of 20, after the warm-up). The JSON is rewritten
after every round (`complete: false` until the end).

Prints each round's figures and a JSON summary (written to --out too).
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--freq", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_mpfp16 as kmp
    from keras_mpfp16.benchmark.models import random_data, stacked_lstm
    from keras_mpfp16.benchmark.timing import StepTimer, best_of
    from keras_mpfp16.internals import keras as keras_internals

    n, rank = kmp.size(), kmp.rank()
    keras.utils.set_random_seed(0)
    model = stacked_lstm(128, 16, 128, 2, "keras")
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
        loss="binary_crossentropy",
    )
    x, y = random_data(args.batch * args.steps, 128, 16, seed=rank)
    base = tempfile.mkdtemp(prefix="kmp-backup-cost-") if rank == 0 else None
    base = kmp.broadcast(base)
    writes = []

    class Renames(keras.callbacks.Callback):
        """Rank 0: counts the backups swapped in (the metadata's step changes)."""

        def __init__(self, directory):
            super().__init__()
            self.path = os.path.join(directory, "training_metadata.json")
            self.seen = set()

        def on_train_batch_end(self, batch, logs=None):
            try:
                with open(self.path) as f:
                    self.seen.add(f.read())
            except OSError:
                pass

    def one_fit(on: bool, r: int):
        timer = StepTimer()
        callbacks = [timer]
        counter = None
        if on:
            directory = os.path.join(base, f"round-{r}")
            callbacks.append(
                keras.callbacks.BackupAndRestore(
                    directory, save_freq=args.freq, delete_checkpoint=False
                )
            )
            if rank == 0:
                counter = Renames(directory)
                callbacks.append(counter)
        model.fit(
            x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
            callbacks=callbacks,
        )  # fmt: skip
        if counter is not None:
            writes.append(len(counter.seen))
        return float(kmp.allreduce(np.float64(timer.seconds_per_step(3)), op="max"))

    def write_summary(raw, copy_s, final):
        if rank != 0 or not raw["on"]:
            return
        summary = _summary(args, n, raw, writes, copy_s, final)
        if final:
            print(json.dumps(summary), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)

    one_fit(False, -1)  # warm-up: tracing, first epoch
    one_fit(True, -1)
    copy_s = None  # the in-step copy alone (rank 0)
    if rank == 0:
        copy_s = best_of(lambda: keras_internals.snapshot_weights(model), 20)
    raw = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for name in order:
            raw[name].append(one_fit(name == "on", r))
        if rank == 0:
            print(
                f"round {r + 1}: off={raw['off'][-1] * 1e3:.1f} "
                f"on={raw['on'][-1] * 1e3:.1f} ms/step",
                flush=True,
            )
        write_summary(raw, copy_s, final=False)  # kept if the run is cut short
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
    write_summary(raw, copy_s, final=True)


def _summary(args, n, raw, writes, copy_s, final):
    ratios = [a / b for a, b in zip(raw["on"], raw["off"])]
    return {
        "ranks": n,
        "rounds": args.rounds,
        "steps_per_fit": args.steps,
        "save_freq": args.freq,
        "batch_per_rank": args.batch,
        "seconds_per_step": raw,
        "median_ratio_on_off": statistics.median(ratios),
        "cost": statistics.median(ratios) - 1,
        "ratios": ratios,
        "backups_seen_per_on_fit": writes[1:],  # rank 0; warm-up left out
        "in_step_copy_s": copy_s,
        "complete": final,
        "load_1min_at_end": os.getloadavg()[0],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    main()
