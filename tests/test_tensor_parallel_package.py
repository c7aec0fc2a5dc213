"""Tensor parallelism (actor.tp_size > 1) is plugrl-tensor-parallel's (plugins/tensor_parallel), found through the
entry-point group plugrl.tensor_parallel: the kernel's seam (plugrl.parallel) finds it, a run with actor.tp_size=1
never needs it, and without it a training run with actor.tp_size > 1 is refused at start naming the key and the
package. (That it splits models as before: tests/test_tp.py.)"""

from __future__ import annotations

import copy

import pytest

from plugrl import api, parallel
from plugrl.config import ConfigError, build_config

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}
MISSING = (
    r"tensor parallelism is in the package plugrl-tensor-parallel, which is not installed: pip install "
    r"plugrl-tensor-parallel \(in a plugrl checkout: pip install -e plugins/tensor_parallel\)"
)


@pytest.fixture
def without_the_package(hide_entry_points):
    """plugrl-tensor-parallel's entry point gone, as where the package is not installed."""
    hide_entry_points(parallel.GROUP)


def test_the_kit_is_plugrl_tensor_parallels_and_has_what_the_kernel_calls():
    import plugrl_tensor_parallel

    kit = parallel.kit(2)
    assert kit is plugrl_tensor_parallel
    for name in [n for n in vars(parallel.TensorParallelKit) if not n.startswith("_")]:
        assert callable(getattr(kit, name)), name
    vocab = kit.vocab_parallel(group=None)
    assert all(callable(getattr(vocab, n)) for n in vars(parallel.VocabMath) if not n.startswith("_"))


def test_what_left_the_kernel_is_named_in_moved():
    import plugrl_tensor_parallel

    moved = {name: where for (module, name), (_, where) in api.moved_names().items() if module == "plugrl.parallel"}
    assert set(moved) == {
        "parallelize",
        "check_model",
        "VocabParallel",
        "vocab_parallel_logprobs",
        "vocab_parallel_entropy",
    }
    for name, where in moved.items():
        assert not hasattr(parallel, name), name
        assert where == f"plugrl_tensor_parallel.{name} (package plugrl-tensor-parallel)"
        assert hasattr(plugrl_tensor_parallel, name), name


def test_a_tensor_parallel_run_without_the_package_is_refused_at_start(without_the_package):
    from plugrl.startup import check_run

    cfg = build_config(copy.deepcopy(BASE), ["actor.tp_size=2"])
    with pytest.raises(ConfigError, match=rf"^actor.tp_size=2: {MISSING}$"):
        check_run(cfg, training=True)
    with pytest.raises(parallel.NoTensorParallel, match=rf"^actor.tp_size=4: {MISSING}$"):
        parallel.kit(4)  # what the model build asks, where nothing checked before


def test_a_run_without_tensor_parallelism_does_not_need_the_package(without_the_package):
    parallel.check_installed(build_config(copy.deepcopy(BASE)))
    parallel.check_installed(build_config(copy.deepcopy(BASE), ["actor.tp_size=1"]))
