"""vLLM rollouts, colocated in the training process (one engine per rank)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

import torch

from plugrl.config import RolloutConfig
from plugrl.rollout import Rollout, SamplingSettings


class VLLMEngine:
    """An in-process ``vllm.LLM`` whose weights the trainer replaces after every update.

    In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so weight sync is a memory
    copy through the worker's ``reload_weights``, not a disk round trip. On CPU
    the KV cache size is set in bytes (``rollout.cpu_kv_cache_gb``), since the
    memory fraction would count the whole host.
    """

    def __init__(
        self, model_path: str, cfg: RolloutConfig, dtype: str, max_model_len: int, device: str, world_size: int = 1, **_
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        kwargs: dict = dict(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=cfg.tensor_model_parallel_size,
            enable_prefix_caching=True,
        )
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed
        if cfg.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        if cfg.max_num_seqs:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        if device == "cpu":
            kwargs["kv_cache_memory_bytes"] = int(cfg.cpu_kv_cache_gb * (1 << 30))
        else:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = cfg.free_cache_engine
        if world_size > 1:
            # each rank drives its own engine inside the torchrun job (verl/TRL colocate mode)
            kwargs["distributed_executor_backend"] = "external_launcher"
        self.device = device
        self.sleep_enabled = device != "cpu" and cfg.free_cache_engine
        self.llm = LLM(**kwargs)

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Rollout]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            logprobs=0,
            # vLLM's CPU generator cannot take per-request seeds ("does not use offset")
            seed=sampling.seed if self.device != "cpu" else None,
        )
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        result = []
        for prompt, out in zip(prompts, outputs, strict=True):
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                # logprobs=0 returns just the sampled token's entry at each position
                lps = [d[t].logprob for d, t in zip(c.logprobs, ids, strict=True)] if c.logprobs else None
                group.append(Rollout(list(prompt), ids, lps, "length" if c.finish_reason == "length" else "stop"))
            result.append(group)
        return result

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        vllm_log = logging.getLogger("vllm")
        level = vllm_log.level
        vllm_log.setLevel(logging.ERROR)  # it logs several lines per reload, every step
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
            # cached prefixes hold KV computed with the old weights
            self.llm.reset_prefix_cache()
        finally:
            vllm_log.setLevel(level)

    def sleep(self) -> None:
        if self.sleep_enabled:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleep_enabled:
            self.llm.wake_up()

    def close(self) -> None:
        del self.llm
