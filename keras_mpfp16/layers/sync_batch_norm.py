"""BatchNormalization whose training statistics are those of the global batch."""

from __future__ import annotations

import keras
from keras import ops

from keras_mpfp16 import backend as backends
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.process import launcher_env as launcher


def _distributed() -> bool:
    """Whether this process trains with others (without starting MPI in a
    process that no launcher started)."""
    if not world.is_initialized():
        launch = launcher.detect()
        if launch is None or launch.size <= 1:
            return False
    return world.size() > 1


@keras.saving.register_keras_serializable(package="keras_mpfp16")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization over the global batch of all ranks.

    A drop-in replacement for `keras.layers.BatchNormalization` (same
    arguments, weights and `.keras` format) for data-parallel training under
    `mpirun`. In training (`training=True`), Keras's layer normalises each
    rank's batch with that batch's own mean and variance, so N ranks of b
    rows train a different model than one process of N·b rows. This layer
    normalises with the mean and variance of the *global* batch, the union
    of all ranks' batches of this step: the forward pass and the gradients
    are those of one process on the concatenated batch (up to float
    rounding), and the moving statistics come out identical on every rank.

    How: each rank computes, per feature, its count of values, their mean
    and the sum of squared deviations from that mean (in the input's dtype,
    float32 under mixed precision as in Keras), and one allreduce of those
    (float64, 3 numbers per feature) gives the global count, mean and
    variance. Counting is per value, so partial batches, ranks with batches
    of different sizes and masked time steps are exact. The backward pass
    makes one more allreduce of the same size (the gradient of the global
    statistics is the sum over ranks). With one process it *is* Keras's
    layer: no communication, the same code runs.

    In inference (`training=False`, `evaluate`, `predict`) it uses the
    moving statistics and communicates nothing, like Keras's layer.

    Every rank must call the layer in training the same number of times
    (as `fit`, and a custom loop that runs the same steps on every rank,
    do): each call is a collective. Only the TensorFlow backend supports
    more than one process.

    Args:
        axis: Integer, the axis that should be normalized (typically the
            features axis).
        momentum: Momentum for the moving average.
        epsilon: Small float added to variance to avoid dividing by zero.
        center: If True, add offset of `beta` to normalized tensor.
        scale: If True, multiply by `gamma`.
        beta_initializer: As in `keras.layers.BatchNormalization`.
        gamma_initializer: As in `keras.layers.BatchNormalization`.
        moving_mean_initializer: As in `keras.layers.BatchNormalization`.
        moving_variance_initializer: As in `keras.layers.BatchNormalization`.
        beta_regularizer: As in `keras.layers.BatchNormalization`.
        gamma_regularizer: As in `keras.layers.BatchNormalization`.
        beta_constraint: As in `keras.layers.BatchNormalization`.
        gamma_constraint: As in `keras.layers.BatchNormalization`.
        renorm: As in `keras.layers.BatchNormalization`.
        renorm_clipping: As in `keras.layers.BatchNormalization`.
        renorm_momentum: As in `keras.layers.BatchNormalization`.
        synchronized: Keras's `tf.distribute` switch; must stay False (this
            layer synchronizes over MPI ranks by itself).
        **kwargs: Base layer keyword arguments (e.g. `name`, `dtype`).

    Call arguments:
        inputs: Input tensor (of any rank).
        training: Python boolean, whether the layer normalizes with the
            global batch's statistics (True) or the moving statistics.
        mask: Binary tensor of shape broadcastable to `inputs` without its
            last axis; masked values are left out of the statistics, as in
            Keras.

    Example:

    ```python
    import keras
    import keras_mpfp16 as kmp

    model = keras.Sequential([
        keras.Input((None, 28)),
        keras.layers.LSTM(64),
        kmp.layers.SyncBatchNormalization(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    ```
    """

    def __init__(self, *args, **kwargs):
        if kwargs.get("synchronized"):
            raise ValueError(
                "SyncBatchNormalization(synchronized=True): received "
                "synchronized=True; allowed: False (the default). This layer "
                "synchronizes its statistics over the MPI ranks by itself; "
                "Keras's `synchronized` argument is for tf.distribute strategies."
            )
        super().__init__(*args, **kwargs)

    def _moments(self, inputs, mask):
        if not _distributed():
            return super()._moments(inputs, mask)
        return self._global_moments(inputs, mask)

    def _global_moments(self, inputs, mask):
        axes = self._reduction_axes
        dtype = inputs.dtype
        if mask is None:
            keep = None
            count = ops.sum(ops.ones_like(inputs), axis=axes, keepdims=True)
            total = ops.sum(inputs, axis=axes, keepdims=True)
        else:
            keep = ops.cast(
                ops.broadcast_to(ops.expand_dims(mask, axis=-1), ops.shape(inputs)),
                "bool",
            )
            count = ops.sum(ops.cast(keep, dtype), axis=axes, keepdims=True)
            total = ops.sum(ops.where(keep, inputs, 0), axis=axes, keepdims=True)
        # This rank's mean and sum of squared deviations from it (a two-pass
        # form, as Keras's local moments): accurate in float32.
        local_mean = total / ops.maximum(count, 1)
        deviation = inputs - ops.stop_gradient(local_mean)
        if keep is not None:
            deviation = ops.where(keep, deviation, 0)
        squares = ops.sum(ops.square(deviation), axis=axes, keepdims=True)

        n = ops.reshape(ops.cast(count, "float64"), (-1,))
        mean = ops.reshape(ops.cast(local_mean, "float64"), (-1,))
        m2 = ops.reshape(ops.cast(squares, "float64"), (-1,))
        # Per feature: count, sum, sum of squares about zero, in float64. The
        # combination below cancels only the ranks' means against the global
        # mean, exactly representable products of float32 values in float64.
        local = ops.concatenate([n, n * mean, m2 + n * mean * mean], axis=0)
        glob = backends.bridge().allreduce_sum_differentiable(
            local, name=f"SyncBatchNormalization statistics ({self.name})"
        )
        global_n, global_sum, global_squares = ops.split(glob, 3, axis=0)
        global_n = ops.maximum(global_n, 1.0)
        global_mean = global_sum / global_n
        variance = ops.maximum(global_squares / global_n - ops.square(global_mean), 0.0)
        return ops.cast(global_mean, dtype), ops.cast(variance, dtype)
