"""LSTM whose carry stays in float32 under mixed precision."""

from __future__ import annotations

import keras
from keras import ops

from keras_mpfp16.internals.keras import read_uncast
from keras_mpfp16.layers.precision import (
    CARRY_DTYPE,
    DEFAULT_INPUT_PRECISION,
    DEFAULT_RECURRENT_PRECISION,
    RecurrentProduct,
)
from keras_mpfp16.layers.recurrent import Float32CarryRNN


@keras.saving.register_keras_serializable(package="keras_mpfp16")
class LSTM(Float32CarryRNN, keras.layers.LSTM):
    """Long Short-Term Memory layer that keeps its carry in float32.

    A drop-in replacement for `keras.layers.LSTM`: same arguments, same
    weights (`kernel`, `recurrent_kernel`, `bias`, in Keras's layout, so the
    weights of one load into the other), same masking, `return_sequences`,
    `return_state`, `stateful` and `Bidirectional` behaviour.

    Under a float32 (or float64) policy it *is* Keras's LSTM. Under
    `mixed_float16` or `mixed_bfloat16` it differs where Keras loses accuracy
    over long sequences: the carry `c` and `h` stay float32 from step to step,
    the gates are computed in float32 with the float32 bias, and the recurrent
    product `h @ recurrent_kernel` uses `recurrent_precision`. The input
    projection `x @ kernel` runs once for the whole sequence, in
    `input_precision`. Both default to float32: measured, that is what removes
    the drift (see `keras_mpfp16.layers.precision`). Outputs are in the
    compute dtype, as in Keras. With
    `stateful=True` the carry is kept in float32 variables between batches,
    and `reset_state(lanes=...)` zeroes chosen batch rows only.

    Args:
        units: Positive integer, dimensionality of the output space.
        *args: Positional arguments after `units`, as for `keras.layers.LSTM`.
        **kwargs: Every other argument of `keras.layers.LSTM` (`activation`,
            `dropout`, `return_sequences`, `stateful`, ...), with Keras's
            defaults and meaning, except `use_cudnn` below.
        use_cudnn: `"auto"`, `True` or `False`. Under float32 as in Keras
            (cuDNN when eligible). Under a 16-bit compute dtype `"auto"`
            means the float32-carry loop on a CPU, and on a TensorFlow GPU
            Keras's cuDNN kernel in float32 where the arguments are
            cuDNN-eligible and both precisions are `"float32"` (the same
            numbers); `True` forces Keras's cuDNN path, whose carry is in
            the compute dtype. `layer.recurrence_path` tells which runs.
        recurrent_precision: Precision of `h @ recurrent_kernel` under a
            16-bit compute dtype: `"float32"` (default), `"split"` (two
            half-precision products on the high and low parts of `h`) or
            `"compute"` (`h` rounded to the compute dtype for the product),
            or `"tf32x3"` (float32 accuracy from three products that TF32
            rounding leaves exact: for GPUs with TF32 on). Ignored under
            float32.
        input_precision: Precision of the input projection `x @ kernel`
            under a 16-bit compute dtype: `"float32"` (default),
            `"compute"` or `"tf32x3"`. Ignored under float32.

    Call arguments:
        sequences: A 3D tensor `(batch, timesteps, features)`.
        initial_state: Optional list `[h, c]` of `(batch, units)` tensors.
        mask: Optional boolean `(batch, timesteps)` tensor.
        training: Whether dropout is applied.

    Example:

    >>> keras.mixed_precision.set_global_policy("mixed_float16")
    >>> lstm = keras_mpfp16.layers.LSTM(32, return_sequences=True)
    >>> lstm(np.zeros((4, 1000, 6), "float32")).shape
    (4, 1000, 32)
    """

    def __init__(
        self,
        units: int,
        *args,
        recurrent_precision: str = DEFAULT_RECURRENT_PRECISION,
        input_precision: str = DEFAULT_INPUT_PRECISION,
        **kwargs,
    ):
        # Every Keras argument goes to keras.layers.LSTM unchanged (so new
        # Keras arguments work without a change here).
        super().__init__(units, *args, **kwargs)
        self._init_float32_carry(recurrent_precision, input_precision)

    _fused_kind = "lstm"

    def _float32_carry_loop(self, sequences, initial_state, mask, training):
        cell = self.cell
        recurrent = RecurrentProduct(
            read_uncast(cell.recurrent_kernel),
            self.recurrent_precision,
            self.compute_dtype,
        )
        bias = ops.cast(read_uncast(cell.bias), CARRY_DTYPE) if cell.use_bias else None
        time_major = self._time_major(sequences)
        projected, step_bias = self._project_inputs(
            sequences, read_uncast(cell.kernel), bias, training, 4, time_major
        )
        h_masks = self._recurrent_dropout_masks(initial_state, training, gate_count=4)
        if h_masks is not None:
            units = cell.units
            gate_products = [
                recurrent.columns(g * units, (g + 1) * units) for g in range(4)
            ]
        activation = cell.activation
        recurrent_activation = cell.recurrent_activation
        output_dtype = self.compute_dtype

        def step(projected_t, states):
            h_tm1, c_tm1 = states[0], states[1]
            z = ops.cast(projected_t, CARRY_DTYPE)
            if step_bias is not None:
                z = z + step_bias
            if h_masks is None:
                z = z + recurrent(h_tm1)
            else:
                z = z + ops.concatenate(
                    [p(h_tm1 * m) for p, m in zip(gate_products, h_masks)], axis=-1
                )
            z_i, z_f, z_c, z_o = ops.split(z, 4, axis=-1)
            c = recurrent_activation(z_f) * c_tm1 + recurrent_activation(
                z_i
            ) * activation(z_c)
            h = recurrent_activation(z_o) * activation(c)
            # Per-step outputs are stored for the whole sequence: keep them in
            # the compute dtype (half the memory); the carry stays float32.
            return ops.cast(h, output_dtype), [h, c]

        return self._run_time_loop(step, projected, initial_state, mask, time_major)
