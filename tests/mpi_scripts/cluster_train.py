"""Training across emulated nodes, for the network-fault test.

  python cluster_train.py MODE DIR

MODE:
  cut     4 epochs of 12 steps with AtomicModelCheckpoint(DIR/last.keras);
          rank 0 writes DIR/reached when epoch 2 is half done (the test then
          cuts a node's link) and training goes on
  resume  load DIR/last.keras and finish the 4 epochs
  full    the same 4 epochs uninterrupted (reference for resume)

Every rank writes its pid to DIR/pid.R at start; resume and full print one
JSON line per rank with a digest of the final weights.
"""

import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import fit_in_order, lstm_model_or_checkpoint  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

mode, out = sys.argv[1], sys.argv[2]
rank = kmp.rank()
with open(os.path.join(out, f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
b, steps, epochs = 8, 12, 4
rng = np.random.default_rng(rank)
x = rng.normal(size=(steps * b, 6, 3)).astype("float32")
y = rng.normal(size=(steps * b, 1)).astype("float32")
path = os.path.join(out, "last.keras")


class Reached(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if mode == "cut" and rank == 0 and self.epoch == 2 and batch == steps // 2:
            with open(os.path.join(out, "reached"), "w") as f:
                f.write("1")
            # Rank 1 now waits in the next step's allreduce; the test cuts
            # the link meanwhile, so the cut lands mid-epoch.
            time.sleep(3)


model, start = lstm_model_or_checkpoint(path, steps, resume=mode == "resume")
callbacks = [Reached()]
if mode == "cut":
    callbacks.append(kmp.callbacks.AtomicModelCheckpoint(path))
fit_in_order(
    model, x, y, batch_size=b, epochs=epochs, initial_epoch=start, callbacks=callbacks
)
digest = hashlib.sha256(
    b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
).hexdigest()
print(json.dumps({"rank": rank, "start": start, "digest": digest}), flush=True)
