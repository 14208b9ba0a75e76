"""Precision choices for the two products of the mixed-precision layers.

Under a mixed policy (compute dtype float16 or bfloat16) the layers keep the
recurrent carry (LSTM `h` and `c`, GRU `h`) and the gate arithmetic in float32
between time steps. Two products remain where a weight matrix is involved:

`recurrent_precision`, the product `h @ U` at every step:

- `"float32"` (default): `h` and `U` in float32.
- `"split"`: `h = hi + lo` with both halves and `U` in the compute dtype; the
  two half-precision products are summed in float32. Removes the rounding of
  `h`, keeps the rounding of `U` and of each product.
- `"compute"`: `h` and `U` rounded to the compute dtype for the product (the
  carry itself stays float32): what a float32 carry alone buys.
- `"tf32x3"`: float32 accuracy on hardware that rounds float32 products to
  TF32 (Ampere and later GPUs with TF32 on): `h = hi + lo` and `U = Hi + Lo`,
  each `hi`/`Hi` exact in TF32 (10 mantissa bits), and
  `h @ U ~ hi @ Hi + hi @ Lo + lo @ Hi`, three float32 products whose TF32
  rounding only touches the small terms. Three times the multiply work of
  `"float32"`: for a GPU with TF32 on, not for a CPU.

`input_precision`, the input projection `x @ W`, one product for the whole
sequence outside the time loop:

- `"float32"` (default): `x` and `W` in float32 (the layer takes its inputs
  in float32, so float32 data is not rounded first).
- `"compute"`: in the compute dtype, as Keras does; the bias is still added in
  float32.
- `"tf32x3"`: as for `recurrent_precision`, three TF32-exact products.

Why the defaults: with a long-memory gate (LSTM forget bias 8, T = 4096) any
half-precision rounding inside the recurrence, even of the input alone, moved
the last outputs by 15-44% from the float32 reference, while float32 for both
products left only the rounding of the outputs (0.02% under float16, 0.17%
under bfloat16). On this CPU the float32 products were also no slower than
Keras, except for wide LSTMs under bfloat16 (1.5x at 256 units, where
`recurrent_precision="compute"` is faster than Keras). On GPUs float32
products may run as TF32 (10-bit mantissa inputs) unless disabled: emulated
on a CPU, that gives Keras's float32 layer's numbers, harmless for the GRU
and short memories but up to 0.69x Keras float16's drift for a long-memory
LSTM; the layers warn once on such a GPU (`dispatch.py`). Tables and
commands: `docs/layers.md`.
"""

from __future__ import annotations

from keras import ops

from keras_mpfp16 import _validate

RECURRENT_PRECISIONS = ("float32", "split", "compute", "tf32x3")
DEFAULT_RECURRENT_PRECISION = "float32"

INPUT_PRECISIONS = ("float32", "compute", "tf32x3")
DEFAULT_INPUT_PRECISION = "float32"

# Compute dtypes for which the layers run their own float32-carry loop. Under
# any other compute dtype (float32, float64) they are Keras's layers unchanged.
HALF_PRECISION_DTYPES = ("float16", "bfloat16")

CARRY_DTYPE = "float32"


def validate_recurrent_precision(value) -> str:
    """Returns `value` if it is a known recurrent precision, else raises."""
    return _validate.one_of("recurrent_precision", value, RECURRENT_PRECISIONS)


def validate_input_precision(value) -> str:
    """Returns `value` if it is a known input-projection precision, else raises."""
    return _validate.one_of("input_precision", value, INPUT_PRECISIONS)


def keeps_float32_carry(compute_dtype: str) -> bool:
    """Whether a layer computing in `compute_dtype` runs the float32-carry loop."""
    return compute_dtype in HALF_PRECISION_DTYPES


# Veltkamp's splitting constant for float32 (24 significant bits) into a high
# part of 24 - 13 = 11 significant bits, which TF32 (10 stored mantissa bits
# and the implicit one) represents exactly: 2**13 + 1.
_VELTKAMP_FACTOR = 8193.0


def split_tf32(x):
    """`x` (float32) as `(hi, lo)`: `hi` exact in TF32, `lo = x - hi` exact.

    Veltkamp's splitting (`c = x * (2**13 + 1)`, `hi = c - (c - x)`): plain
    float32 arithmetic, no bit operations, so every backend and Keras
    version computes it; `|x|` must stay below about 4e34. `hi` keeps the
    top 11 significant bits of `x`, `lo` the rest, so a TF32 product rounds
    `lo` to about 2**-22 of `x`. Differentiable as the identity through `hi`
    (`lo` is a constant for the gradient), so the products built on the
    parts have the gradient of the plain product.
    """
    x = ops.cast(x, CARRY_DTYPE)
    scaled = x * _VELTKAMP_FACTOR
    high = scaled - (scaled - x)
    lo = ops.stop_gradient(x - high)
    return x - lo, lo


def tf32x3_matmul(x, kernel_parts):
    """`x @ W` from three TF32-exact float32 products (see `split_tf32`).

    Args:
        x: float32 left operand.
        kernel_parts: `split_tf32(W)`, computed once outside any time loop.
    """
    high, low = kernel_parts
    x_high, x_low = split_tf32(x)
    small = ops.matmul(x_high, low) + ops.matmul(x_low, high)
    return ops.matmul(x_high, high) + small


class RecurrentProduct:
    """`h @ U` for a float32 `h`, in the chosen precision, returning float32.

    The kernel is converted once per layer call, outside the time loop, so the
    per-step work is only the product itself.

    Args:
        kernel: The recurrent kernel `U` as a float32 tensor (the variable's
            master value, not its autocast copy).
        precision: One of `RECURRENT_PRECISIONS`.
        compute_dtype: The layer's compute dtype (`"float16"`/`"bfloat16"`).
    """

    def __init__(self, kernel, precision: str, compute_dtype: str):
        self.precision = validate_recurrent_precision(precision)
        self.compute_dtype = compute_dtype
        if precision == "float32":
            self.kernel = ops.cast(kernel, CARRY_DTYPE)
        elif precision == "tf32x3":
            self.kernel = split_tf32(kernel)
        else:
            self.kernel = ops.cast(kernel, compute_dtype)

    def columns(self, start: int, stop: int) -> RecurrentProduct:
        """The same product restricted to kernel columns `[start, stop)`."""
        part = object.__new__(RecurrentProduct)
        part.precision = self.precision
        part.compute_dtype = self.compute_dtype
        if self.precision == "tf32x3":
            part.kernel = tuple(k[:, start:stop] for k in self.kernel)
        else:
            part.kernel = self.kernel[:, start:stop]
        return part

    def __call__(self, h):
        if self.precision == "float32":
            return ops.matmul(h, self.kernel)
        if self.precision == "tf32x3":
            return tf32x3_matmul(h, self.kernel)
        high = ops.cast(h, self.compute_dtype)
        if self.precision == "compute":
            return ops.cast(ops.matmul(high, self.kernel), CARRY_DTYPE)
        # "split": the low half is what rounding `h` to `high` lost. One
        # product on the stacked halves instead of two, then sum in float32.
        low = ops.cast(h - ops.cast(high, CARRY_DTYPE), self.compute_dtype)
        both = ops.cast(
            ops.matmul(ops.concatenate([high, low], axis=0), self.kernel),
            CARRY_DTYPE,
        )
        high_part, low_part = ops.split(both, 2, axis=0)
        return high_part + low_part
