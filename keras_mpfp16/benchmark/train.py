"""Training throughput of the stacked-LSTM benchmark model."""

from __future__ import annotations

import numpy as np

from keras_mpfp16.benchmark.models import count_params, random_data, stacked_lstm
from keras_mpfp16.benchmark.timing import StepTimer, median_ratio
from keras_mpfp16.runtime.mpi import collectives, world


def _compiled_model(cfg: dict, distributed: bool):
    import keras

    from keras_mpfp16.optimizer import DistributedOptimizer

    keras.config.set_dtype_policy(cfg["policy"])
    keras.utils.set_random_seed(0)
    model = stacked_lstm(
        cfg["timesteps"],
        cfg["features"],
        cfg["units"],
        cfg["layers"],
        cfg["layer_impl"],
    )
    opt = keras.optimizers.Adam(1e-3)
    if distributed:
        opt = DistributedOptimizer(
            opt, wire_dtype=cfg["wire_dtype"], bucket_size_mb=cfg["bucket_mb"]
        )
    model.compile(optimizer=opt, loss="binary_crossentropy", jit_compile=False)
    return model


def seconds_per_step(model, x, y, batch: int, steps: int) -> float:
    """Seconds per train step of one `fit` over `steps` batches (the slowest
    rank's), after skipping the first few steps."""
    timer = StepTimer()
    model.fit(
        x[: batch * steps],
        y[: batch * steps],
        batch_size=batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[timer],
    )
    local = timer.seconds_per_step(skip=min(3, steps - 2))
    return float(collectives.allreduce(np.float64(local), op="max"))


def throughput(cfg: dict, rounds: int = 5, plain: bool = False) -> dict:
    """Samples/s over all ranks, measured `rounds` times after a warm-up.

    Args:
        cfg: model and run settings (see `DEFAULTS` in `__main__`).
        plain: use the bare Keras optimizer (only meaningful with one process).
    """
    n = world.size()
    model = _compiled_model(cfg, distributed=not plain)
    batch, steps = cfg["batch"], cfg["steps"]
    x, y = random_data(
        batch * steps, cfg["timesteps"], cfg["features"], seed=world.rank()
    )
    seconds_per_step(model, x, y, batch, min(steps, 5))  # trace + warm up
    per_step = [seconds_per_step(model, x, y, batch, steps) for _ in range(rounds)]
    sps = [n * batch / s for s in per_step]
    return {
        "size": n,
        "params": count_params(model),
        "samples_per_s": float(np.median(sps)),
        "samples_per_s_all": sps,
        "seconds_per_step_all": per_step,
    }


def one_process_overhead(cfg: dict, rounds: int = 7) -> dict:
    """DistributedOptimizer vs the bare optimizer in one process, interleaved.

    Returns the median of per-round throughput ratios (ours / plain); 1.0
    means no overhead.
    """
    if world.size() != 1:
        raise ValueError("one_process_overhead runs without mpirun (one process).")
    batch, steps = cfg["batch"], cfg["steps"]
    x, y = random_data(batch * steps, cfg["timesteps"], cfg["features"])
    plain = _compiled_model(cfg, distributed=False)
    ours = _compiled_model(cfg, distributed=True)
    for m in (plain, ours):
        seconds_per_step(m, x, y, batch, min(steps, 5))
    t_plain, t_ours = [], []
    for i in range(rounds):
        # Alternate which model goes first (A B, B A, ...), so a position
        # effect within a round cannot favour either.
        first_plain = i % 2 == 0
        if first_plain:
            t_plain.append(seconds_per_step(plain, x, y, batch, steps))
        t_ours.append(seconds_per_step(ours, x, y, batch, steps))
        if not first_plain:
            t_plain.append(seconds_per_step(plain, x, y, batch, steps))
    return {
        "ratio_ours_over_plain": median_ratio(t_plain, t_ours),  # throughput ratio
        "plain_samples_per_s": [batch / t for t in t_plain],
        "ours_samples_per_s": [batch / t for t in t_ours],
    }
