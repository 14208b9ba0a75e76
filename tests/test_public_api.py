"""The public API: what `__all__` exports, and that the API page documents it.

Every `::: name` in docs/api.md must be exported: in `keras_mpfp16.__all__`,
or in the `__all__` of the module it is documented under or of one of that
module's parents. `__all__` of the top level and of `runtime` list only what
users call (no submodules of internals, no validators).
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

import importlib
import re
import types
from pathlib import Path

import pytest

import keras_mpfp16

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
DOCUMENTED = re.findall(r"^::: (\S+)", API_PAGE.read_text(), re.M)


@pytest.mark.parametrize("full", DOCUMENTED)
def test_documented_names_are_exported(full):
    parts = full.split(".")
    leaf = parts[-1]
    exporters = [".".join(parts[:i]) for i in range(1, len(parts))]
    found = leaf in keras_mpfp16.__all__
    for name in exporters:
        module = importlib.import_module(name)
        if leaf in getattr(module, "__all__", ()):
            found = True
    assert found, f"docs/api.md documents {full}, which no __all__ exports"


@pytest.mark.parametrize("package", ["keras_mpfp16", "keras_mpfp16.runtime"])
def test_every_exported_name_exists(package):
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing


def test_runtime_exports_no_modules_or_internals():
    runtime = keras_mpfp16.runtime
    modules = [
        n for n in runtime.__all__ if isinstance(getattr(runtime, n), types.ModuleType)
    ]
    assert not modules
    assert not {"validate_op", "validate_wire_dtype", "allreduce_flat"} & set(
        runtime.__all__
    )


def test_top_level_exports_the_explicit_path():
    for name in ("distributed_fit", "distributed_evaluate", "install_keras_patches"):
        assert name in keras_mpfp16.__all__


def test_names_documented_in_0_2_still_resolve():
    # runtime.world.barrier moved to runtime.collectives: a deprecated alias.
    from keras_mpfp16.runtime.mpi import world

    with pytest.warns(DeprecationWarning, match=r"keras_mpfp16\.barrier\(\)"):
        world.barrier()  # one process: returns at once


PUBLIC = [
    "keras_mpfp16",
    "keras_mpfp16.layers",
    "keras_mpfp16.callbacks",
    "keras_mpfp16.config",
    "keras_mpfp16.runtime",
]


def _resolve(path: str):
    """The object at a dotted path: the attribute of its parent module
    (`keras_mpfp16.callbacks.root_only` is the function, not the module the
    function shadows; `keras_mpfp16.data.shard.shard` is the function in
    the module `data.shard`)."""
    parent, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(parent), name)


def test_api_page_documents_public_paths_only():
    outside = [p for p in DOCUMENTED if p.rsplit(".", 1)[0] not in PUBLIC]
    assert not outside, f"docs/api.md documents implementation paths: {outside}"


def test_every_exported_name_is_documented():
    documented = {id(_resolve(p)) for p in DOCUMENTED}
    missing = [
        f"{package}.{name}"
        for package in PUBLIC
        for name in importlib.import_module(package).__all__
        if id(getattr(importlib.import_module(package), name)) not in documented
    ]
    assert not missing, f"exported but not in docs/api.md: {missing}"


@pytest.mark.parametrize("package", PUBLIC)
def test_public_all_lists_no_modules_or_internals(package):
    module = importlib.import_module(package)
    assert not [
        n for n in module.__all__ if isinstance(getattr(module, n), types.ModuleType)
    ]
    internal = {
        "transition",
        "LossScaleState",
        "temporary_path",
        "quiet_non_root_ranks",
        "scale_factor",
        "uses_distributed_optimizer",
        "validate_op",
        "validate_wire_dtype",
        "allreduce_flat",
    }
    assert not internal & set(module.__all__)
    for sub in ("optimizer", "training", "data"):
        assert not internal & set(
            importlib.import_module(f"keras_mpfp16.{sub}").__all__
        )


# docs/api.md of 0.2 (its `:::` entries), and where each name is now.
DOCUMENTED_IN_0_2 = {
    "keras_mpfp16.runtime.world.init": "keras_mpfp16.init",
    "keras_mpfp16.runtime.world.size": "keras_mpfp16.size",
    "keras_mpfp16.runtime.world.rank": "keras_mpfp16.rank",
    "keras_mpfp16.runtime.world.local_size": "keras_mpfp16.local_size",
    "keras_mpfp16.runtime.world.local_rank": "keras_mpfp16.local_rank",
    "keras_mpfp16.runtime.world.is_root": "keras_mpfp16.is_root",
    "keras_mpfp16.runtime.collectives.barrier": "keras_mpfp16.barrier",
    "keras_mpfp16.runtime.collectives.allreduce": "keras_mpfp16.allreduce",
    "keras_mpfp16.runtime.collectives.allgather": "keras_mpfp16.allgather",
    "keras_mpfp16.runtime.collectives.broadcast": "keras_mpfp16.broadcast",
    "keras_mpfp16.runtime.cuda.cuda_aware": "keras_mpfp16.cuda_aware",
    "keras_mpfp16.backend.devices.bind_gpus": "keras_mpfp16.bind_gpus",
    "keras_mpfp16.runtime.stall.configure": "keras_mpfp16.runtime.configure_stall",
    "keras_mpfp16.runtime.progress.set_epoch": "keras_mpfp16.runtime.set_epoch",
    "keras_mpfp16.config.get": "keras_mpfp16.config.get",
    "keras_mpfp16.config.set": "keras_mpfp16.config.set",
    "keras_mpfp16.config.reset": "keras_mpfp16.config.reset",
    "keras_mpfp16.config.settings": "keras_mpfp16.config.settings",
    "keras_mpfp16.training.sessions.distributed_fit": "keras_mpfp16.distributed_fit",
    "keras_mpfp16.training.sessions.distributed_evaluate": (
        "keras_mpfp16.distributed_evaluate"
    ),
    "keras_mpfp16.training.patches.install": "keras_mpfp16.install_keras_patches",
    "keras_mpfp16.training.patches.uninstall": "keras_mpfp16.uninstall_keras_patches",
    "keras_mpfp16.training.patches.installed": "keras_mpfp16.installed_keras_patches",
    "keras_mpfp16.optimizer.DistributedOptimizer": "keras_mpfp16.DistributedOptimizer",
    "keras_mpfp16.optimizer.distributed_optimizer.broadcast_variables": (
        "keras_mpfp16.broadcast_variables"
    ),
    "keras_mpfp16.optimizer.loss_scale.LossScaleConfig": "keras_mpfp16.LossScaleConfig",
    "keras_mpfp16.optimizer.loss_scale.transition": None,  # internal, same path
    "keras_mpfp16.data.shard.shard": "keras_mpfp16.shard",
    "keras_mpfp16.data.arithmetic.shard_sizes": "keras_mpfp16.shard_sizes",
    "keras_mpfp16.data.py_dataset.ShardedPyDataset": "keras_mpfp16.ShardedPyDataset",
    "keras_mpfp16.callbacks.LearningRateScaler": "keras_mpfp16.callbacks.LearningRateScaler",
    "keras_mpfp16.callbacks.lr_schedule.scaled_learning_rate": (
        "keras_mpfp16.callbacks.scaled_learning_rate"
    ),
    "keras_mpfp16.callbacks.GlobalMetrics": "keras_mpfp16.callbacks.GlobalMetrics",
    "keras_mpfp16.callbacks.AtomicModelCheckpoint": (
        "keras_mpfp16.callbacks.AtomicModelCheckpoint"
    ),
    "keras_mpfp16.callbacks.root_only": "keras_mpfp16.callbacks.root_only",
    "keras_mpfp16.callbacks.Timeline": "keras_mpfp16.callbacks.Timeline",
    "keras_mpfp16.callbacks.rank_output.print_once": "keras_mpfp16.print_once",
    "keras_mpfp16.callbacks.rank_output.root_stdout_only": (
        "keras_mpfp16.root_stdout_only"
    ),
    "keras_mpfp16.layers.LSTM": "keras_mpfp16.layers.LSTM",
    "keras_mpfp16.layers.GRU": "keras_mpfp16.layers.GRU",
    "keras_mpfp16.layers.LaneBatcher": "keras_mpfp16.layers.LaneBatcher",
    "keras_mpfp16.layers.reset_lanes": "keras_mpfp16.layers.reset_lanes",
}
# Moved in 0.3: these old paths warn (DeprecationWarning); the rest do not.
MOVED_IN_0_3 = ("keras_mpfp16.runtime.world.", "keras_mpfp16.runtime.collectives.")
MOVED_IN_0_3 += ("keras_mpfp16.runtime.cuda.", "keras_mpfp16.runtime.stall.")
MOVED_IN_0_3 += ("keras_mpfp16.callbacks.rank_output.",)


@pytest.mark.parametrize("old", sorted(DOCUMENTED_IN_0_2))
def test_names_documented_in_0_2_resolve_moved_ones_with_a_warning(old):
    import warnings

    new = DOCUMENTED_IN_0_2[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = _resolve(old)
    warned = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    if old.startswith(MOVED_IN_0_3):
        assert warned and new in str(warned[0].message), [
            str(w.message) for w in caught
        ]
    else:
        assert not warned, [str(w.message) for w in warned]
    if new is not None:
        assert obj is _resolve(new)
        assert new in DOCUMENTED, f"{new} (the new path of {old}) is not documented"
