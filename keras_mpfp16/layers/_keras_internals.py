"""The two Keras internals the recurrent layers need, each import guarded.

- `rnn_loop`: the backend's fused time loop (`keras.src.backend.rnn`), the
  same one Keras's own `RNN` layer runs: a `tf.while_loop` on TensorFlow,
  `lax.scan` on JAX, a Python loop on PyTorch. Keras 3 exports no public
  equivalent with masking, `go_backwards` and `return_all_outputs`.
- `read_uncast`: a variable's stored value, bypassing autocast. Inside a
  mixed-precision layer call every float variable reads as the compute dtype
  (float16); the layers need the float32 master copy of the recurrent weights
  and of the stateful carry, so they read it with autocast switched off.

If a future Keras moves either, importing `keras_mpfp16.layers` fails with an
error saying which one, rather than silently losing precision.
"""

from __future__ import annotations

try:
    from keras.src.backend import AutocastScope as _AutocastScope
    from keras.src.backend import rnn as rnn_loop
except ImportError as exc:  # pragma: no cover - depends on the Keras version
    raise ImportError(
        "keras_mpfp16.layers needs keras.src.backend.rnn and "
        "keras.src.backend.AutocastScope, which this Keras version does not "
        f"provide ({exc}). Supported: Keras 3.10 and later 3.x releases."
    ) from exc

__all__ = ["read_uncast", "rnn_loop"]


def read_uncast(variable):
    """Returns `variable`'s value in its own dtype, ignoring any autocast scope.

    The result stays differentiable with respect to the variable.
    """
    with _AutocastScope(None):
        return variable.value
