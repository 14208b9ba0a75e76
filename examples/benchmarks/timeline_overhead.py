"""What the timeline costs: throughput with and without it, interleaved.

    mpirun -np 2 --bind-to none python examples/benchmarks/timeline_overhead.py \\
        --rounds 7 --steps 40 --out docs/benchmarks/timeline_overhead.json

The benchmark model (`python -m keras_mpfp16.benchmark`'s stacked LSTM,
2 x LSTM(128) over 128 x 16 inputs, batch 64 per rank), one job, one
model, rounds of two `fit`s of `--steps` steps each: "off" (no timeline)
and "on" (`kmp.callbacks.Timeline(path)` with the default window of 20
steps, report off; the trace is merged and written at the end of every
`fit`), in alternating order (off-on, on-off, ...). Throughput is samples/s
over all ranks from the slowest rank's seconds per step, first 3 steps of
each fit skipped; the overhead is 1 - median of per-round on/off ratios.
The fixed cost of a `fit` (clock alignment, merge, write) is reported
separately: median of per-round differences of the whole fit's wall time
minus its steps.

Prints each round's figures and a JSON summary (written to --out too).
"""

import argparse
import json
import os
import statistics
import tempfile
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_mpfp16 as kmp
    from keras_mpfp16.benchmark.models import random_data, stacked_lstm
    from keras_mpfp16.benchmark.timing import StepTimer

    n, rank = kmp.size(), kmp.rank()
    keras.utils.set_random_seed(0)
    model = stacked_lstm(128, 16, 128, 2, "keras")
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
        loss="binary_crossentropy",
    )
    x, y = random_data(args.batch * args.steps, 128, 16, seed=rank)
    trace_dir = tempfile.mkdtemp(prefix="kmp-timeline-")

    def one_fit(on: bool):
        timer = StepTimer()
        callbacks = [timer]
        if on:
            callbacks.append(kmp.callbacks.Timeline(os.path.join(trace_dir, "t.json")))
        t0 = time.perf_counter()
        model.fit(
            x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
            callbacks=callbacks,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        sps = float(kmp.allreduce(np.float64(timer.seconds_per_step(3)), op="max"))
        steps_s = sps * args.steps
        return n * args.batch / sps, float(kmp.allreduce(wall - steps_s, op="max"))

    one_fit(False)  # warm-up: tracing, first epoch
    one_fit(True)
    raw = {"off": [], "on": []}
    fixed = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for name in order:
            tput, extra = one_fit(name == "on")
            raw[name].append(tput)
            fixed[name].append(extra)
        if rank == 0:
            print(
                f"round {r + 1}: off={raw['off'][-1]:.0f} on={raw['on'][-1]:.0f} "
                f"samples/s  fixed per fit: off={fixed['off'][-1]:.2f}s "
                f"on={fixed['on'][-1]:.2f}s",
                flush=True,
            )
    ratios = [a / b for a, b in zip(raw["on"], raw["off"])]
    summary = {
        "ranks": n,
        "rounds": args.rounds,
        "steps_per_fit": args.steps,
        "batch_per_rank": args.batch,
        "samples_per_s": raw,
        "fixed_seconds_per_fit": fixed,
        "median_ratio_on_off": statistics.median(ratios),
        "overhead": 1 - statistics.median(ratios),
        "fixed_cost_s_median": statistics.median(
            a - b for a, b in zip(fixed["on"], fixed["off"])
        ),
    }
    if rank == 0:
        print(json.dumps(summary), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
