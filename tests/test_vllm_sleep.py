"""vLLM sleep mode, memory fraction and rollout tensor parallelism: the decisions and the call order.

What runs here and what cannot: vLLM's sleep mode frees GPU memory through its CUDA memory pool, and
vLLM refuses it on CPU (checked below against the installed vLLM). So the GPU path (``LLM(...,
enable_sleep_mode=True)``, ``sleep(level=1)``, ``wake_up(tags=...)``) is tested with a recording
stand-in for ``vllm.LLM`` that checks which calls plugrl makes, in which order, with which arguments;
whether vLLM then frees and restores the memory is vLLM's part and needs a GPU. Likewise rollout TP
> 1 is tested in its pure parts (which ranks form an engine, which outputs each rank keeps).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from plugrl.config import ConfigError, RolloutConfig, build_config
from plugrl.rollout import SamplingSettings
from plugrl.rollout import vllm_engine as ve


def test_sleep_mode_is_off_on_cpu_with_the_reason():
    on, why = ve.sleep_mode("cpu", free_cache_engine=True)
    assert not on and "CPU" in why
    on, why = ve.sleep_mode("cuda", free_cache_engine=False)
    assert not on and "free_cache_engine=false" in why
    # asked for a GPU on this CPU-only machine: vLLM's platform (CPU) has no sleep mode, so still off
    on, why = ve.sleep_mode("cuda", free_cache_engine=True)
    assert not on and "platform" in why


def test_the_installed_vllm_refuses_sleep_mode_on_cpu(tiny_model):
    """Why plugrl must not pass enable_sleep_mode on CPU: vLLM's own config check rejects it."""
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(ValueError, match="Sleep mode is not supported"):
        EngineArgs(model=str(tiny_model), enable_sleep_mode=True).create_model_config()


class RecordingLLM:
    """Stands in for ``vllm.LLM``: records the calls, generates nothing."""

    calls: list = []
    kwargs: dict = {}
    model_config = SimpleNamespace(is_multimodal_model=False)  # vllm.LLM's, read once by the engine

    def __init__(self, **kwargs):
        RecordingLLM.kwargs = kwargs
        RecordingLLM.calls = []

    def generate(self, requests, params, use_tqdm=False):
        self.calls.append(("generate", len(requests)))
        return [SimpleNamespace(outputs=[]) for _ in requests]

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))
        return True

    def collective_rpc(self, method, args=(), kwargs=None):
        if callable(method):  # a function run in each worker (the tied head's repack on CPU)
            self.calls.append((method.__name__,))
            return [False]
        if "weights_path" in kwargs:  # a rollout server's reload from files
            self.calls.append((method, kwargs["weights_path"]))
            return
        self.calls.append((method, len(list(kwargs["weights_iterator"]))))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def gpu_engine(monkeypatch):
    """A VLLMEngine built as on a GPU (sleep mode available), driving RecordingLLM."""
    import vllm

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.setattr(ve, "sleep_mode", lambda device, free: (device == "cuda" and free, "test"))
    # one process with a TP engine: as plugrl eval builds it (training refuses it: check_rollout_parallel)
    cfg = RolloutConfig(gpu_memory_utilization=0.35, tensor_model_parallel_size=2, enable_sleep_mode=True)
    return ve.VLLMEngine("model", cfg, dtype="bfloat16", max_model_len=64, device="cuda", syncs_weights=False)


def test_gpu_engine_gets_memory_fraction_tp_size_and_sleep_mode(gpu_engine):
    kw = RecordingLLM.kwargs
    assert kw["gpu_memory_utilization"] == 0.35
    assert kw["tensor_parallel_size"] == 2
    assert kw["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in kw


def test_sleep_wake_order_around_the_update_and_the_weight_sync(gpu_engine):
    e, greedy = gpu_engine, SamplingSettings(n=1, max_tokens=4)
    weights = [("w", torch.zeros(2))]
    # one trainer step: generate, sleep; update; sync weights; next step's generation
    e.wake_up()  # awake already: no call
    e.generate([[1, 2]], greedy)
    e.sleep()
    e.sleep()  # asleep already: no second call
    e.load_weights(weights)
    e.wake_up()
    e.generate([[1, 2]], greedy)
    assert RecordingLLM.calls == [
        ("generate", 1),
        ("sleep", 1),
        ("wake_up", ["weights"]),  # weights back before they are overwritten
        ("reload_weights", 1),
        ("reset_prefix_cache",),
        ("wake_up", ["kv_cache"]),  # then the KV cache, before generating
        ("generate", 1),
    ]
    # a generation between sleep and the sync (ReMax's greedy baseline) wakes everything; generate
    # also wakes a sleeping engine by itself
    RecordingLLM.calls.clear()
    e.sleep()
    e.generate([[3]], greedy)
    assert RecordingLLM.calls == [("sleep", 1), ("wake_up", None), ("generate", 1)]


def test_cpu_engine_never_sleeps(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    e = ve.VLLMEngine("model", RolloutConfig(cpu_kv_cache_gb=0.5), dtype="float32", max_model_len=64, device="cpu")
    assert "enable_sleep_mode" not in RecordingLLM.kwargs and "gpu_memory_utilization" not in RecordingLLM.kwargs
    assert RecordingLLM.kwargs["kv_cache_memory_bytes"] == 1 << 29
    e.sleep()
    e.load_weights([("w", torch.zeros(1))])
    e.wake_up()
    assert [c[0] for c in RecordingLLM.calls] == ["reload_weights", "_repack_tied_lm_head", "reset_prefix_cache"]


def test_rollout_tp_groups_and_each_ranks_share():
    assert ve.tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ve.tp_groups(4, 1) == [[0], [1], [2], [3]]
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2 must divide"):
        ve.tp_groups(3, 2)
    # a TP group pools its ranks' prompts (in rank order); each rank keeps the outputs of its own
    gathered = [["a", "b"], ["c"], ["d", "e", "f"]]
    pooled = [x for part in gathered for x in part]
    assert [pooled[ve.own_share(gathered, r)] for r in range(3)] == gathered


def test_enable_sleep_mode_is_an_alias():
    base = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}}
    assert build_config(base, ["rollout.enable_sleep_mode=false"]).rollout.free_cache_engine is False
    assert build_config(base, ["actor_rollout_ref.rollout.free_cache_engine=false"]).rollout.free_cache_engine is False


@pytest.fixture
def training_gpu_engine(monkeypatch):
    """``make(**engine_kwargs)``: a VLLMEngine built as a training rank's on a GPU (it syncs weights), driving
    RecordingLLM; torch's cache emptying is recorded among the engine's calls."""
    import vllm

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.setattr(ve, "sleep_mode", lambda device, free: (device == "cuda" and free, "test"))
    monkeypatch.setattr(ve, "_empty_torch_cache", lambda: RecordingLLM.calls.append(("empty_cache",)))

    def make(**kwargs):
        cfg = RolloutConfig(gpu_memory_utilization=0.35)
        return ve.VLLMEngine("model", cfg, dtype="bfloat16", max_model_len=64, device="cuda", **kwargs)

    return make


def test_the_sleep_level_follows_what_the_next_sync_brings():
    assert ve.sleep_level(adapter_sync=False, generates_before_sync=False)[0] == 2
    assert ve.sleep_level(adapter_sync=True, generates_before_sync=False)[0] == 1  # the base weights must survive
    assert ve.sleep_level(adapter_sync=False, generates_before_sync=True)[0] == 1  # ReMax, DAPO's refills


def test_a_full_sync_run_sleeps_at_level_2_and_empties_torchs_cache_before_the_kv_cache_wakes(training_gpu_engine):
    e, greedy = training_gpu_engine(), SamplingSettings(n=1, max_tokens=4)
    assert e.sleep_level == 2
    e.generate([[1, 2]], greedy)
    e.sleep()
    e.load_weights([("w", torch.zeros(2))])
    e.generate([[1, 2]], greedy)
    assert RecordingLLM.calls == [
        ("generate", 1),
        ("sleep", 2),  # weights and KV cache dropped: no host copy of weights the sync overwrites
        ("wake_up", ["weights"]),
        ("reload_weights", 1),
        ("reset_prefix_cache",),
        ("empty_cache",),  # the update's cached blocks back to the device before vLLM's pool allocates the KV cache
        ("wake_up", ["kv_cache"]),
        ("generate", 1),
    ]
    # asleep at level 2 with no sync since: generating would read dropped weights, so it is refused
    e.sleep()
    with pytest.raises(RuntimeError, match="generates_before_sync=True"):
        e.generate([[1]], greedy)


def test_a_run_that_generates_before_the_sync_or_syncs_an_adapter_sleeps_at_level_1(training_gpu_engine):
    greedy = SamplingSettings(n=1, max_tokens=4)
    e = training_gpu_engine(generates_before_sync=True)
    e.generate([[1]], greedy)
    e.sleep()
    e.generate([[1]], greedy)  # ReMax's greedy baseline on the weights it slept with
    assert RecordingLLM.calls == [("generate", 1), ("sleep", 1), ("empty_cache",), ("wake_up", None), ("generate", 1)]
    assert training_gpu_engine(lora_rank=8).sleep_level == 1


def test_a_rollout_server_engine_reloads_from_files_that_its_workers_read(training_gpu_engine):
    e = training_gpu_engine(weights_from_files=True)
    e.load_weights_from_files("/dev/shm/plugrl_server_1/v3")
    assert ("reload_weights", "/dev/shm/plugrl_server_1/v3") in RecordingLLM.calls


def test_a_users_v1_multiprocessing_is_refused_by_name_where_weights_sync_in_memory(training_gpu_engine, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ConfigError, match=r"VLLM_ENABLE_V1_MULTIPROCESSING=1 is set .* Unset it"):
        training_gpu_engine()
    # an engine that takes no weights in memory (plugrl eval, a rollout server reading files) runs as asked
    training_gpu_engine(syncs_weights=False)
    training_gpu_engine(weights_from_files=True)
