"""Keras's output once per job, whatever the script does to Keras's state (issue 28, item 2).

Run as `mpirun -np N python output_once.py`. A script that calls
`model.summary()` and `fit(verbose=2)` (epoch lines), then
`keras.backend.clear_session()` (which resets Keras's global state,
interactive-logging flag included; KerasTuner calls it before every
trial) and builds a second model, then switches Keras's interactive
logging off and back on itself, each followed by a summary and a `fit`.
Each step is framed by `MARK <step> rank <r>` lines (the user's own
`print`, on every rank); the test counts Keras's lines in between.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

rank = kmp.rank()
rng = np.random.default_rng(0)
x = rng.random((48, 5), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)


def mark(step: str) -> None:
    kmp.barrier()  # every rank's Keras output of the step is out
    print(f"MARK {step} rank {rank}", flush=True)
    kmp.barrier()


def model_run(name: str) -> None:
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(3), keras.layers.Dense(1)], name=name
    )
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    model.summary()
    model.fit(*kmp.shard(x, y), batch_size=4, epochs=2, verbose=2)


mark("start")
model_run("first")
mark("first")
keras.backend.clear_session()
model_run("after_clear_session")
mark("after_clear_session")
keras.utils.disable_interactive_logging()
keras.utils.enable_interactive_logging()
model_run("after_enable")
mark("after_enable")
keras.config.enable_interactive_logging()
keras.backend.clear_session()
model_run("last")
mark("last")
