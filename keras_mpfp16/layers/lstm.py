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
        activation: Activation function to use. Default: `"tanh"`.
        recurrent_activation: Activation for the gates. Default: `"sigmoid"`.
        use_bias: Whether the layer uses a bias vector. Default: `True`.
        kernel_initializer: Initializer for `kernel`. Default:
            `"glorot_uniform"`.
        recurrent_initializer: Initializer for `recurrent_kernel`. Default:
            `"orthogonal"`.
        bias_initializer: Initializer for the bias. Default: `"zeros"`.
        unit_forget_bias: If `True`, add 1 to the forget-gate bias at
            initialization (and force `bias_initializer="zeros"`).
        kernel_regularizer: Regularizer for `kernel`.
        recurrent_regularizer: Regularizer for `recurrent_kernel`.
        bias_regularizer: Regularizer for the bias.
        activity_regularizer: Regularizer for the layer output.
        kernel_constraint: Constraint for `kernel`.
        recurrent_constraint: Constraint for `recurrent_kernel`.
        bias_constraint: Constraint for the bias.
        dropout: Fraction of the input units to drop. Default: 0.
        recurrent_dropout: Fraction of the recurrent units to drop.
            Default: 0.
        seed: Random seed for dropout.
        return_sequences: Whether to return the whole output sequence or only
            the last output. Default: `False`.
        return_state: Whether to return the last state (`h`, `c`) in addition
            to the output. Returned states are in the compute dtype.
        go_backwards: If `True`, process the input sequence backwards and
            return the reversed sequence.
        stateful: If `True`, the last state of each batch row is the initial
            state of the same row in the next batch.
        unroll: If `True`, unroll the time loop (short sequences only).
        use_cudnn: `"auto"`, `True` or `False`. Under float32 as in Keras
            (cuDNN when eligible). Under a 16-bit compute dtype `"auto"`
            means the float32-carry loop; `True` forces Keras's cuDNN path,
            whose carry is in the compute dtype.
        recurrent_precision: Precision of `h @ recurrent_kernel` under a
            16-bit compute dtype: `"float32"` (default), `"split"` (two
            half-precision products on the high and low parts of `h`) or
            `"compute"` (`h` rounded to the compute dtype for the product).
            Ignored under float32.
        input_precision: Precision of the input projection `x @ kernel`
            under a 16-bit compute dtype: `"float32"` (default) or
            `"compute"`. Ignored under float32.

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
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        unit_forget_bias: bool = True,
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        seed: int | None = None,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        stateful: bool = False,
        unroll: bool = False,
        use_cudnn="auto",
        recurrent_precision: str = DEFAULT_RECURRENT_PRECISION,
        input_precision: str = DEFAULT_INPUT_PRECISION,
        **kwargs,
    ):
        super().__init__(
            units,
            activation=activation,
            recurrent_activation=recurrent_activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            bias_initializer=bias_initializer,
            unit_forget_bias=unit_forget_bias,
            kernel_regularizer=kernel_regularizer,
            recurrent_regularizer=recurrent_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            recurrent_constraint=recurrent_constraint,
            bias_constraint=bias_constraint,
            dropout=dropout,
            recurrent_dropout=recurrent_dropout,
            seed=seed,
            return_sequences=return_sequences,
            return_state=return_state,
            go_backwards=go_backwards,
            stateful=stateful,
            unroll=unroll,
            use_cudnn=use_cudnn,
            **kwargs,
        )
        self._init_float32_carry(recurrent_precision, input_precision)

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
