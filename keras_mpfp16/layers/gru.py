"""GRU whose carry stays in float32 under mixed precision."""

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
class GRU(Float32CarryRNN, keras.layers.GRU):
    """Gated Recurrent Unit layer that keeps its carry in float32.

    A drop-in replacement for `keras.layers.GRU`: same arguments, same
    weights (`kernel`, `recurrent_kernel`, `bias`, in Keras's layout, so the
    weights of one load into the other), same masking, `return_sequences`,
    `return_state`, `stateful` and `Bidirectional` behaviour, both
    `reset_after` conventions.

    Under a float32 (or float64) policy it *is* Keras's GRU. Under
    `mixed_float16` or `mixed_bfloat16` the carry `h` stays float32 from step
    to step, the gates are computed in float32 with the float32 biases, and
    the recurrent product `h @ recurrent_kernel` uses `recurrent_precision`.
    The input projection `x @ kernel` runs once for the whole sequence, in
    `input_precision`. Both default to float32: measured, that is what removes
    the drift (see `keras_mpfp16.layers.precision`). Outputs are in the
    compute dtype, as in Keras. With
    `stateful=True` the carry is kept in float32 variables between batches,
    and `reset_state(lanes=...)` zeroes chosen batch rows only.

    Args:
        units: Positive integer, dimensionality of the output space.
        *args: Positional arguments after `units`, as for `keras.layers.GRU`.
        **kwargs: Every other argument of `keras.layers.GRU` (`activation`,
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
        initial_state: Optional list `[h]` with a `(batch, units)` tensor.
        mask: Optional boolean `(batch, timesteps)` tensor.
        training: Whether dropout is applied.

    Example:

    >>> keras.mixed_precision.set_global_policy("mixed_bfloat16")
    >>> gru = keras_mpfp16.layers.GRU(32)
    >>> gru(np.zeros((4, 1000, 6), "float32")).shape
    (4, 32)
    """

    def __init__(
        self,
        units: int,
        *args,
        recurrent_precision: str = DEFAULT_RECURRENT_PRECISION,
        input_precision: str = DEFAULT_INPUT_PRECISION,
        **kwargs,
    ):
        # Every Keras argument goes to keras.layers.GRU unchanged (so new
        # Keras arguments work without a change here).
        super().__init__(units, *args, **kwargs)
        self._init_float32_carry(recurrent_precision, input_precision)

    _fused_kind = "gru"

    def _float32_carry_loop(self, sequences, initial_state, mask, training):
        cell = self.cell
        units = cell.units
        reset_after = cell.reset_after
        recurrent = RecurrentProduct(
            read_uncast(cell.recurrent_kernel),
            self.recurrent_precision,
            self.compute_dtype,
        )
        bias = candidate_bias = None
        if cell.use_bias:
            bias = ops.cast(read_uncast(cell.bias), CARRY_DTYPE)
            if reset_after:
                # The update and reset gates see the input and recurrent
                # biases only through their sum: fold both into the input
                # projection. The candidate's recurrent bias sits inside
                # `r * (...)` and stays in the step.
                candidate_bias = bias[1, 2 * units :]
                bias = ops.concatenate(
                    [bias[0, : 2 * units] + bias[1, : 2 * units], bias[0, 2 * units :]]
                )
        time_major = self._time_major(sequences)
        projected, step_bias = self._project_inputs(
            sequences, read_uncast(cell.kernel), bias, training, 3, time_major
        )
        h_masks = self._recurrent_dropout_masks(initial_state, training, gate_count=3)
        gate_products = [
            recurrent.columns(g * units, (g + 1) * units) for g in range(3)
        ]
        update_reset_product = recurrent.columns(0, 2 * units)
        activation = cell.activation
        recurrent_activation = cell.recurrent_activation
        output_dtype = self.compute_dtype

        def step(projected_t, states):
            h_tm1 = states[0]
            x = ops.cast(projected_t, CARRY_DTYPE)
            if step_bias is not None:
                x = x + step_bias
            x_zr, x_h = ops.split(x, [2 * units], axis=-1)
            if h_masks is None:
                h_z = h_r = h_h = h_tm1
            else:
                h_z, h_r, h_h = (h_tm1 * m for m in h_masks)

            if h_masks is not None:
                inner_zr = ops.concatenate(
                    [gate_products[0](h_z), gate_products[1](h_r)], axis=-1
                )
                inner_h = gate_products[2](h_h) if reset_after else None
            elif reset_after:
                inner_zr, inner_h = ops.split(recurrent(h_tm1), [2 * units], axis=-1)
            else:
                inner_zr = update_reset_product(h_tm1)
            z, r = ops.split(x_zr + inner_zr, 2, axis=-1)
            z = recurrent_activation(z)
            r = recurrent_activation(r)
            if not reset_after:
                candidate = x_h + gate_products[2](r * h_h)
            elif candidate_bias is not None:
                candidate = x_h + r * (inner_h + candidate_bias)
            else:
                candidate = x_h + r * inner_h
            candidate = activation(candidate)
            # z * h + (1 - z) * candidate, one operation fewer.
            h = candidate + z * (h_tm1 - candidate)
            # Per-step outputs are stored for the whole sequence: keep them in
            # the compute dtype (half the memory); the carry stays float32.
            return ops.cast(h, output_dtype), [h]

        return self._run_time_loop(step, projected, initial_state, mask, time_major)
