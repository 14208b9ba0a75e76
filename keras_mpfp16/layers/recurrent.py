"""Float32-carry behaviour shared by the mixed-precision `LSTM` and `GRU`.

Keras's recurrent layers, under a mixed policy, cast the carry to the compute
dtype at every step: `RNN.call` casts the initial state, each `cell(...)` call
casts its state arguments, and every weight reads as float16. Over thousands of
steps with a long-memory gate the rounding accumulates into large drift. The
mixin here replaces `RNN.call` and `RNN.inner_loop` when the compute dtype is
16-bit: the input projection `x @ W` runs once for the whole sequence (in
float32 by default, see `precision.py`), and the time loop keeps the carry,
the gate arithmetic and (by default) the recurrent product in float32. Under any other compute dtype
it defers to Keras untouched, so float32 behaviour is exactly Keras's.
"""

from __future__ import annotations

from keras import config as keras_config
from keras import ops, tree

from keras_mpfp16 import _validate
from keras_mpfp16.internals.keras import fused_rnn, read_uncast, rnn_loop
from keras_mpfp16.layers import dispatch
from keras_mpfp16.layers.lane_reset import reset_state_lanes
from keras_mpfp16.layers.precision import (
    CARRY_DTYPE,
    keeps_float32_carry,
    split_tf32,
    tf32x3_matmul,
    validate_input_precision,
    validate_recurrent_precision,
)


class Float32CarryRNN:
    """Mixin placed before `keras.layers.LSTM`/`GRU` in the bases.

    Subclasses implement `_float32_carry_loop(sequences, initial_state, mask,
    training)` with the same return value as `RNN.inner_loop`.
    """

    def _init_float32_carry(
        self, recurrent_precision: str, input_precision: str
    ) -> None:
        self.recurrent_precision = validate_recurrent_precision(recurrent_precision)
        self.input_precision = validate_input_precision(input_precision)
        if self.keeps_float32_carry and not self.use_cudnn:
            # Keras turns XLA off for a layer that may take the cuDNN path; the
            # float32-carry loop is plain ops and compiles.
            self.supports_jit = True

    @property
    def keeps_float32_carry(self) -> bool:
        """True when the layer runs its own float32-carry loop (16-bit compute)."""
        return keeps_float32_carry(self.compute_dtype)

    @property
    def input_dtype(self):
        # Keras casts a layer's inputs (and `initial_state`) to `input_dtype`
        # before `call`. Under a 16-bit compute dtype take them in float32:
        # float32 data is not rounded before the input projection, float16
        # inputs are widened exactly, and given initial states keep float32.
        if self.keeps_float32_carry:
            return CARRY_DTYPE
        return super().input_dtype

    # `use_cudnn` reads as whether cuDNN may be used. Under a 16-bit compute
    # dtype "auto" means no: the cuDNN kernels carry the state in the compute
    # dtype. Keras's `Bidirectional` reads this attribute to decide on its own
    # fused cuDNN path, so it must tell the truth.
    @property
    def use_cudnn(self):
        # No default here: before the first assignment this must raise
        # AttributeError, or the tracking `__setattr__` of Keras's TensorFlow
        # layers, which skips `self.x = v` when `self.x is v`, would skip the
        # setter.
        requested = self._requested_use_cudnn
        if requested == "auto" and self.keeps_float32_carry:
            return False
        return requested

    @use_cudnn.setter
    def use_cudnn(self, value):
        self._requested_use_cudnn = _validate.one_of(
            "use_cudnn", value, ("auto", True, False)
        )

    @property
    def recurrence_path(self) -> str:
        """Which code runs the recurrence: one of `dispatch.PATHS`.

        `"keras"` under a float32/float64 compute dtype (Keras's layer,
        cuDNN by Keras's rules); under a 16-bit one `"loop"` (the
        float32-carry loop), `"cudnn-float32"` (a TensorFlow GPU,
        cuDNN-eligible arguments, float32 products: Keras's fused kernel in
        float32) or `"cudnn-compute"` (`use_cudnn=True`).
        """
        return dispatch.choose_path(
            half_compute=self.keeps_float32_carry,
            requested=self._requested_use_cudnn,
            input_precision=self.input_precision,
            recurrent_precision=self.recurrent_precision,
            arguments_ok=dispatch.cudnn_arguments_ok(self),
            gpu=dispatch.gpu_present(),
        )

    def call(self, sequences, initial_state=None, mask=None, training=False):
        if not self.keeps_float32_carry:
            return super().call(
                sequences, initial_state=initial_state, mask=mask, training=training
            )
        if self.unroll and sequences.shape[1] is None:
            raise ValueError(
                "Cannot unroll a RNN if the time dimension is undefined. Pass "
                "an `Input()` with a known `shape` or `batch_shape`."
            )
        initial_state = self._float32_initial_state(sequences, initial_state)
        # The cell's dropout masks are made once per call, before the loop
        # (a TensorFlow while loop cannot create them), and dropped after it
        # so the next call draws new ones: what Keras's RNN.call does, with
        # the cell's public mask methods.
        cell = self.cell
        cell.get_dropout_mask(sequences[:, 0, :])
        cell.get_recurrent_dropout_mask(initial_state[0])
        try:
            last_output, outputs, states = self.inner_loop(
                sequences=sequences,
                initial_state=initial_state,
                mask=mask,
                training=training,
            )
        finally:
            cell.reset_dropout_mask()
            cell.reset_recurrent_dropout_mask()
        states = [ops.cast(state, CARRY_DTYPE) for state in tree.flatten(states)]
        if self.stateful:
            for variable, state in zip(tree.flatten(self.states), states):
                variable.assign(state)

        output = outputs if self.return_sequences else last_output
        output = ops.cast(output, self.compute_dtype)
        if self.return_state:
            # Returned states follow Keras's convention (compute dtype); the
            # float32 carry is kept across calls by `stateful=True`.
            return output, *[ops.cast(s, self.compute_dtype) for s in states]
        return output

    def _float32_initial_state(self, sequences, initial_state):
        if self.stateful and self.states is not None:
            # The batch size the state variables were created for.
            expected = tree.flatten(self.states)[0].shape[0]
            actual = sequences.shape[0]
            if expected is not None and actual is not None and actual != expected:
                raise ValueError(
                    "If an RNN is stateful, the batch size of the input "
                    "sequences must be the same as the batch size of the "
                    f"initial state. Expected {expected}, received {actual}."
                )
        if initial_state is None:
            if self.stateful:
                return [read_uncast(v) for v in tree.flatten(self.states)]
            batch_size = ops.shape(sequences)[0]
            return [
                ops.zeros((batch_size, size), dtype=CARRY_DTYPE)
                for size in self.state_size
            ]
        if not tree.is_nested(initial_state):
            initial_state = [initial_state]
        return [ops.cast(state, CARRY_DTYPE) for state in tree.flatten(initial_state)]

    def inner_loop(self, sequences, initial_state, mask, training=False):
        if not self.keeps_float32_carry:
            return super().inner_loop(sequences, initial_state, mask, training=training)
        if tree.is_nested(mask):
            mask = mask[0]
        path = self.recurrence_path
        dispatch.notice_tf32(path, self.input_precision, self.recurrent_precision)
        if path == "cudnn-compute":
            # Explicitly requested cuDNN: Keras's path, whose kernels take and
            # return the carry in the compute dtype.
            half_state = [ops.cast(s, self.compute_dtype) for s in initial_state]
            sequences = ops.cast(sequences, self.compute_dtype)
            return super().inner_loop(sequences, half_state, mask, training=training)
        if path == "cudnn-float32":
            try:
                result = self._fused_float32(sequences, initial_state, mask, training)
            except NotImplementedError:
                pass  # no fused kernel for these arguments after all: the loop
            else:
                # As Keras does: the cuDNN ops do not compile with XLA.
                self.supports_jit = False
                return result
        return self._float32_carry_loop(sequences, initial_state, mask, training)

    def _fused_float32(self, sequences, initial_state, mask, training):
        """Keras's fused (cuDNN) kernel on float32 inputs, states and weights.

        What Keras's `LSTM.inner_loop`/`GRU.inner_loop` do on their cuDNN
        path, with every tensor float32: the kernel then computes the same
        float32 LSTM/GRU as the float32-carry loop with float32 products.
        Raises `NotImplementedError` where the backend has no fused kernel.
        """
        cell = self.cell
        sequences = ops.cast(sequences, CARRY_DTYPE)
        if training and cell.dropout:
            dp_mask = cell.get_dropout_mask(sequences[:, 0, :])
            if isinstance(dp_mask, (list, tuple)):
                raise NotImplementedError  # per-gate masks (implementation=1)
            dp_mask = ops.expand_dims(ops.cast(dp_mask, CARRY_DTYPE), axis=1)
            sequences = sequences * ops.broadcast_to(dp_mask, ops.shape(sequences))
        states = [ops.cast(s, CARRY_DTYPE) for s in initial_state]
        weights = {
            "kernel": read_uncast(cell.kernel),
            "recurrent_kernel": read_uncast(cell.recurrent_kernel),
            "bias": read_uncast(cell.bias),
            "activation": cell.activation,
            "recurrent_activation": cell.recurrent_activation,
            "return_sequences": self.return_sequences,
            "go_backwards": self.go_backwards,
            "unroll": self.unroll,
        }
        if self._fused_kind == "lstm":
            return fused_rnn("lstm")(sequences, states[0], states[1], mask, **weights)
        return fused_rnn("gru")(
            sequences, states[0], mask, reset_after=cell.reset_after, **weights
        )

    # -- helpers for the subclasses' loops ---------------------------------

    @staticmethod
    def _time_major(sequences) -> bool:
        """Whether to run the loop time-major.

        Time-major transposes the input while it is narrow (`features` wide)
        instead of the 3-4x wider projection and, in the backward pass, its
        gradient. The backends' loops need a static number of steps for it
        (with `time_major=True` and no `input_length`, TensorFlow's takes the
        length from axis 1, the batch), so unknown lengths run batch-major.
        """
        return sequences.shape[1] is not None

    def _project_inputs(
        self, sequences, kernel, bias, training, gate_count: int, time_major: bool
    ):
        """`x @ W (+ b)` for every time step at once, in `input_precision`.

        Args:
            sequences: `(batch, time, features)` inputs.
            kernel: The float32 master value of the input kernel.
            bias: Float32 bias to add to the projection, or None.
            training: Whether to apply the cell's input dropout.
            gate_count: Gates stacked in the kernel (4 for LSTM, 3 for GRU).
            time_major: Return the projection as `(time, batch, ...)`.

        Returns:
            `(projected, step_bias)`. With `input_precision="float32"`,
            `projected` is float32 with the bias already added (one addition
            for the whole sequence) and `step_bias` is None. With `"compute"`,
            `projected` is in the compute dtype and `step_bias` is the float32
            bias, to add in float32 inside the step: a bias such as a
            forget-gate bias of 8 would lose three bits if added in float16.

        Applies the cell's input dropout mask(s) the way Keras's cell does:
        one mask shared by all gates, or one per gate (implementation 1).
        """
        cell = self.cell
        exact = self.input_precision in ("float32", "tf32x3")
        dtype = CARRY_DTYPE if exact else self.compute_dtype
        sequences = ops.cast(sequences, CARRY_DTYPE)
        if time_major:
            sequences = ops.transpose(sequences, (1, 0, 2))
        time_axis = 0 if time_major else 1
        if self.input_precision == "tf32x3":
            parts = split_tf32(kernel)

            def matmul(a, k):
                return tf32x3_matmul(a, tuple(p[:, k] for p in parts))

            kernel = slice(None)  # the column range each product takes
        else:
            kernel = ops.cast(kernel, dtype)
            matmul = ops.matmul
        if not (training and 0.0 < cell.dropout < 1.0):
            projected = matmul(ops.cast(sequences, dtype), kernel)
        else:
            masks = cell.get_dropout_mask(ops.take(sequences, 0, axis=time_axis))
            if isinstance(masks, (list, tuple)) and isinstance(kernel, slice):
                width = self.cell.units
                gate_kernels = [
                    slice(g * width, (g + 1) * width) for g in range(gate_count)
                ]
            elif isinstance(masks, (list, tuple)):
                gate_kernels = ops.split(kernel, gate_count, axis=1)
            else:
                masks, gate_kernels = [masks], [kernel]
            products = [
                matmul(
                    ops.cast(
                        sequences
                        * ops.expand_dims(ops.cast(m, CARRY_DTYPE), time_axis),
                        dtype,
                    ),
                    k,
                )
                for m, k in zip(masks, gate_kernels)
            ]
            projected = (
                products[0] if len(products) == 1 else ops.concatenate(products, -1)
            )
        if bias is None or not exact:
            return projected, bias
        return projected + bias, None

    def _recurrent_dropout_masks(self, initial_state, training, gate_count: int):
        """Per-gate float32 masks for `h`, or None when not dropping."""
        cell = self.cell
        if not (training and 0.0 < cell.recurrent_dropout < 1.0):
            return None
        masks = cell.get_recurrent_dropout_mask(initial_state[0])
        if not isinstance(masks, (list, tuple)):
            masks = [masks] * gate_count
        return [ops.cast(m, CARRY_DTYPE) for m in masks]

    def _run_time_loop(self, step, projected, initial_state, mask, time_major: bool):
        """Runs `step` over `projected` with the backend's loop.

        The same fused loop as Keras's RNN (no Python per time step). Returns
        `(last_output, outputs, states)` with batch-major `outputs`, as
        `RNN.inner_loop` does.
        """
        if keras_config.backend() == "torch" and self.stateful:
            # As in Keras's RNN: fresh copies keep in-place state updates
            # from breaking PyTorch's autograd.
            inner_step = step

            def step(inputs, states):
                return inner_step(inputs, [ops.copy(s) for s in states])

        if time_major and mask is not None:
            mask = ops.transpose(mask, (1, 0))
        last_output, outputs, states = rnn_loop(
            step,
            projected,
            initial_state,
            go_backwards=self.go_backwards,
            mask=mask,
            unroll=self.unroll,
            input_length=projected.shape[0 if time_major else 1],
            time_major=time_major,
            zero_output_for_mask=self.zero_output_for_mask,
            return_all_outputs=self.return_sequences,
        )
        if time_major:
            outputs = ops.transpose(outputs, (1, 0, 2))
        return last_output, outputs, states

    # -- per-lane state reset ----------------------------------------------

    def reset_state(self, lanes=None) -> None:
        """Zeroes the stateful carry, of every lane or of the given lanes.

        Args:
            lanes: None (all lanes, as in Keras), a boolean mask of shape
                `(batch_size,)` with True for each lane to reset, or a
                sequence of lane indices. Other lanes keep their state.
        """
        if lanes is None:
            super().reset_state()
            return
        if not self.stateful or self.states is None:
            raise ValueError(
                f"reset_state(lanes=...) needs a built stateful layer; layer "
                f"{self.name!r} has stateful={self.stateful} and "
                f"{'no' if self.states is None else 'its'} state variables."
            )
        reset_state_lanes(tree.flatten(self.states), lanes)

    def reset_states(self, lanes=None) -> None:
        """Alias of `reset_state`, as in Keras."""
        self.reset_state(lanes)

    def get_config(self):
        config = super().get_config()
        config["recurrent_precision"] = self.recurrent_precision
        config["input_precision"] = self.input_precision
        config["use_cudnn"] = self._requested_use_cudnn
        return config
