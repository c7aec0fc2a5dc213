"""The value model for PPO with GAE: the policy's trunk with a scalar head per token.

Values are read at the positions that predict each response token, so V_t is the
value of the state before response token t (as verl's critic). Packing, shared
prompt prefixes, FSDP2 and the optimisation loop are the policy's (PackedModel).

With ``critic.lora.r`` > 0 the trunk gets LoRA adapters (plugrl.model_adapters) and the value head, new and randomly
initialised, trains whole beside them as peft's ``modules_to_save``: the adapters and the head are the only
trainable parameters, and a checkpoint holds them as one PEFT adapter (``critic_adapter/``).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from plugrl import algorithms, model_adapters
from plugrl.actor import PackedModel, TrainBatch, _unpack
from plugrl.config import ConfigError, CriticConfig, ModelConfig


class ValueModel(PackedModel):
    metric_prefix = "critic"
    value_head = True

    def __init__(
        self,
        path: str,
        model_cfg: ModelConfig,
        critic_cfg: CriticConfig,
        device: torch.device,
        *,
        share_prompt_prefix: bool = True,
        total_steps: int = 1,
        tp_size: int = 1,  # the policy's (actor.tp_size): one device mesh for all models
    ):
        self.cfg = critic_cfg
        lora = model_adapters.settings(critic_cfg)
        if lora and tp_size > 1:  # tensor parallelism shards nn.Linear modules; LoRA wraps them
            raise ConfigError(
                f"critic.lora.r={lora.r} cannot combine with actor.tp_size={tp_size} (the critic's mesh "
                "too): LoRA adapters are not tensor-parallel in plugrl; use actor.tp_size=1 or critic.lora.r=0"
            )
        super().__init__(
            path,
            model_cfg,
            device,
            gradient_checkpointing=critic_cfg.model.enable_gradient_checkpointing,
            optim=critic_cfg.optim,
            fsdp=critic_cfg.fsdp_config,
            share_prompt_prefix=share_prompt_prefix,
            total_steps=total_steps,
            tp_size=tp_size,
            lora_cfg=lora,
        )

    def _values(self, batch: TrainBatch, idx: list[int]) -> torch.Tensor:
        head, _, columns = self._run(batch, idx)
        return _unpack(head[:, 0], columns, batch.response_mask.shape[1])

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """[B, T] values of the states before each response token (0 on padding)."""
        # the adapters' dropout is for the training forward only: GAE reads deterministic values
        with self.adapters.dropout_off() if self.adapters is not None else nullcontext():
            return self._map_micro_batches(batch, self.cfg.ppo_max_token_len_per_gpu, self._values)

    def update(self, batch: TrainBatch, *, num_mini_batches: int, epochs: int, norm_length: int) -> dict[str, float]:
        """Clipped value regression onto ``batch.returns`` around ``batch.old_values``."""
        cfg = self.cfg
        assert batch.returns is not None and batch.old_values is not None

        def micro_loss(batch: TrainBatch, micro: list[int], agg: dict[str, float]):
            values = self._values(batch, micro)
            mask = batch.response_mask[micro]
            loss, m = algorithms.value_loss(
                values,
                batch.old_values[micro],
                batch.returns[micro],
                mask,
                clip_range=cfg.cliprange_value,
                agg_mode=cfg.loss_agg_mode,
                norm_length=norm_length,
                **agg,
            )
            summed = {"critic/vf_loss": m.pop("critic/vf_loss")}
            averaged = dict(m)
            averaged["critic/vpred_mean"] = algorithms.metric_value(algorithms.masked_mean(values, mask))
            return loss, summed, averaged

        return self._optimize(
            batch,
            num_mini_batches=num_mini_batches,
            epochs=epochs,
            budget=cfg.ppo_max_token_len_per_gpu,
            grad_clip=cfg.grad_clip,
            micro_loss=micro_loss,
        )
