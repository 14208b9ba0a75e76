"""`wire_dtype="auto"` across two `fit` calls of one model
(tests/test_wire_auto.py).

Usage: wire_auto_refit.py WARMUP STEPS

A warm-up `fit` of WARMUP steps, then a second `fit` of STEPS steps of the
same model, as a user timing the second would. Injected timings: the
reductions favour float16 on every rank, whole train steps favour float32
(rank-dependent numbers), so the decision goes float32 -> float16 (trial) ->
float32 when the trial fits in the warm-up.

Counted per fit, on each rank: traces of the train step (Python runs of
`DistributedOptimizer._reduce_and_apply`, which happen only while the step
is traced), the reductions' measurements (`wire_tuner.timings_hook`) and
whole-step confirmations (`wire_tuner.step_times_hook`), and the wire each
step ran. Prints one JSON line per rank.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.optimizer import distributed_optimizer  # noqa: E402
from keras_mpfp16.runtime.mpi import wire_tuner  # noqa: E402

warmup, steps = int(sys.argv[1]), int(sys.argv[2])
rank, size = kmp.rank(), kmp.size()
count = {}


def bump(what):
    count[what] = count.get(what, 0) + 1


def injected(distinct):
    bump("measured")
    per = {"float32": [1.0 + rank] * 3, "float16": [0.3 + 0.1 * rank] * 3}
    return {s: {w: [t * s * 1e-6 for t in v] for w, v in per.items()} for s in distinct}


def injected_steps(wire, seconds):
    if wire == "float32":
        bump("confirmed")
        return [0.010 + 0.001 * rank] * len(seconds)
    return [0.020 + 0.002 * rank] * len(seconds)


wire_tuner.timings_hook = injected
wire_tuner.step_times_hook = injected_steps
_own = distributed_optimizer.DistributedOptimizer._reduce_and_apply


def counted(self, grads, variables):
    bump("traced")  # Python runs this only while the train step is traced
    return _own(self, grads, variables)


distributed_optimizer.DistributedOptimizer._reduce_and_apply = counted


class Wires(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        count.setdefault("wires", []).append(self.model.optimizer.effective_wire_dtype)


keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
n = 8 * max(warmup, steps)
x = rng.normal(size=(n * size, 16)).astype("float32")
y = (x.mean(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential(
    [
        keras.Input((16,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
x, y = kmp.shard(x, y)
opt = kmp.DistributedOptimizer("sgd", wire_dtype="auto", bucket_size_mb=0.01)
model.compile(optimizer=opt, loss="binary_crossentropy")
fits = []
for k in (warmup, steps):
    count = {}
    model.fit(x[: 8 * k], y[: 8 * k], batch_size=8, callbacks=[Wires()], verbose=0)
    fits.append(count)

decision = opt.wire_decision
weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
print(
    json.dumps(
        {
            "rank": rank,
            "fits": fits,
            "decision": decision.as_dict(),
            "weights_bytes": weights.tobytes().hex(),
        }
    ),
    flush=True,
)
