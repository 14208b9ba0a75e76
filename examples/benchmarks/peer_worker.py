"""One throughput measurement of the benchmark LSTM, for `peers.py`.

    --impl keras  plain Keras 3, one process
    --impl ours   keras_mpfp16.DistributedOptimizer (under mpirun, any size)
    --impl mwms   legacy tf_keras + tf.distribute.MultiWorkerMirroredStrategy;
                  TF_CONFIG comes from the environment (peers.py sets it)
    --impl horovod  Horovod 0.28.1 (horovod.tensorflow.keras) on TF 2.15's
                  Keras 2, under mpirun, in its own venv (horovod_setup.sh);
                  --wire float16 selects hvd.Compression.fp16

The model is the benchmark model of docs/measurement-conditions.md:
Input(128, 16) -> LSTM(128, return_sequences) -> LSTM(128) ->
Dense(1, sigmoid, float32); Adam; random data; per-rank batch 64.
Prints one JSON line (from rank/worker 0): global samples/s over the timed
steps, after warm-up steps that include tracing.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

T, F, UNITS = 128, 16, 128


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, T, F)).astype("float32")
    y = (rng.random((n, 1)) > 0.5).astype("float32")
    return x, y


def timer_callback(keras):
    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

    return Timer()


def build(keras, policy_setter, policy):
    policy_setter(policy)
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((T, F)),
            keras.layers.LSTM(UNITS, return_sequences=True),
            keras.layers.LSTM(UNITS),
            keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
        ]
    )


def seconds_per_step(stamps, warmup):
    s = stamps[warmup:]
    return (s[-1] - s[0]) / (len(s) - 1)


def run_keras3(args, distributed):
    import keras

    rank, size = 0, 1
    if distributed:
        import keras_mpfp16 as kmp

        rank, size = kmp.rank(), kmp.size()
    model = build(keras, keras.config.set_dtype_policy, args.policy)
    opt = keras.optimizers.Adam(1e-3)
    if distributed:
        opt = kmp.DistributedOptimizer(opt, wire_dtype=args.wire)
    model.compile(optimizer=opt, loss="binary_crossentropy", jit_compile=False)
    steps = args.warmup + args.steps
    x, y = data(steps * args.batch, seed=rank)
    timer = timer_callback(keras)
    model.fit(
        x,
        y,
        batch_size=args.batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[timer],
    )
    local = seconds_per_step(timer.stamps, args.warmup)
    if distributed:
        local = float(kmp.allreduce(np.float64(local), op="max"))
    return rank, size, local


def run_mwms(args):
    import tensorflow as tf
    import tf_keras as keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    size = strategy.num_replicas_in_sync
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    global_batch = args.batch * size
    with strategy.scope():
        model = build(keras, keras.mixed_precision.set_global_policy, args.policy)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    steps = args.warmup + args.steps
    x, y = data(steps * global_batch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    ds = ds.with_options(opts)
    timer = timer_callback(keras)
    model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    return rank, size, seconds_per_step(timer.stamps, args.warmup)


def run_horovod(args):
    # Horovod's documented Keras adoption: init, scale nothing (the per-rank
    # batch is fixed like ours), wrap the optimizer, broadcast rank 0's
    # variables with its callback. TF 2.15's tf.keras is Keras 2.
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    keras = tf.keras
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = build(keras, keras.mixed_precision.set_global_policy, args.policy)
    compression = hvd.Compression.fp16 if args.wire == "float16" else None
    opt = hvd.DistributedOptimizer(
        keras.optimizers.Adam(1e-3),
        compression=compression or hvd.Compression.none,
    )
    model.compile(optimizer=opt, loss="binary_crossentropy")
    steps = args.warmup + args.steps
    x, y = data(steps * args.batch, seed=rank)
    timer = timer_callback(keras)
    model.fit(
        x,
        y,
        batch_size=args.batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer],
    )
    local = seconds_per_step(timer.stamps, args.warmup)
    # The slowest rank's step time, as for ours (Keras-level API has no Max).
    local = float(np.max(hvd.allgather(np.array([local], np.float64))))
    return rank, size, local


def main():
    p = argparse.ArgumentParser()
    p.add_argument(
        "--impl", choices=["keras", "ours", "mwms", "horovod"], required=True
    )
    p.add_argument("--wire", choices=["float32", "float16"], default="float32")
    p.add_argument("--policy", default="float32")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    if args.impl == "mwms":
        rank, size, sps = run_mwms(args)
    elif args.impl == "horovod":
        rank, size, sps = run_horovod(args)
    else:
        rank, size, sps = run_keras3(args, distributed=args.impl == "ours")
    if rank == 0:
        print(
            json.dumps(
                {
                    "impl": args.impl,
                    "policy": args.policy,
                    "wire": args.wire,
                    "size": size,
                    "seconds_per_step": sps,
                    "samples_per_s": size * args.batch / sps,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
