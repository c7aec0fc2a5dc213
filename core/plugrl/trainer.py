"""The training loop: sample prompts -> generate -> score -> advantages -> update -> sync -> log -> checkpoint.

The loop knows no task: data, templates, rewards and estimators come from plugins.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plugrl import checkpoint, hostmem
from plugrl.actor import PolicyModel, TrainBatch, TrainingError
from plugrl.algorithms import AdvantageBatch, adaptive_kl_coef, kl_penalty, masked_mean, overlong_penalty
from plugrl.classify import classify_groups
from plugrl.config import Config, ConfigError, dump_config, redact
from plugrl.data import PromptBatcher, load_samples, shard_batch
from plugrl.dist import (
    DistInfo,
    all_reduce,
    broadcast_object,
    gather_objects,
    init_distributed,
    launched_world_size,
    mean_metrics,
    resolve_device,
    shutdown,
)
from plugrl.evaluate import validate
from plugrl.models import check_context_length, resolve_model_path
from plugrl.plugins import check_algorithm, check_config, load_plugins, plugin_step_metrics
from plugrl.precision import resolve_config_dtypes
from plugrl.prompts import EncodedPrompt, encode_prompts
from plugrl.rewards import RewardItem, RewardOutput, RewardRunner, check_routes
from plugrl.rollout import Rollout, SamplingSettings, make_engine, response_texts
from plugrl.tracking import Tracker

log = logging.getLogger("plugrl.trainer")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class StopOnSignal:
    """SIGTERM / SIGINT ask the loop to stop after the current step (checkpoint saved, exit 0); a second
    SIGTERM or SIGINT stops at once, mid-step, with nothing of that step saved.

    The handler runs in the main thread between two Python bytecodes, so it also runs while vLLM
    generates in process (its engine loop is Python). A flag alone is read only after the step, so
    the second signal raises ``SystemExit(128 + signal number)``: the process exits with 143 (SIGTERM)
    or 130 (SIGINT), as a shell reports a process killed by that signal, after the usual cleanup on
    the way out (``plugrl_run_end`` hooks, reward workers); no traceback. Then the previous handlers
    are back, so a third signal acts as it would without plugrl (SIGTERM: the process dies at once).
    Each signal logs what happens and how to resume.

    Every rank must stop at the same step: :meth:`requested` is a collective.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signal_name is None:
            self.signal_name = name
            log.warning(
                "%s: stopping after this step, with a checkpoint. Send it again to stop at once, without "
                "finishing or saving the step.",
                name,
            )
            return
        self._restore()
        log.warning(
            "%s again: stopping now, mid-step, without saving it (exit code %d). Run the same command to "
            "resume from the last checkpoint (trainer.resume=auto).",
            name,
            128 + signum,
        )
        raise SystemExit(128 + signum)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def requested(self) -> bool:
        asked = all_reduce([1.0 if self.signal_name else 0.0], op="max")[0] > 0
        if asked and not self.signal_name:
            self.signal_name = "a signal on another rank"
        return asked


class Timer:
    """Wall time per phase of a step, reported as ``timing/<phase>`` seconds."""

    def __init__(self):
        self.times: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.times[phase] += time.perf_counter() - start


class Trainer:
    def __init__(self, cfg: Config):
        # Plugin and config checks come first: a mistake must cost seconds, not a model load (resolving a
        # `local:` model path may convert one), nor a process group.
        self.registry = load_plugins(cfg.plugins)
        self.estimator = check_algorithm(cfg.algorithm, self.registry)  # also checks algorithm.classifier
        check_config(cfg, self.registry)  # each plugin's own options (plugrl_check_config)
        cfg.model.path = resolve_model_path(cfg.model.path)
        if cfg.model.tokenizer_path:
            cfg.model.tokenizer_path = resolve_model_path(cfg.model.tokenizer_path)
        check_context_length(cfg.model.path, cfg.data.max_prompt_length, cfg.data.max_response_length)
        if cfg.rollout.name == "vllm":  # a layout the engine cannot drive fails here, before any model loads
            from plugrl.rollout.vllm_engine import check_rollout_parallel

            check_rollout_parallel(cfg.rollout, launched_world_size())
        self.cfg = cfg
        if hostmem.wanted(cfg.trainer.keep_freed_host_memory, resolve_device(cfg.trainer.device)):
            hostmem.keep_freed_memory()  # before the models: their activations are what it is for
        # ranks of one tensor-parallel group (actor.tp_size) share prompts: data is split over dp_rank / dp_size
        self.dist: DistInfo = init_distributed(cfg.trainer.device, cfg.actor.tp_size, cfg.trainer.dist_timeout_s)
        resolve_config_dtypes(cfg, self.dist.device)  # model.dtype: auto -> what this device computes fast
        seed_everything(cfg.trainer.seed)
        self.run_dir = Path(cfg.trainer.output_dir) / cfg.trainer.experiment_name

        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
        # all data checks happen here, before any model is loaded or anything generated
        samples, self.data_counts = load_samples(cfg.data, self.registry)
        check_routes(self.registry, {s.data_source for s in samples})
        prompts, counts = encode_prompts(samples, cfg.data, self.tokenizer, self.registry)
        self.data_counts.update(counts)
        self.val_prompts = self._load_val_prompts() if cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train else []
        self.batcher = PromptBatcher.from_config(
            prompts, cfg.data, rank=self.dist.dp_rank, world_size=self.dist.dp_size
        )
        self.total_steps = cfg.trainer.total_steps or self.batcher.batches_per_epoch * cfg.trainer.total_epochs

        self.policy = PolicyModel(cfg.model.path, cfg.model, cfg.actor, self.dist.device, total_steps=self.total_steps)
        self.use_ref = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self.critic = None
        if self.estimator.needs_critic:
            from plugrl.critic import ValueModel

            self.critic = ValueModel(
                resolve_model_path(cfg.critic.model.path or cfg.model.path),
                cfg.model,
                cfg.critic,
                self.dist.device,
                share_prompt_prefix=cfg.actor.share_prompt_prefix,
                total_steps=self.total_steps,
                tp_size=cfg.actor.tp_size,
            )
        self.ref = (
            PolicyModel(cfg.model.path, cfg.model, cfg.actor, self.dist.device, trainable=False)
            if self.use_ref
            else None
        )
        self.engine_dtype = torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else torch.float32
        self.engine = make_engine(
            cfg.rollout.name,
            model_path=cfg.model.path,
            cfg=cfg.rollout,
            dtype=cfg.rollout.dtype,
            max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
            device=self.dist.device.type,
            world_size=self.dist.world_size,
            rank=self.dist.rank,
            trainer_seed=cfg.trainer.seed,
            tokenizer=self.tokenizer,
        )
        self.kl_coef = cfg.algorithm.kl_ctrl.kl_coef  # adapted by the adaptive KL controller
        self.start_step = self._maybe_resume()
        if self.start_step:  # the engine loaded the base model from disk
            self.engine.load_weights(self.policy.named_full_parameters(self.engine_dtype))
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        # steps are logged 1-based: a run resumed after step k logs k+1 first
        self.tracker = Tracker(
            self.run_dir,
            cfg.trainer,  # logger, log_freq, table_freq, save_rollouts, project and experiment names
            self.total_steps,
            start_step=self.start_step + 1,
            config_dict=redact(cfg.model_dump()),
            rank=self.dist.rank,
        )

    # ------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        if self.dist.is_main:
            log.info(
                "training %s for %d steps (from step %d) in %s",
                self.cfg.model.path,
                self.total_steps,
                self.start_step,
                self.run_dir,
            )
        self.registry.hooks.plugrl_run_start(config=self.cfg, run_dir=self.run_dir)
        try:
            summary = self._train_loop()
        except BaseException as e:
            self.registry.hooks.plugrl_run_end(config=self.cfg, run_dir=self.run_dir, error=e)
            raise
        self.registry.hooks.plugrl_run_end(config=self.cfg, run_dir=self.run_dir, error=None)
        return summary

    def _train_loop(self) -> dict[str, Any]:
        cfg = self.cfg.trainer
        bad_steps = 0
        with RewardRunner(self.registry, self.cfg.reward) as self.rewards, StopOnSignal() as stop:
            if cfg.val_before_train and self.start_step == 0 and self.val_prompts:
                self.tracker.log(0, self.validate(0))
            for step in range(self.start_step, self.total_steps):
                metrics = self.train_step(step)
                done = step + 1
                if self.val_prompts and cfg.test_freq > 0 and (done % cfg.test_freq == 0 or done == self.total_steps):
                    metrics.update(self.validate(done))
                self.tracker.log(done, metrics)
                # an update skipped for a NaN/inf gradient leaves the weights as they were
                bad_steps = bad_steps + 1 if metrics.get("actor/skipped_updates", 0) > 0 else 0
                if bad_steps >= cfg.max_bad_steps:
                    path = self.save(done)
                    raise TrainingError(
                        f"{bad_steps} steps in a row had non-finite gradients (their updates were skipped); "
                        f"stopped with the last good weights in {path}. Lower actor.optim.lr or actor.grad_clip, "
                        "or check the rewards for NaN, then resume with the same command."
                    )
                stopping = stop.requested()
                periodic = cfg.save_freq > 0 and done % cfg.save_freq == 0
                if stopping or periodic or (done == self.total_steps and cfg.save_freq != 0):
                    self.save(done)
                if stopping:
                    if self.dist.is_main:
                        log.warning(
                            "stopped by %s after step %d; checkpoint saved. Run the same command again to resume "
                            "(trainer.resume=auto).",
                            stop.signal_name,
                            done,
                        )
                    break
        summary = self.tracker.close()
        self.engine.close()
        return summary

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        timer = Timer()
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}

        prompts, flat, texts, scored = self._collect_rollouts(step, timer, metrics)
        batch = self._make_batch(flat)
        scores = torch.tensor(scored.scores, dtype=torch.float32)
        ob = cfg.reward.overlong_buffer
        if ob.enable:  # DAPO: a soft penalty over the last tokens before the length limit
            penalty = overlong_penalty(
                torch.tensor(batch.response_lens), cfg.data.max_response_length, ob.len, ob.penalty_factor
            )
            scores = scores + penalty
            metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
        token_rewards = torch.zeros_like(batch.response_mask)
        last = (torch.tensor(batch.response_lens) - 1).clamp(min=0)
        token_rewards[torch.arange(len(flat)), last] = scores

        on_policy_single_pass = cfg.actor.ppo_epochs == 1 and cfg.data.train_batch_size == cfg.mini_batch_size
        if not on_policy_single_pass or cfg.algorithm.use_kl_in_reward:
            with timer("old_logprob"):
                batch.old_logprobs = self.policy.compute_logprobs(
                    batch, cfg.rollout.temperature, cfg.actor.ppo_max_token_len_per_gpu
                )
        if self.ref is not None:
            with timer("ref_logprob"):
                batch.ref_logprobs = self.ref.compute_logprobs(
                    batch, cfg.rollout.temperature, cfg.ref.log_prob_max_token_len_per_gpu
                )
        if cfg.algorithm.use_kl_in_reward:
            token_rewards = token_rewards - self._kl_in_reward(batch, metrics)

        if self.critic is not None:
            with timer("values"):
                batch.old_values = self.critic.compute_values(batch)
        extras = self._estimator_extras(prompts, texts, timer, metrics)
        with timer("advantage"):
            adv = self.estimator.fn(
                AdvantageBatch(
                    token_level_rewards=token_rewards,
                    response_mask=batch.response_mask,
                    group_ids=torch.tensor(batch.group_ids),
                    values=batch.old_values,
                    extras=extras,
                ),
                cfg.algorithm,
            )
            batch.advantages = adv.advantages * batch.response_mask
            batch.returns = adv.returns

        train_batch = batch
        if cfg.actor.mask_truncated_completions:  # counted in the advantages, left out of the loss
            train_batch = batch.select([i for i, (_, r) in enumerate(flat) if r.finish_reason != "length"])
        num_mini_batches = cfg.data.train_batch_size // cfg.mini_batch_size
        if self.critic is not None:
            with timer("critic_update"):
                metrics.update(
                    self.critic.update(
                        train_batch,
                        num_mini_batches=num_mini_batches,
                        epochs=cfg.critic.ppo_epochs or cfg.actor.ppo_epochs,
                        norm_length=cfg.data.max_response_length,
                    )
                )
        if step >= cfg.trainer.critic_warmup:  # the critic learns alone for its first warm-up steps
            with timer("update"):
                metrics.update(
                    self.policy.update(
                        train_batch,
                        num_mini_batches=num_mini_batches,
                        temperature=cfg.rollout.temperature,
                        norm_length=cfg.data.max_response_length,
                    )
                )
        with timer("sync_weights"):
            self.engine.load_weights(self.policy.named_full_parameters(self.engine_dtype))

        timer.times["step"] = time.perf_counter() - t0
        metrics.update(self._rollout_metrics(flat, scored, batch, timer))
        metrics.update(adv.metrics)
        metrics.update({f"timing/{k}": v for k, v in timer.times.items()})
        metrics.update(plugin_step_metrics(self.registry, step + 1, metrics))
        metrics = mean_metrics(metrics)
        self._log_samples(step + 1, flat, texts, scored)
        return metrics

    # ------------------------------------------------------------------------------------------
    def _generate_and_score(self, prompts: list[EncodedPrompt], seed: int | None, timer: Timer):
        """n rollouts per prompt, decoded and scored: (flat [(prompt, rollout)], texts, RewardOutput)."""
        cfg = self.cfg
        with timer("generate"):
            self.engine.wake_up()
            sampling = SamplingSettings(
                n=cfg.rollout.n,
                max_tokens=cfg.data.max_response_length,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
                top_k=cfg.rollout.top_k,
                stop=tuple(cfg.rollout.stop),
                include_stop_str_in_output=cfg.rollout.include_stop_str_in_output,
                seed=seed,
            )
            # the ranks of a tensor-parallel group hold the same prompts: the first generates, the rest join
            # the engine's collectives with none and receive its rollouts below
            lead = self.dist.tp_lead
            groups = self.engine.generate([p.ids for p in prompts] if lead else [], sampling)
            self.engine.sleep()
        if not lead:
            return broadcast_object(None, self._tp_group())
        flat = [(p, r) for p, g in zip(prompts, groups, strict=True) for r in g]
        with timer("reward"):
            texts = response_texts(self.tokenizer, [r for _, r in flat], sampling)
            if cfg.data.prefill:  # the prefill is the start of the assistant's answer: score it with the rest
                texts = [cfg.data.prefill + t for t in texts]
            scored = self.rewards.score(
                [RewardItem(p.sample, p.text, t) for (p, _), t in zip(flat, texts, strict=True)]
            )
        if self.dist.tp_size > 1:  # the TP group trains on its first rank's rollouts and scores
            flat, texts, scored = broadcast_object((flat, texts, scored), self._tp_group())
        return flat, texts, scored

    def _tp_group(self):
        from plugrl.parallel import device_mesh

        return device_mesh(self.dist.device.type, self.dist.tp_size)["tp"].get_group()

    def _collect_rollouts(self, step: int, timer: Timer, metrics: dict[str, float]):
        """This step's prompts and scored rollouts; with DAPO dynamic sampling, only groups whose
        rewards differ, refilled from further prompts for up to ``max_num_gen_batches`` rounds."""
        cfg = self.cfg
        fg = cfg.algorithm.filter_groups
        n = cfg.rollout.n
        seed_base = None if cfg.rollout.seed is None else cfg.rollout.seed + step * self.dist.dp_size * 1000
        prompts = self.batcher.next_batch()
        seed = None if seed_base is None else seed_base + self.dist.dp_rank
        flat, texts, scored = self._generate_and_score(prompts, seed, timer)
        if not fg.enable:
            return prompts, flat, texts, scored
        # the reward metrics stay those of the first round: the policy's unfiltered performance
        want = len(prompts)
        kept_p, kept_f, kept_t, kept_s, kept_d = [], [], [], [], []
        rounds, seen = 1, 0
        while True:
            for g, prompt in enumerate(prompts):
                group = scored.scores[g * n : (g + 1) * n]
                seen += 1
                if max(group) > min(group) and len(kept_p) < want:
                    kept_p.append(prompt)
                    kept_f += flat[g * n : (g + 1) * n]
                    kept_t += texts[g * n : (g + 1) * n]
                    kept_s += group
                    kept_d += scored.details[g * n : (g + 1) * n]
            enough = all_reduce([float(len(kept_p) >= want)], op="min")[0] > 0
            if enough or rounds >= fg.max_num_gen_batches:
                break
            rounds += 1
            prompts = self.batcher.next_batch()
            seed = None if seed_base is None else seed_base + rounds * self.dist.dp_size + self.dist.dp_rank
            flat, texts, more = self._generate_and_score(prompts, seed, timer)
            scored = RewardOutput(more.scores, more.details, scored.metrics)
        metrics["dapo/gen_rounds"] = float(rounds)
        metrics["dapo/kept_groups"] = float(len(kept_p))
        metrics["dapo/kept_frac"] = len(kept_p) / seen
        if not kept_p:  # every group agreed: nothing to learn from; train on the last round as it is
            return prompts, flat, texts, scored
        return kept_p, kept_f, kept_t, RewardOutput(kept_s, kept_d, scored.metrics)

    def _kl_in_reward(self, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """[B, T] the KL penalty subtracted from the token rewards; adapts its coefficient when asked."""
        kc = self.cfg.algorithm.kl_ctrl
        kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, self.cfg.algorithm.kl_penalty) * batch.response_mask
        current = float(masked_mean(kl, batch.response_mask))
        penalty = self.kl_coef * kl
        metrics["actor/reward_kl_penalty"] = current
        metrics["actor/reward_kl_coef"] = self.kl_coef
        if kc.type == "adaptive":
            self.kl_coef = adaptive_kl_coef(self.kl_coef, current, kc.target_kl, kc.horizon, len(batch))
        return penalty

    def _estimator_extras(self, prompts, texts, timer: Timer, metrics: dict[str, float]) -> dict[str, Any]:
        """What special estimators need beyond rewards: greedy baselines (ReMax), strategy groups."""
        cfg = self.cfg
        n = cfg.rollout.n
        extras: dict[str, Any] = {"responses": texts, "prompts": [p.text for p in prompts for _ in range(n)]}
        if self.estimator.needs_greedy_baseline:
            with timer("baseline"):
                extras["baseline_scores"] = self._greedy_baseline_scores(prompts)
        if self.estimator.needs_solution_groups and self.dist.tp_lead:  # the TP group's first rank asks
            with timer("classify"):
                ids, cmetrics = classify_groups(
                    self.registry.classifiers[cfg.algorithm.classifier],
                    [p.text for p in prompts],
                    [texts[i * n : (i + 1) * n] for i in range(len(prompts))],
                    options=cfg.algorithm.classifier_options,
                    concurrency=cfg.algorithm.classifier_concurrency,
                    retries=cfg.algorithm.classifier_retries,
                )
                extras["solution_groups"] = torch.tensor(ids)
                metrics.update(cmetrics)
        if self.dist.tp_size > 1:  # one TP group, one set of advantages (an LLM classifier may answer differently)
            extras = broadcast_object(extras, self._tp_group())
        return extras

    def _load_val_prompts(self) -> list[EncodedPrompt]:
        cfg = self.cfg
        if not cfg.data.val_files and not cfg.data.dataset:
            raise ConfigError("trainer.test_freq / trainer.val_before_train need validation data: set data.val_files")
        samples, _ = load_samples(cfg.data, self.registry, split=cfg.data.val_split, files=cfg.data.val_files or None)
        check_routes(self.registry, {s.data_source for s in samples})
        prompts, _ = encode_prompts(samples, cfg.data, self.tokenizer, self.registry)
        return shard_batch(prompts, self.dist.dp_rank, self.dist.dp_size)

    def validate(self, step: int) -> dict[str, float]:
        """Validation metrics (``val/...``) at ``step``; samples go to validation/step_N.jsonl."""
        vk = self.cfg.rollout.val_kwargs
        sampling = SamplingSettings(
            n=vk.n,
            max_tokens=self.cfg.data.max_response_length,
            temperature=vk.temperature,
            top_p=vk.top_p,
            top_k=vk.top_k,
            stop=tuple(self.cfg.rollout.stop),
            include_stop_str_in_output=self.cfg.rollout.include_stop_str_in_output,
            seed=self.cfg.rollout.seed,
        )
        t0 = time.perf_counter()
        metrics, rows = validate(
            self.engine,
            self.tokenizer,
            self.val_prompts,
            self.rewards,
            sampling,
            prefill=self.cfg.data.prefill,
            threshold=self.cfg.trainer.val_correct_threshold,
        )
        metrics["timing/validate"] = time.perf_counter() - t0
        everyone = gather_objects(rows if self.dist.tp_lead else [])  # a TP group's ranks hold the same rows
        if self.dist.is_main:
            out = self.run_dir / "validation"
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"step_{step:06d}.jsonl", "w") as f:
                for part in everyone:
                    for row in part:
                        f.write(json.dumps(row, default=str) + "\n")
        return mean_metrics(metrics)

    def _greedy_baseline_scores(self, prompts: list[EncodedPrompt]) -> torch.Tensor | None:
        """[B] the reward of one greedy response per prompt, repeated for its n samples (ReMax); None on the
        later ranks of a tensor-parallel group, which join the engine with no prompts and receive the first
        rank's extras."""
        greedy = SamplingSettings(
            n=1,
            max_tokens=self.cfg.data.max_response_length,
            temperature=0.0,
            stop=tuple(self.cfg.rollout.stop),
            include_stop_str_in_output=self.cfg.rollout.include_stop_str_in_output,
        )
        lead = self.dist.tp_lead
        self.engine.wake_up()
        rollouts = [g[0] for g in self.engine.generate([p.ids for p in prompts] if lead else [], greedy)]
        self.engine.sleep()
        if not lead:
            return None
        texts = response_texts(self.tokenizer, rollouts, greedy)
        prefill = self.cfg.data.prefill or ""
        scored = self.rewards.score(
            [RewardItem(p.sample, p.text, prefill + t) for p, t in zip(prompts, texts, strict=True)]
        )
        return torch.tensor(scored.scores, dtype=torch.float32).repeat_interleave(self.cfg.rollout.n)

    # ------------------------------------------------------------------------------------------
    def _make_batch(self, flat: list[tuple[EncodedPrompt, Rollout]]) -> TrainBatch:
        return TrainBatch.from_sequences(
            [list(r.prompt_ids) + list(r.response_ids) for _, r in flat],
            [len(r.prompt_ids) for _, r in flat],
            group_ids=[i // self.cfg.rollout.n for i in range(len(flat))],
        )

    def _rollout_metrics(self, flat, scored, batch: TrainBatch, timer: Timer) -> dict[str, float]:
        rlens = torch.tensor(batch.response_lens, dtype=torch.float32)
        prompt_tokens = float(sum(batch.prompt_lens))
        response_tokens = float(rlens.sum())
        # throughput counts every data-parallel rank's tokens (the ranks of a TP group hold the same ones)
        p_all, r_all = (x / self.dist.tp_size for x in all_reduce([prompt_tokens, response_tokens]))
        m = dict(scored.metrics)
        m.update(
            {
                "response_length/mean": float(rlens.mean()),
                "response_length/max": float(rlens.max()),
                "response_length/clip_ratio": sum(r.finish_reason == "length" for _, r in flat) / len(flat),
                "prompt_length/mean": prompt_tokens / len(flat),
                "perf/tokens_per_s": (p_all + r_all) / timer.times["step"],
                "perf/rollout_tokens_per_s": r_all / max(timer.times["generate"], 1e-9),
            }
        )
        if timer.times.get("update"):
            m["perf/train_tokens_per_s"] = (p_all + r_all) / timer.times["update"]
        return m

    def _log_samples(self, step: int, flat, texts: list[str], scored) -> None:
        if not self.cfg.trainer.save_rollouts:
            return
        rows = [
            {
                "prompt": p.text,
                "completion": t,
                "data_source": p.sample.data_source,
                "ground_truth": p.sample.ground_truth,
                "reward": s,
                "details": d,
                "finish_reason": r.finish_reason,
            }
            for (p, r), t, s, d in zip(flat, texts, scored.scores, scored.details, strict=True)
        ]
        everyone = gather_objects(rows if self.dist.tp_lead else [])  # a TP group's ranks hold the same rows
        if self.dist.is_main:
            self.tracker.log_samples(step, [row for part in everyone for row in part])

    # ------------------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        state = {"data": self.batcher.state_dict(), "world_size": self.dist.world_size, "kl_coef": self.kl_coef}
        path = checkpoint.save_checkpoint(
            self.run_dir,
            step,
            self.policy,
            self.tokenizer,
            state,
            keep=self.cfg.trainer.max_checkpoints,
            rank=self.dist.rank,
            critic=self.critic,
        )
        if self.dist.is_main:
            log.info("saved checkpoint %s", path)
        return path

    def _maybe_resume(self) -> int:
        mode = self.cfg.trainer.resume
        if mode == "disable":
            return 0
        # rank 0 alone hashes the files, every rank gets its pick (or the CheckpointError for a named one);
        # a named checkpoint needs no run dir (and its check comes before anything else is touched)
        ckpt = checkpoint.resume_checkpoint(self.run_dir if mode == "auto" else None, mode)
        if ckpt is None:
            return 0
        # rank 0 alone reads the weights and optimizer state, and broadcasts them into every rank's shards
        state = checkpoint.load_checkpoint(ckpt, self.policy, self.dist.rank, critic=self.critic)
        self.batcher.load_state_dict(state["data"])
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        if self.dist.is_main:
            log.info("resumed from %s at step %d", ckpt, state["step"])
        return int(state["step"])


def train(cfg: Config) -> dict[str, Any]:
    """Run a whole training job; returns the tracker's summary."""
    summary = Trainer(cfg).train()
    shutdown()
    return summary
