"""The trained policy (and the frozen reference): build, shard with FSDP2, packed log-probs, update.

Sequences are packed into one row per micro-batch (no padding tokens computed);
position ids restart at every sequence, which transformers turns into a
block-diagonal causal mask. Only positions that predict response tokens go
through the LM head (``logits_to_keep``), so prompt tokens cost no vocabulary
projection.

Shared prompts: the n responses of one prompt are packed behind a single copy of
the prompt, each attending to the prompt and to itself only (a custom block mask),
with positions continuing from the prompt's end. The log-probs are exactly those of
separate sequences, and a GRPO step with n=8 computes the prompt once, not 8 times.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from plugrl import algorithms, attention, autocast_inputs, model_adapters, parallel, precision
from plugrl.config import ActorConfig, ConfigError, ModelConfig
from plugrl.dist import all_reduce, is_distributed
from plugrl.models import is_vision_model
from plugrl.sharding import load_full_weights, parameters_on_meta, shard_model
from plugrl.vlm import Pixels, vision_support

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on; the message says what happened and what to do."""


def _is_oom(e: BaseException) -> bool:
    # CUDA raises torch.OutOfMemoryError; the CPU allocator a RuntimeError with this text
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


@dataclass
class TrainBatch:
    """One rank's sequences for a training step.

    sequences: prompt + response token ids of each of the B sequences.
    prompt_lens / response_lens: [B] lengths.
    response_mask: [B, T] 1.0 on response tokens (T = longest response).
    advantages: [B, T]; old_logprobs, ref_logprobs: [B, T] or None.
    group_ids: [B] sequences with the same id share their prompt tokens (None: no sharing).
    old_values, returns: [B, T] critic values at rollout time and value targets (PPO with GAE).
    policy_masks: per row, None or one 0/1 per response token (multi-turn: 0 where an environment wrote):
        the host copy of ``response_mask``'s zeros inside a response, so a forward can skip the LM head
        there without reading the device. None: every response token is the policy's.
    rollout_logprobs: [B, T] or None: the rollout engine's log-prob of each sampled response token
        (``Rollout.logprobs``), 0 on padding and on tokens the policy did not write; carried when
        ``algorithm.rollout_correction`` is on (:mod:`plugrl.rollout_correction`).
    pixels: per row, the pixel inputs of its prompt's images (:class:`plugrl.vlm.Pixels`) or None (no
        images); None: a text batch. Host tensors; a forward moves those it packs.
    """

    sequences: list[list[int]]
    prompt_lens: list[int]
    response_lens: list[int]
    response_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    group_ids: list[int] | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    policy_masks: list[list[int] | None] | None = None
    rollout_logprobs: torch.Tensor | None = None
    pixels: list[Pixels | None] | None = None

    @classmethod
    def from_sequences(
        cls,
        sequences: list[list[int]],
        prompt_lens: list[int],
        policy_masks: list[list[int] | None] | None = None,
        **fields,
    ) -> TrainBatch:
        """A batch of prompt + response ``sequences``: the response lengths and mask follow from ``prompt_lens``.
        ``policy_masks[i]`` (multi-turn episodes), one 0/1 per response token of row i, leaves the tokens a tool
        or an environment wrote out of the mask (they stay in the context); None keeps every response token.
        ``fields`` are the optional ones (advantages, group_ids, ...)."""
        response_lens = [len(s) - p for s, p in zip(sequences, prompt_lens, strict=True)]
        mask = algorithms.response_mask(response_lens)
        for i, policy in enumerate(policy_masks or []):
            if policy is not None:
                if len(policy) != response_lens[i]:
                    raise ValueError(
                        f"row {i}: policy mask of {len(policy)} tokens for a {response_lens[i]}-token response"
                    )
                mask[i, : response_lens[i]] = torch.tensor(policy, dtype=mask.dtype)
        if policy_masks is not None and all(m is None for m in policy_masks):
            policy_masks = None
        return cls(sequences, prompt_lens, response_lens, mask, policy_masks=policy_masks, **fields)

    def __len__(self) -> int:
        return len(self.sequences)

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch with its per-token tensors on ``device`` (itself when they are there already).

        The trainer builds batches on the host; a model moves what it reads to its own device, so no op of
        a forward, loss or update mixes host and device tensors."""
        device = torch.device(device)
        tensors = {f: getattr(self, f) for f in _TOKEN_FIELDS}
        if all(t is None or t.device == device for t in tensors.values()):
            return self
        moved = {f: None if t is None else t.to(device, non_blocking=True) for f, t in tensors.items()}
        return dataclasses.replace(self, **moved)

    def select(self, idx: list[int]) -> TrainBatch:
        """The sub-batch of sequences ``idx`` (in that order)."""

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx]

        return TrainBatch(
            sequences=[self.sequences[i] for i in idx],
            prompt_lens=[self.prompt_lens[i] for i in idx],
            response_lens=[self.response_lens[i] for i in idx],
            response_mask=self.response_mask[idx],
            advantages=rows(self.advantages),
            old_logprobs=rows(self.old_logprobs),
            ref_logprobs=rows(self.ref_logprobs),
            group_ids=None if self.group_ids is None else [self.group_ids[i] for i in idx],
            old_values=rows(self.old_values),
            returns=rows(self.returns),
            policy_masks=None if self.policy_masks is None else [self.policy_masks[i] for i in idx],
            rollout_logprobs=rows(self.rollout_logprobs),
            pixels=None if self.pixels is None else [self.pixels[i] for i in idx],
        )

    def trained_columns(self, i: int) -> list[int]:
        """The response columns of row ``i`` whose tokens the policy wrote (all of them outside multi-turn)."""
        policy = None if self.policy_masks is None else self.policy_masks[i]
        r = self.response_lens[i]
        return list(range(r)) if policy is None else [k for k in range(r) if policy[k]]


# TrainBatch's per-token [B, T] tensors: what TrainBatch.to moves to a model's device
_TOKEN_FIELDS = (
    "response_mask",
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "old_values",
    "returns",
    "rollout_logprobs",
)


def _float64(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """A metric as a float64 tensor on ``device``: float32 -> float64 is exact, as Python's float() of it was."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def split_micro_batches(lengths: list[int], token_budget: int, min_count: int = 1) -> list[list[int]]:
    """Partition sequence indices into micro-batches of at most ``token_budget`` tokens.

    At least ``min_count`` micro-batches (ranks must run the same number under FSDP);
    longest-first into the currently lightest bin, so the bins are balanced.
    A sequence longer than the budget gets a micro-batch of its own.
    """
    count = max(min_count, math.ceil(sum(lengths) / token_budget) if lengths else 0)
    while True:
        bins: list[list[int]] = [[] for _ in range(count)]
        loads = [0] * count
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            j = min(range(count), key=lambda b: loads[b])
            bins[j].append(i)
            loads[j] += lengths[i]
        if all(load <= token_budget or len(b) == 1 for b, load in zip(bins, loads, strict=True)):
            return [sorted(b) for b in bins]
        count += 1


def _unpack(flat: torch.Tensor, columns: list[list[int]], width: int) -> torch.Tensor:
    """[sum(len(c) for c in columns)] -> [len(columns), width]: row i's values at its ``columns[i]``, zeros
    elsewhere (one scatter: no per-row copies on a GPU)."""
    out = flat.new_zeros(len(columns), width)
    rows = torch.repeat_interleave(torch.arange(len(columns)), torch.tensor([len(c) for c in columns]))
    cols = torch.tensor([c for cs in columns for c in cs], dtype=torch.long)
    out[rows.to(flat.device), cols.to(flat.device)] = flat
    return out


def build_model(
    path: str,
    model_cfg: ModelConfig,
    device: torch.device,
    trainable: bool,
    *,
    value_head: bool = False,
    gradient_checkpointing: bool | None = None,
    weights: bool = True,
    freeze_vision_tower: bool = True,
):
    """A causal LM, or with ``value_head`` the same trunk with a scalar head per token (a critic), on ``device``.
    A vision-language model (a config with a vision sub-config) is built as an image-text-to-text model, its parts
    known to plugrl-vision (:mod:`plugrl.vlm`); with ``freeze_vision_tower`` its vision encoder does not train.

    ``weights=False`` builds the architecture alone, its parameters on the meta device (no memory) and its
    buffers (rotary frequencies) real on the host: the shape a sharded model is made from before
    :func:`load_full_weights` fills in its shards.
    """
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    kwargs = dict(
        dtype=torch.float32,  # fp32 master weights; bf16 comes from FSDP2's mixed precision or autocast
        attn_implementation=model_cfg.attn_implementation,
        trust_remote_code=model_cfg.trust_remote_code,
    )
    extra = {"num_labels": 1} if value_head else {}
    # model.override_config: values that replace the config's (verl's override_config), here and in the engine
    overrides = {**model_cfg.override_config, **extra}
    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code, **overrides)
    vlm = is_vision_model(config)
    if vlm:
        vision_support().check_trainable(config, path)
    cls = (
        AutoModelForImageTextToText if vlm else AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    )
    if weights:
        model = cls.from_pretrained(path, config=config, **kwargs)
    else:
        with parameters_on_meta():
            model = cls.from_config(config, **kwargs)
    if vlm and value_head:  # transformers has no token-classification class for vision-language models
        vision_support().add_value_head(model, weights)
    if value_head:
        # no dropout (verl sets classifier_dropout=0): the head's default 0.1 would make the values GAE uses random
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    model.config.use_cache = False
    if gradient_checkpointing is None:
        gradient_checkpointing = model_cfg.enable_gradient_checkpointing
    if trainable and gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not trainable:
        model.requires_grad_(False)
    elif vlm and freeze_vision_tower:
        vision_support().vision_tower(model).requires_grad_(False)
    model.train(trainable)
    return model.to(device) if weights else model


@dataclass
class PackedRow:
    """Sequences packed into one row (:meth:`PackedModel._pack`), each prompt once per group. Per sequence, in the
    order they were asked for: ``keep``, the row positions whose head output predicts its trained response
    columns ``columns``, and ``targets``, those columns' token ids (a position predicts the token after it)."""

    shared: bool  # groups share their prompt (else each sequence is a group of its own)
    keep: list[list[int]]
    targets: list[list[int]]
    columns: list[list[int]]
    ids: list[int] = dataclasses.field(default_factory=list)  # [L]
    positions: list[int] = dataclasses.field(default_factory=list)  # [L]: prompts from 0, responses after theirs
    groups: list[attention.PrefixGroup] = dataclasses.field(default_factory=list)  # the row's layout, in order
    pixels: list[Pixels] = dataclasses.field(default_factory=list)  # packed prompts' images, in row order
    mrope: list[torch.Tensor] = dataclasses.field(default_factory=list)  # Qwen2-VL's family: [3, n] per piece

    @classmethod
    def empty(cls, shared: bool, sequences: int) -> PackedRow:
        """A row to pack ``sequences`` sequences into, none packed yet."""
        return cls(shared, *([[] for _ in range(sequences)] for _ in range(3)))

    def position_ids(self) -> torch.Tensor:
        """[1, L]; with 3-D rotary positions (plugrl-vision's ``mrope_positions``) [4, 1, L]: the text
        positions (where each packed sequence starts: the mask) above the 3-D ones."""
        ids = torch.tensor([self.positions])
        if self.mrope:
            ids = torch.cat([ids, torch.cat(self.mrope, dim=1)])[:, None]
        return ids


class PackedModel:
    """A transformer trained or evaluated on packed micro-batches, sharded with FSDP2 across ranks.

    Holds what the policy and the critic share: building and sharding the model, the
    optimizer and LR schedule, packing sequences (with shared prompt prefixes), the
    micro-batch plan, and the PPO optimisation skeleton (:meth:`_optimize`).
    """

    metric_prefix = "actor"
    value_head = False

    def __init__(
        self,
        path: str,
        model_cfg: ModelConfig,
        device: torch.device,
        *,
        trainable: bool = True,
        gradient_checkpointing: bool | None = None,
        optim=None,
        fsdp=None,
        share_prompt_prefix: bool = True,
        total_steps: int = 1,
        tp_size: int = 1,
        lora_cfg: Any = None,  # actor.lora / critic.lora (plugrl-lora's keys), r > 0
        freeze_vision_tower: bool = True,
    ):
        self.device = torch.device(device)
        # LoRA (r > 0): adapters put into the model in place before sharding (plugrl.model_adapters: plugrl-lora)
        self.lora = lora_cfg if lora_cfg is not None and lora_cfg.r > 0 else None
        self.adapters: model_adapters.Adapted | None = None
        self.freeze_vision_tower = freeze_vision_tower  # a VLM's: its encoder then gets no adapters either
        self.bf16 = precision.resolve_dtype(model_cfg.dtype, device) == "bfloat16"
        self.attn_impl = model_cfg.attn_implementation
        # flash-attention kernels take no custom mask: they pack by position ids only
        self.share_prefix = share_prompt_prefix and self.attn_impl in ("sdpa", "eager")
        # under torchrun (a process group, even of one rank) the model is sharded with FSDP2
        self.sharded = dist.is_available() and dist.is_initialized()
        self._init_parallel(tp_size, fsdp)
        offload = fsdp is not None and (fsdp.param_offload or fsdp.optimizer_offload)
        build = functools.partial(
            build_model,
            path,
            model_cfg,
            trainable=trainable,
            value_head=self.value_head,
            gradient_checkpointing=gradient_checkpointing,
            freeze_vision_tower=freeze_vision_tower,
        )
        self.mixed_precision = False  # FSDP2 casts the parameters to bf16 (instead of autocast)
        if self.sharded and fsdp is not None:
            # every rank builds the architecture without weights and shards it; rank 0 alone reads the files
            # and broadcasts, so no rank holds the full model in host or GPU memory (but rank 0, on the host)
            self.model = build(device, weights=False)
            self._add_adapters()
            self._use_prefix_attention()
            # FSDP2 has one CPU offload policy: parameters, gradients and optimizer state move together
            fsdp_applied = shard_model(
                self.model, device, fsdp.reshard_after_forward, offload, self.tp_size, bf16=self.bf16
            )
            self.mixed_precision = self.bf16 and fsdp_applied
            full: dict[str, torch.Tensor] = {}
            if dist.get_rank() == 0:
                with torch.random.fork_rng(devices=[]):  # a new value head's (or adapter's) init: rank 0 alone
                    whole = build(torch.device("cpu"))
                    if self.lora is not None:
                        self._wrap(whole)
                    full = whole.state_dict()
                    del whole
            load_full_weights(self.model, full, device, offload and fsdp_applied)
            del full
        else:
            if offload:
                log.warning(
                    "fsdp_config offload is ignored in a single process: it needs FSDP2; launch with torchrun "
                    "(torchrun --nproc_per_node=1 for one GPU)"
                )
            self.model = build(device)
            self._add_adapters()
            if self.lora is not None and self.bf16:
                self._hold_frozen_bases_in_bf16()
            self._use_prefix_attention()
        if self.bf16 and not self.mixed_precision:  # autocast: linear layers reading one tensor share its cast
            autocast_inputs.share_input_casts(self.model)
        config = self.model.config
        # a VLM's (plugrl-vision's packing): the blank image of a forward without images, the image token of images
        # that attend both ways, Qwen2-VL's family's (image token id, spatial merge size) for its 3-D positions
        vlm = vision_support().packing(self.model) if is_vision_model(config) else (None, None, None)
        self.blank_pixels, image_block, self.mrope = vlm
        # sliding windows, Gemma 3's both-ways image blocks: masks a packed row may need beyond its causal layout
        self.row_masks = attention.row_masks(config.get_text_config(), image_block)
        self.budget_cap: int | None = None  # tokens per micro-batch after an out-of-memory, for the rest of the run
        self.oom_retries = 0
        self.optimizer = None
        self.scheduler = None
        if optim is not None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(
                params,
                lr=optim.lr,
                betas=optim.betas,
                eps=optim.eps,
                weight_decay=optim.weight_decay,
                # the fused kernel: on CPU the default per-parameter loop is ~4x slower (docs/performance.md)
                fused=all(p.dtype == torch.float32 and p.device.type in ("cpu", "cuda") for p in params) or None,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(optim, total_steps))

    def _add_adapters(self) -> None:
        """LoRA: adapters into ``self.model`` in place (before FSDP2 shards it): only they require grad (and a
        critic's value head)."""
        if self.lora is not None:
            self.adapters = self._wrap(self.model)
            if is_vision_model(self.model.config):  # a connector without a linear layer stays as loaded: said
                said = vision_support().connector_warning(self.model, f"{self.metric_prefix}.lora")
                if said:
                    log.warning("%s", said)

    def _hold_frozen_bases_in_bf16(self) -> None:
        """One process under bf16 autocast: the adapters' frozen base weights in bf16, as autocast would cast them
        in every forward (the forward is unchanged; docs/performance.md has what it saves). A VLM's vision side
        keeps float32 (its encoders read their dtype off their weights). Under torchrun FSDP2's mixed precision
        casts the gathered weights instead."""
        skip = frozenset()
        if is_vision_model(self.model.config):
            skip = frozenset(id(p) for _, p in vision_support().vision_side_parameters(self.model))
        freed = self.adapters.hold_frozen_bases(torch.bfloat16, skip)
        if freed:
            log.info("%s.lora: frozen base weights held in bf16 (%.0f MiB freed)", self.metric_prefix, freed / 2**20)

    def _wrap(self, model) -> model_adapters.Adapted:
        """Adapters into ``model`` (this one, or rank 0's full copy: the same names): a critic's value head gets
        no adapter and trains whole."""
        frozen = None
        if self.freeze_vision_tower and is_vision_model(model.config):
            frozen = vision_support().vision_tower_name(model)
        key = f"{self.metric_prefix}.lora"
        kit = model_adapters.kit(f"{key}.r={self.lora.r}")
        return kit.add_adapters(model, self.lora, key=key, value_head=self.value_head, frozen=frozen)

    def _use_prefix_attention(self) -> None:
        """SDPA with a dense [L, L] prefix mask visits every tile; plugrl-attention's kernels skip the empty ones
        (without the package packed rows keep the dense mask, said once: :func:`plugrl.attention.prefix_kernels`)."""
        dropout = getattr(self.model.config, "attention_dropout", 0.0)
        wanted = self.share_prefix and self.attn_impl == "sdpa" and not dropout
        kernels = attention.prefix_kernels() if wanted else None
        self.prefix_kernel = kernels is not None
        if kernels is not None:
            try:
                name = kernels.register()
                impl: str | dict[str, str] = name
                vc = getattr(self.model.config, "vision_config", None)
                if vc is not None:  # the prefix groups lay out the text row: the vision encoder keeps its own
                    impl = {"": name, "text_config": name, "vision_config": vc._attn_implementation or "sdpa"}
                self.model.set_attn_implementation(impl)
            except (ImportError, AttributeError, ValueError) as e:  # an older transformers
                log.warning("shared-prefix attention unavailable (%s): packed rows use a dense mask", e)
                self.prefix_kernel = False

    def _init_parallel(self, tp_size: int, fsdp) -> None:
        """Data- and tensor-parallel coordinates. The ranks of a tensor-parallel group hold the same
        sequences: token counts are summed over the data-parallel group only, and ``self.vocab`` computes
        log-probs and entropy from vocabulary-sharded logits."""
        self.tp_size, self.dp_size, self.dp_group, self.vocab = 1, 1, None, algorithms
        if tp_size > 1:
            parallel.check_world(dist.get_world_size() if self.sharded else 1, tp_size)
            mesh = parallel.device_mesh(self.device.type, tp_size)
            self.tp_size, self.dp_group = tp_size, mesh["dp"].get_group()
            self.vocab = parallel.kit(tp_size).vocab_parallel(mesh["tp"].get_group())
        if self.sharded:
            self.dp_size = dist.get_world_size() // self.tp_size
        if fsdp is not None and fsdp.fsdp_size not in (-1, self.dp_size):
            raise ConfigError(
                f"{self.metric_prefix}.fsdp_config.fsdp_size={fsdp.fsdp_size}: FSDP2 shards over all "
                f"{self.dp_size} data-parallel ranks (world / actor.tp_size); set it to -1 (hybrid sharding "
                "is not supported)"
            )

    # ---- forward ---------------------------------------------------------------------------
    def _autocast(self):
        if not self.bf16 or self.mixed_precision:  # FSDP2 already runs the forward in bf16
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _shares_prefix(self, batch: TrainBatch) -> bool:
        return self.share_prefix and batch.group_ids is not None

    def _pack(self, batch: TrainBatch, idx: list[int]) -> PackedRow:
        """One packed row for sequences ``idx`` (:class:`PackedRow`). Shared prompts (:meth:`_shares_prefix`) go
        in once per group, followed by its responses; otherwise every sequence is a group of its own. A
        vision-language model puts the i-th image's features at the i-th run of image tokens of the whole row,
        so the images go in the order their prompts are packed (a shared prompt's once)."""
        share = self._shares_prefix(batch)
        groups: dict[object, list[int]] = {}
        for j, i in enumerate(idx):
            groups.setdefault(batch.group_ids[i] if share else ("seq", i), []).append(j)
        row = PackedRow.empty(share, len(idx))
        for members in groups.values():
            self._pack_group(row, batch, [idx[j] for j in members], members)
        if not row.pixels and self.blank_pixels is not None and torch.is_grad_enabled():
            self._pack_blank_image(row)
        return row

    def _pack_group(self, row: PackedRow, batch: TrainBatch, seqs: list[int], slots: list[int]) -> None:
        """Append to ``row`` the prompt of sequences ``seqs`` (a group sharing it, or one sequence) and their
        responses; ``slots``: their places in the row's per-sequence lists."""
        first = seqs[0]
        p = batch.prompt_lens[first]
        prompt = batch.sequences[first][:p]
        start = len(row.ids)
        row.ids += prompt
        row.positions += range(p)
        image = batch.pixels[first] if batch.pixels is not None else None
        if image is not None:
            row.pixels.append(image)
        after_prompt = p
        if self.mrope is not None:  # the prompt's image tokens on their grid; text after it counts on
            image_id, merge = self.mrope
            grids = image.image_grid_thw if image is not None else None
            row.mrope.append(vision_support().mrope_positions(prompt, image_id, grids, merge))
            after_prompt = int(row.mrope[-1].max()) + 1 if p else 0
        for i, j in zip(seqs, slots, strict=True):
            r = batch.response_lens[i]
            response = batch.sequences[i][p : p + r]
            rstart = len(row.ids)
            row.ids += response
            row.positions += range(p, p + r)
            if self.mrope is not None:
                row.mrope.append(torch.arange(after_prompt, after_prompt + r).expand(3, r))
            # column k is predicted at the token before it (the prompt's last token for k = 0); an LM
            # head runs only at the policy's tokens, a value head (one column, cheap) everywhere
            row.columns[j] = list(range(r)) if self.value_head else batch.trained_columns(i)
            row.keep[j] = [rstart + k - 1 if k else start + p - 1 for k in row.columns[j]]
            row.targets[j] = [response[k] for k in row.columns[j]]
        rlens = tuple(r for r in (batch.response_lens[i] for i in seqs) if r)
        row.groups.append(attention.PrefixGroup(start, p, rlens, image_runs=self._image_runs(prompt)))

    def _pack_blank_image(self, row: PackedRow) -> None:
        """A row with no image on a vision-language model: the same parameters get gradients on every rank, from a
        blank image (plugrl-vision's ``blank_pixels``) whose image tokens (if the model places features at tokens) are a
        sequence of their own that nothing attends to."""
        vision = vision_support()
        blank = vision.blank_image_tokens(self.model.config)
        if blank:
            runs = ((0, len(blank)),) if self.row_masks and self.row_masks.image_token_id is not None else ()
            row.groups.append(attention.PrefixGroup(len(row.ids), len(blank), (), image_runs=runs))
            if self.mrope is not None:
                grid = self.blank_pixels.image_grid_thw
                row.mrope.append(vision.mrope_positions(blank, self.mrope[0], grid, self.mrope[1]))
            row.ids, row.positions = row.ids + blank, row.positions + list(range(len(blank)))
        row.pixels = [self.blank_pixels]

    def _layout(self, row: PackedRow) -> torch.Tensor | list[attention.PrefixGroup] | dict[str, torch.Tensor] | None:
        """How a packed row's tokens attend: None (position-id packing: each sequence on its own), the prefix
        groups (:mod:`plugrl.attention`'s kernels), a [1, 1, L, L] mask, or for a model whose attention the
        shared-prefix layouts cannot follow (sliding windows, images attending both ways) dense masks
        (:meth:`_masked_row`)."""
        if self._needs_row_masks(row.shared, row.groups):
            return self._masked_row(row.positions, row.groups)
        if row.shared and self.prefix_kernel:
            return row.groups
        if row.shared:
            return self._mask_layout(attention.dense_mask(row.groups, len(row.ids), self.device))
        return None

    def _needs_row_masks(self, share: bool, groups: list[attention.PrefixGroup]) -> bool:
        """Whether a packed row laid out as ``groups`` takes dense masks (:meth:`_masked_row`). Not where the
        shared-prefix layout goes to FlexAttention (off the CPU), which lays out windows and image runs itself.
        Otherwise always for images that attend both ways; with a sliding window when prompts are shared and a
        sequence is longer than the window (shorter ones see their whole sequence, as the CPU kernel lets them;
        without shared prompts transformers builds the window from the position ids itself)."""
        m = self.row_masks
        if m is None or (share and self.prefix_kernel and attention.prefix_kernels().uses_flex(self.device.type)):
            return False
        if m.image_token_id is not None:
            return True
        return share and m.sliding_window is not None and attention.longest_sequence(groups) > m.sliding_window

    def _image_runs(self, prompt: list[int]) -> tuple[tuple[int, int], ...]:
        """(start, end) of each run of image tokens in ``prompt`` for a model whose images attend both ways."""
        m = self.row_masks
        if m is None or m.image_token_id is None:
            return ()
        runs, start = [], None
        for i, t in enumerate([*prompt, None]):
            if t == m.image_token_id and start is None:
                start = i
            elif t != m.image_token_id and start is not None:
                runs.append((start, i))
                start = None
        return tuple(runs)

    def _masked_row(
        self, positions: list[int], groups: list[attention.PrefixGroup]
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """A packed row's attention as dense [1, 1, L, L] masks (:func:`plugrl.attention.layer_masks`: the groups'
        causal layout, Gemma 3's both-ways image runs, sliding windows), one per layer type for a model with
        ``layer_types``, else one for every layer. Made on the device from [L] vectors: no [L, L] mask crosses
        from the host."""
        m = self.row_masks
        assert m is not None
        masks = attention.layer_masks(groups, len(positions), torch.tensor(positions).to(self.device), m.sliding_window)
        if not m.by_layer_type:  # every layer slides (or none does): one mask
            return self._mask_layout(masks["sliding_attention"])
        return {name: self._mask_layout(allowed) for name, allowed in masks.items()}

    def _mask_layout(self, allowed: torch.Tensor) -> torch.Tensor:
        """[L, L] allowed -> the [1, 1, L, L] mask the attention takes: bool, or for eager attention (which adds
        the mask to the scores) 0 and the float32 minimum."""
        allowed = allowed[None, None]
        if self.attn_impl != "eager":
            return allowed
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)

    def _run(self, batch: TrainBatch, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
        """Packed forward of sequences ``idx``: (head outputs [N, D] at the N positions that predict
        response tokens, in ``idx`` order; those target token ids [N]; per sequence, the response columns
        of those N tokens, for :func:`_unpack`). An LM head skips the tokens an environment wrote.

        An empty ``idx`` (this rank has no sequences here but must join the FSDP
        collectives) runs a two-token dummy row, packed as any other (a VLM's with its blank image).
        """
        if not idx:
            batch, idx = TrainBatch.from_sequences([[0, 0]], [1]).to(self.device), [0]
        row = self._pack(batch, idx)
        # long even when empty: a rank whose sequences hold no response token (episodes that failed at their
        # start) still runs its forward and backward beside the other ranks', over no position
        keep_t = torch.tensor([k for ks in row.keep for k in ks], dtype=torch.long, device=self.device)
        # an LM head runs only where it is needed; a value head is one column, cheap everywhere
        extra = {} if self.value_head else {"logits_to_keep": keep_t}
        layout = self._layout(row)
        if isinstance(layout, list):
            extra["prefix_groups"] = layout
        else:
            extra["attention_mask"] = layout
        if row.pixels:  # a VLM's images (only a VLM's rows hold any)
            extra.update(vision_support().model_kwargs(row.pixels, self.device))
        with self._autocast():
            out = self.model(
                input_ids=torch.tensor([row.ids], device=self.device),
                position_ids=row.position_ids().to(self.device),
                use_cache=False,
                **extra,
            )
        # LM logits stay in the autocast dtype: the log-prob/entropy functions upcast row chunks
        head = out.logits[0, keep_t].float() if self.value_head else out.logits[0]
        targets = torch.tensor([t for ts in row.targets for t in ts], dtype=torch.long, device=self.device)
        return head, targets, row.columns

    def _units(self, batch: TrainBatch, idx: list[int], budget: int) -> tuple[list[list[int]], list[int]]:
        """Sequences that must share a micro-batch (a prompt and some of its responses), with token costs."""
        if not self._shares_prefix(batch):
            return [[i] for i in idx], [len(batch.sequences[i]) for i in idx]
        groups: dict[int, list[int]] = {}
        for i in idx:
            groups.setdefault(batch.group_ids[i], []).append(i)
        units, costs = [], []
        for members in groups.values():
            p = batch.prompt_lens[members[0]]
            unit, cost = [], p
            for i in members:  # a group over the budget is split, each part with its own prompt copy
                r = batch.response_lens[i]
                if unit and cost + r > budget:
                    units.append(unit)
                    costs.append(cost)
                    unit, cost = [], p
                unit.append(i)
                cost += r
            units.append(unit)
            costs.append(cost)
        return units, costs

    def _micro_batches(self, batch: TrainBatch, idx: list[int], budget: int) -> list[list[int]]:
        units, costs = self._units(batch, idx, budget)
        if not is_distributed():  # no other rank to keep in step with: no empty micro-batches
            return [sorted(i for u in part for i in units[u]) for part in split_micro_batches(costs, budget) if part]
        count = max(1, math.ceil(sum(costs) / budget))
        count = int(all_reduce([count], op="max")[0])  # same number of forwards on every rank
        parts = split_micro_batches(costs, budget, min_count=count)
        # split_micro_batches may add bins for over-long units: agree on the count again
        total = int(all_reduce([len(parts)], op="max")[0])
        parts += [[] for _ in range(total - len(parts))]
        return [sorted(i for u in part for i in units[u]) for part in parts]

    def _retry_oom(self, attempt, budget: int):
        """``attempt(token_budget)``; when a micro-batch runs out of memory, halve the budget and try again.

        Only one process can retry: with several ranks the one that failed has left the FSDP
        collectives the others are in, so the run stops with the budget to set instead.
        """
        while True:
            capped = budget if self.budget_cap is None else min(budget, self.budget_cap)
            try:
                return attempt(capped)
            except Exception as e:
                if not _is_oom(e):
                    raise
                self._recover_from_oom(capped, e)

    def _recover_from_oom(self, budget: int, error: BaseException) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        key = "ppo_max_token_len_per_gpu"
        if is_distributed():
            raise TrainingError(
                f"out of memory in a micro-batch of at most {budget} tokens ({error}). With several ranks the "
                f"micro-batch cannot be retried; set {self.metric_prefix}.{key}={budget // 2} (or lower) "
                "and run the same command to resume from the last checkpoint."
            ) from error
        if budget < 2:
            raise TrainingError(
                f"out of memory even with micro-batches of 1 token ({error}): the model does not fit; "
                "enable model.enable_gradient_checkpointing, actor.fsdp_config.param_offload, or use more devices."
            ) from error
        self.budget_cap = budget // 2
        self.oom_retries += 1
        log.warning(
            "out of memory in a micro-batch of at most %d tokens: retrying with %d, the %s token budget from now on "
            "(set %s.%s=%d to start there)",
            budget,
            self.budget_cap,
            self.metric_prefix,
            self.metric_prefix,
            key,
            self.budget_cap,
        )

    def _map_micro_batches(self, batch: TrainBatch, budget: int, fn) -> torch.Tensor:
        """[B, T] from ``fn(batch_on_device, micro) -> [len(micro), T]`` over forward-only micro-batches (zeros
        on padding), on the device ``batch`` came on (the trainer's batches live on the host)."""
        home = batch.response_mask.device
        batch = batch.to(self.device)

        def attempt(b: int) -> torch.Tensor:
            out = batch.response_mask.new_zeros(batch.response_mask.shape)
            for micro in self._micro_batches(batch, list(range(len(batch))), b):
                if micro:
                    out[micro] = fn(batch, micro).to(out.dtype)
                else:  # join the other ranks' FSDP collectives
                    self._run(batch, [])
            return out * batch.response_mask

        return self._retry_oom(attempt, budget).to(home)

    def _optimize(
        self, batch: TrainBatch, *, num_mini_batches: int, epochs: int, budget: int, grad_clip: float, micro_loss
    ) -> dict[str, float]:
        """Epochs x mini-batches, one optimizer step each; micro-batches by token budget.

        ``micro_loss(batch, micro, agg) -> (loss, summed, averaged)``: the micro-batch's share of the
        mini-batch loss (normalised by the global counts in ``agg``), metrics to add up
        over micro-batches, and metrics to average over tokens. ``batch`` is the one given, moved to this
        model's device.

        The metrics stay on the device (``algorithms.metrics_as_tensors``; a loss may also return floats) and are
        added up in float64 there, in the order Python's floats were, so the numbers are the same bit for bit: the
        host reads them once per mini-batch, not with a sync per metric per micro-batch.
        """
        batch = batch.to(self.device)
        mask = batch.response_mask
        world = self.dp_size  # data-parallel ranks (the ranks of a tensor-parallel group share their data)
        sums: dict[str, float] = {}
        added: dict[str, float] = {}
        tokens = 0.0
        grad_norms, skipped, steps = [], 0, 0
        n = len(batch)
        per_mini = math.ceil(n / num_mini_batches)

        def accumulate(idx: list[int], agg: dict[str, float], b: int):
            """Forward + backward of one mini-batch's micro-batches: (tokens, summed, averaged x tokens), read to
            the host at the end, once."""
            tok_total = _float64(0.0, self.device)
            summed_all: dict[str, torch.Tensor] = {}
            weighted: dict[str, torch.Tensor] = {}
            with algorithms.metrics_as_tensors():
                for micro in self._micro_batches(batch, idx, b):
                    if not micro:
                        head, _, _ = self._run(batch, [])
                        (head.sum() * 0.0).backward()
                        continue
                    loss, summed, averaged = micro_loss(batch, micro, agg)
                    tok = _float64(mask[micro].sum(), self.device)
                    tok_total = tok_total + tok
                    for k, v in summed.items():  # shares of a global quantity: the ranks' mean is x world
                        summed_all[k] = summed_all.get(k, 0.0) + _float64(v, self.device) * world
                    for k, v in averaged.items():
                        weighted[k] = weighted.get(k, 0.0) + _float64(v, self.device) * tok
                    # FSDP averages gradients over ranks; the loss is already normalised globally
                    (loss * world).backward()
            values = torch.stack([tok_total, *summed_all.values(), *weighted.values()]).tolist()  # the one sync
            added_up = dict(zip(summed_all, values[1 : 1 + len(summed_all)], strict=True))
            return values[0], added_up, dict(zip(weighted, values[1 + len(summed_all) :], strict=True))

        for _epoch in range(epochs):
            for m in range(num_mini_batches):
                idx = list(range(m * per_mini, min(n, (m + 1) * per_mini)))
                num_tokens, num_seqs = all_reduce([float(mask[idx].sum()), float(len(idx))], group=self.dp_group)
                if not num_tokens:  # no response token on any rank (episodes that failed at their start): no update
                    continue
                agg = {"num_tokens": num_tokens, "num_seqs": num_seqs}
                tok, summed, weighted = self._retry_oom(lambda b, idx=idx, agg=agg: accumulate(idx, agg, b), budget)
                tokens += tok
                for k, v in summed.items():
                    added[k] = added.get(k, 0.0) + v
                for k, v in weighted.items():
                    sums[k] = sums.get(k, 0.0) + v
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
                if hasattr(grad_norm, "full_tensor"):
                    grad_norm = grad_norm.full_tensor()
                grad_norm = float(grad_norm)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                    steps += 1
                else:  # a NaN/inf gradient: skip this update, keep the weights
                    skipped += 1
                self.optimizer.zero_grad(set_to_none=True)
                grad_norms.append(grad_norm)
        with warnings.catch_warnings():
            # the schedule counts training steps, skipped (non-finite) updates included, as verl's does
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            self.scheduler.step()
        p = self.metric_prefix
        metrics = {k: v / (tokens or 1.0) for k, v in sums.items()}
        metrics.update({k: v / (num_mini_batches * epochs) for k, v in added.items()})
        finite = [g for g in grad_norms if math.isfinite(g)]
        metrics[f"{p}/grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
        metrics[f"{p}/lr"] = self.scheduler.get_last_lr()[0]
        metrics[f"{p}/optimizer_steps"] = float(steps)
        metrics[f"{p}/skipped_updates"] = float(skipped)
        metrics[f"{p}/oom_retries"] = float(self.oom_retries)
        return metrics

    # ---- weights out -----------------------------------------------------------------------
    def adapter_for_engine(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The policy's LoRA adapter as vLLM loads it (``rollout.lora_sync=adapter``): {PEFT name: full tensor on
        the host} and the adapter's config (plugrl.model_adapters). Under FSDP2 a collective: every
        rank gathers, each for its own engine."""
        if self.adapters is None:
            raise ValueError("adapter_for_engine needs a LoRA policy (actor.lora.r > 0)")
        return self.adapters.engine_adapter(self.adapters.state(self.device))

    def named_full_parameters(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor on this model's device) for every parameter, one at a time.

        Under FSDP2 each parameter is gathered alone (a collective), so no rank ever holds more than one full
        parameter beside its shards; the local shard is cast to ``dtype`` first (a bf16 gather moves half the
        bytes) and, when CPU offload keeps it in host memory, moved to the device, so the gather runs over
        NCCL on the GPU, not over gloo on the host."""
        from torch.distributed.tensor import DTensor

        if self.adapters is not None:  # the engine serves the base architecture: merged W + scaling * B @ A
            yield from self.adapters.merged_parameters(self.device, dtype)
            return
        for name, p in self.model.named_parameters():
            t = p.detach()
            if isinstance(t, DTensor):
                local = t.to_local().to(self.device, dtype or t.dtype, non_blocking=True)
                t = DTensor.from_local(
                    local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
                ).full_tensor()
            yield name, t.to(self.device, dtype or t.dtype)


class PolicyModel(PackedModel):
    """The policy: packed log-probs of response tokens; trainable (actor) or frozen (reference)."""

    def __init__(
        self,
        path: str,
        model_cfg: ModelConfig,
        actor_cfg: ActorConfig,
        device: torch.device,
        *,
        trainable: bool = True,
        total_steps: int = 1,
    ):
        self.cfg = actor_cfg
        self.trainable = trainable
        self._correction_kit: Any = None  # the rollout correction's package, found at the first update
        super().__init__(
            path,
            model_cfg,
            device,
            trainable=trainable,
            optim=actor_cfg.optim if trainable else None,
            fsdp=actor_cfg.fsdp_config,
            share_prompt_prefix=actor_cfg.share_prompt_prefix,
            total_steps=total_steps,
            tp_size=actor_cfg.tp_size,
            lora_cfg=model_adapters.settings(actor_cfg) if trainable else None,  # a frozen reference has none
            freeze_vision_tower=getattr(actor_cfg, "freeze_vision_tower", True),  # plugrl-vision's key
        )

    def _forward(self, batch: TrainBatch, idx: list[int], temperature: float, with_entropy: bool):
        """(logprobs [b, T], entropy [b, T] or None) of the response tokens of sequences ``idx``."""
        logits, targets, columns = self._run(batch, idx)
        temperature = temperature if temperature > 0 else 1.0
        width = batch.response_mask.shape[1]
        if not with_entropy:
            return _unpack(self.vocab.logprobs_from_logits(logits, targets, temperature), columns, width), None
        # entropy is logged always; it carries gradient only when it is part of the loss
        logp, ent = self.vocab.logprobs_and_entropy(
            logits, targets, temperature=temperature, entropy_grad=bool(self.cfg.entropy_coeff)
        )
        return _unpack(logp, columns, width), _unpack(ent, columns, width)

    @torch.no_grad()
    def compute_logprobs(
        self, batch: TrainBatch, temperature: float, token_budget: int, *, adapters: bool = True
    ) -> torch.Tensor:
        """[B, T] log-probs of the response tokens under this model. ``adapters=False`` (LoRA only): under the
        base model, the adapters skipped: the reference policy of a LoRA run, without a second copy."""
        if not adapters and self.adapters is None:
            raise ValueError("compute_logprobs(adapters=False) needs a LoRA policy (actor.lora.r > 0)")
        if self.adapters is None:
            context = nullcontext()
        elif adapters:
            context = self.adapters.dropout_off()  # the adapters' dropout is for the training forward only
        else:
            context = self.adapters.adapters_off()
        with context:
            return self._map_micro_batches(
                batch, token_budget, lambda b, micro: self._forward(b, micro, temperature, with_entropy=False)[0]
            )

    def update(
        self,
        batch: TrainBatch,
        *,
        num_mini_batches: int,
        temperature: float,
        norm_length: int,
        policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]] | None = None,
        rollout_correction: Any = None,
    ) -> dict[str, float]:
        """PPO epochs over mini-batches of ``policy_loss`` (a registered :class:`plugrl.specs.PolicyLossSpec`'s
        function; default: the kernel's loss named by ``actor.loss_mode``) plus the entropy bonus and the KL
        to the reference.

        ``rollout_correction`` (``algorithm.rollout_correction``, a mode other than off): the importance weights
        of the batch's ``old_logprobs`` against its ``rollout_logprobs`` (both needed) are computed once over the
        whole batch (:mod:`plugrl.rollout_correction`, by plugrl-advantages); each token's policy-gradient loss is
        multiplied by its weight (the loss's ``rollout_is_weights``) and every term of the loss, normaliser
        included, aggregates over the corrected mask; ``rollout_corr/...`` metrics join the result. None (or
        off): the update as it always was."""
        cfg = self.cfg
        assert self.optimizer is not None and batch.advantages is not None
        if policy_loss is None:
            from plugrl.policy_losses import builtin_loss

            policy_loss = builtin_loss(cfg.loss_mode)
        from plugrl.rollout_correction import WEIGHTS_KEYWORD

        correction, weights = None, None
        if rollout_correction is not None and rollout_correction.mode != "off":
            batch, correction = self._rollout_correction(batch, rollout_correction, policy_loss)
            if rollout_correction.mode != "monitor":  # monitor: diagnostics only, the loss as without it
                weights = correction.weights

        def micro_loss(batch: TrainBatch, micro: list[int], agg: dict[str, float]):
            lp, ent = self._forward(batch, micro, temperature, with_entropy=True)
            mask = batch.response_mask[micro]
            old = batch.old_logprobs[micro] if batch.old_logprobs is not None else lp.detach()
            agg = dict(agg, norm_length=norm_length)
            extra = {} if weights is None else {WEIGHTS_KEYWORD: weights[micro]}
            loss, pm = policy_loss(lp, old, batch.advantages[micro], mask, cfg, **agg, **extra)
            summed = {"actor/pg_loss": pm.pop("actor/pg_loss")}  # this micro-batch's share of the loss
            averaged = dict(pm)
            averaged["actor/entropy"] = algorithms.metric_value(algorithms.masked_mean(ent, mask))
            if cfg.entropy_coeff:
                loss = loss - cfg.entropy_coeff * algorithms.agg_loss(ent, mask, cfg.loss_agg_mode, **agg)
            if cfg.use_kl_loss and batch.ref_logprobs is not None:
                kl = algorithms.kl_penalty(lp, batch.ref_logprobs[micro], cfg.kl_loss_type)
                loss = loss + cfg.kl_loss_coef * algorithms.agg_loss(kl, mask, cfg.loss_agg_mode, **agg)
                averaged["actor/kl_loss"] = algorithms.metric_value(algorithms.masked_mean(kl, mask))
            return loss, summed, averaged

        metrics = self._optimize(
            batch,
            num_mini_batches=num_mini_batches,
            epochs=cfg.ppo_epochs,
            budget=cfg.ppo_max_token_len_per_gpu,
            grad_clip=cfg.grad_clip,
            micro_loss=micro_loss,
        )
        if correction is not None:
            metrics.update(correction.metrics)
        return metrics

    def _rollout_correction(self, batch: TrainBatch, rc: Any, policy_loss):
        """(the batch on this model's device with the corrected response mask, the correction)."""
        from plugrl.rollout_correction import kit

        if batch.old_logprobs is None or batch.rollout_logprobs is None:
            missing = "old_logprobs" if batch.old_logprobs is None else "rollout_logprobs"
            raise ValueError(
                f"algorithm.rollout_correction.mode={rc.mode} needs the batch's old_logprobs (the trainer's "
                f"recomputed log-probs) and rollout_logprobs (the engine's); {missing} is None"
            )
        if self._correction_kit is None:  # once: a lookup reads every entry point (checked at start)
            self._correction_kit = kit(rc.mode)
        correct = self._correction_kit
        if rc.mode != "monitor":
            correct.check_loss_takes_weights(policy_loss, self.cfg.loss_mode)
        batch = batch.to(self.device)
        correction = correct.rollout_correction(
            batch.old_logprobs,
            batch.rollout_logprobs,
            batch.response_mask,
            mode=rc.mode,
            level=rc.level,
            cap=rc.cap,
            low=rc.low,
            high=rc.high,
        )
        return dataclasses.replace(batch, response_mask=correction.mask), correction


def _lr_lambda(o, total_steps: int):
    # warmup_steps null: a share of the run (verl's lr_warmup_steps=-1 with lr_warmup_steps_ratio)
    warmup = o.warmup_steps if o.warmup_steps is not None else int(o.warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if o.lr_scheduler == "cosine":
            span = max(1, total_steps - warmup)
            progress = min(1.0, (step - warmup) / span)
            return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor
