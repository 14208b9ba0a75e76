"""Mixed-precision recurrent layers and lane helpers for truncated BPTT.

- `LSTM`, `GRU`: drop-in replacements for Keras's layers whose recurrent carry
  stays in float32 under `mixed_float16`/`mixed_bfloat16`.
- `LaneBatcher`: cuts long sequences into lanes of consecutive chunks.
- `reset_lanes`: zeroes chosen lanes in every stateful recurrent layer.
- `SyncBatchNormalization`: BatchNormalization over the global batch of all
  ranks (a drop-in for `keras.layers.BatchNormalization`).
"""

from keras_mpfp16.layers.gru import GRU
from keras_mpfp16.layers.lane_batcher import LaneBatcher, LaneChunk
from keras_mpfp16.layers.lane_reset import reset_lanes
from keras_mpfp16.layers.lstm import LSTM
from keras_mpfp16.layers.precision import INPUT_PRECISIONS, RECURRENT_PRECISIONS
from keras_mpfp16.layers.sync_batch_norm import SyncBatchNormalization

__all__ = [
    "GRU",
    "INPUT_PRECISIONS",
    "LSTM",
    "LaneBatcher",
    "LaneChunk",
    "RECURRENT_PRECISIONS",
    "SyncBatchNormalization",
    "reset_lanes",
]
