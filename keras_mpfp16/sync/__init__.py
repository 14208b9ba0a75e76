"""What keeps N ranks one model (a layer between the bridges and Keras objects).

- `step_hooks`: the ordered registry of wrappers around a model's
  `train_step` / `test_step` (the metric reduction, the learning-rate scaler);
- `metric_reduction`: the in-step reduction of the metric state, which also
  carries the averaged non-trainable state and per-rank slots (one MPI call);
- `replica`: the broadcast from rank 0 before the first step, the per-step and
  per-epoch averaging of non-trainable state, the learning-rate/settings check;
- `checks`: the model signature and equal-steps checks (collective, raise on
  every rank together);
- `xla`: the XLA guard (a step with a host MPI call is not XLA-compiled).

Imports: `runtime`, `backend`, `internals` only; never `optimizer`,
`callbacks` or `training`, which build on it.
"""
