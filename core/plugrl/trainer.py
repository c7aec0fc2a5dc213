"""The training loop: sample prompts -> generate -> score -> advantages -> update -> sync -> log -> checkpoint.

The loop knows no task: data, templates, rewards and estimators come from plugins.
"""

from __future__ import annotations

import json
import logging
import random
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plugrl import checkpoint, hostmem, model_adapters, rollouts_ahead
from plugrl.actor import PolicyModel, TrainBatch, TrainingError
from plugrl.algorithms import (
    AdvantageBatch,
    AdvantageResult,
    StepContext,
    adaptive_kl_coef,
    kl_penalty,
    masked_mean,
    step_wise_advantages,
)
from plugrl.config import Config, ConfigError, dump_config, redact
from plugrl.data import PromptBatcher, shard_batch
from plugrl.dist import (
    DistInfo,
    all_reduce,
    broadcast_object,
    gather_objects,
    init_distributed,
    mean_metrics,
    new_host_group,
    resolve_device,
    shutdown,
)
from plugrl.episodes import Episode, FailureTally, StepRecord, dapo_settings, dynamic_sampling
from plugrl.evaluate import validate
from plugrl.models import resolve_model_path
from plugrl.placement import resolve_token_budgets
from plugrl.plugins import PluginRun, call_hook, final_checkpoint, plugin_step_metrics
from plugrl.precision import resolve_config_dtypes
from plugrl.prompts import EncodedPrompt
from plugrl.resume_check import RECORD_KEY, resume_problem, run_identity, warn_named
from plugrl.rewards import RewardRunner
from plugrl.rollout import make_engine, sampling_settings
from plugrl.rollout.play import conversation_metrics, conversation_row, generate_scored, make_episode_runner
from plugrl.signals import StopOnSignal
from plugrl.startup import check_run, load_run_data, output_dir_problem
from plugrl.tracking import SKIPPED_STEP_KEY, Timer, Tracker, logger_problem

log = logging.getLogger("plugrl.trainer")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    def __init__(self, cfg: Config):
        # every check that needs no model comes first (shared with `plugrl eval`): a mistake costs seconds
        no_logger = logger_problem(cfg.trainer.logger)  # wandb without a login, a logger not installed
        if no_logger:
            raise ConfigError(no_logger)
        plugins = check_run(cfg, training=True)
        self.registry, self.estimator, self.policy_loss = plugins.registry, plugins.estimator, plugins.policy_loss
        self.cfg = cfg
        if hostmem.wanted(cfg.trainer.keep_freed_host_memory, resolve_device(cfg.trainer.device)):
            hostmem.keep_freed_memory()  # before the models: their activations are what it is for
        # ranks of one tensor-parallel group (actor.tp_size) share prompts: data is split over dp_rank / dp_size
        self.dist: DistInfo = init_distributed(cfg.trainer.device, cfg.actor.tp_size, cfg.trainer.dist_timeout_s)
        rc = getattr(cfg.algorithm, "rollout_correction", None)  # plugrl-advantages' section
        self.correction = rc if rc is not None and rc.mode != "off" else None
        if self.correction is not None and getattr(cfg, "_log_probs_turned_on", False) and self.dist.is_main:
            log.info(
                "rollout.calculate_log_probs turned on: algorithm.rollout_correction.mode=%s compares the "
                "engine's log-probs with the trainer's",
                self.correction.mode,
            )
        resolve_config_dtypes(cfg, self.dist.device)  # model.dtype: auto -> what this device computes fast
        # an unset micro-batch token budget: 1024 on the CPU, from the GPU's memory and the model's shape on a GPU
        resolve_token_budgets(
            cfg, self.dist.device, data_parallel=self.dist.dp_size, sharded=torch.distributed.is_initialized()
        )
        seed_everything(cfg.trainer.seed)
        self.run_dir = cfg.trainer.run_dir

        # all data checks happen here, before any model is loaded or anything generated
        data = load_run_data(cfg, self.registry)
        self.tokenizer, self.processor, self.data_counts = data.tokenizer, data.processor, data.counts
        prompts = data.prompts
        self.val_prompts = shard_batch(data.val_prompts, self.dist.dp_rank, self.dist.dp_size)
        self.validates = bool(data.val_prompts)  # the same on every rank, also one whose share of it is empty
        self.filtering, self.overlong = dapo_settings(cfg)  # DAPO (plugrl-dapo): dynamic sampling, overlong penalty
        # DAPO's dynamic sampling draws data.gen_batch_size prompts a round (verl's), filling train_batch_size
        gen_batch = cfg.data.gen_batch_size if self.filtering else None
        self.batcher = PromptBatcher.from_config(
            prompts, cfg.data, rank=self.dist.dp_rank, world_size=self.dist.dp_size, batch_size=gen_batch
        )
        self.total_steps = cfg.trainer.total_steps or self.batcher.batches_per_epoch * cfg.trainer.total_epochs

        # rank 0 writes the run directory: it tries it before any model loads, and every rank stops if it cannot
        # ... and checks that the checkpoints trainer.resume=auto would continue are this run's
        problem = (output_dir_problem(self.run_dir) or resume_problem(cfg)) if self.dist.is_main else None
        problem = broadcast_object(problem)
        if problem:
            raise ConfigError(problem)

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
        # LoRA: no second model; the reference is the policy with its adapters off (PolicyModel.compute_logprobs)
        lora = model_adapters.settings(cfg.actor)
        self.ref = (
            PolicyModel(cfg.model.path, cfg.model, cfg.actor, self.dist.device, trainable=False)
            if self.use_ref and lora is None
            else None
        )
        self.engine_dtype = torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else torch.float32
        # LoRA with rollout.lora_sync=adapter: the engine keeps the base weights and applies the policy's adapter
        self.sync_adapter = lora is not None and cfg.rollout.lora_sync == "adapter"
        # rollout.mode=server: the `server` engine (plugrl-rollout-servers) shares the prompts out over the servers
        self.engine = make_engine(
            "server" if cfg.rollout.mode == "server" else cfg.rollout.name,
            self.registry.engines,
            model_path=cfg.model.path,
            cfg=cfg.rollout,
            dtype=cfg.rollout.dtype,
            max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
            device=self.dist.device.type,
            world_size=self.dist.world_size,
            rank=self.dist.rank,
            trainer_seed=cfg.trainer.seed,
            # ReMax's greedy baseline and DAPO's refill rounds generate between the sleep and the weight sync
            generates_before_sync=self.estimator.needs_greedy_baseline or self.filtering,
            tokenizer=self.tokenizer,
            lora_rank=lora.r if self.sync_adapter else 0,
            hf_overrides=cfg.model.override_config,
            run_config=cfg,
            log_dir=self.run_dir,
        )
        self.episodes = None
        if cfg.multi_turn:
            self.episodes = make_episode_runner(cfg, self.registry, self.engine, self.tokenizer, self.processor)
        self.kl_coef = cfg.algorithm.kl_ctrl.kl_coef  # adapted by the adaptive KL controller
        self.failures = FailureTally()  # the run's failed episodes by reason, the same on every rank
        # trainer.off_policy_steps: the rollouts of later steps are generated while a step trains (plugrl-off-policy)
        k = getattr(cfg.trainer, "off_policy_steps", 0)
        self.ahead: rollouts_ahead.Rollouts = (
            rollouts_ahead.kit(k).RolloutsAhead(self._rollouts_of, k, new_host_group())
            if k
            else rollouts_ahead.OnPolicy(self._rollouts_of)
        )
        self.start_step = self._maybe_resume()
        # the engine loaded the base model from disk; rollout servers given by URL may hold anything
        if self.start_step or self.sync_adapter or cfg.rollout.mode == "server":
            self._sync_engine()
        self.ahead.weights_changed(self.start_step)
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
        with PluginRun(self.registry, self.cfg, self.run_dir):  # plugrl_run_start ... plugrl_run_end
            return self._train_loop()

    def _train_loop(self) -> dict[str, Any]:
        cfg = self.cfg.trainer
        bad_steps: list[str] = []  # what each step of the current run of steps that trained nothing lacked
        with RewardRunner(self.registry, self.cfg.reward) as self.rewards, StopOnSignal() as stop:
            if self.ahead.steps_ahead and self.dist.world_size > 1 and self.rewards.collective_rewards:
                raise ConfigError(
                    f"trainer.off_policy_steps={self.ahead.steps_ahead} scores on the rollout thread, but the reward "
                    f"{', '.join(self.rewards.collective_rewards)} is a collective over all {self.dist.world_size} "
                    "ranks (a sharded reward model), whose collectives would meet the training's; set its shard "
                    "option false, or trainer.off_policy_steps=0"
                )
            if cfg.val_before_train and self.start_step == 0 and self.validates:
                self.tracker.log(0, self.validate(0))
            for step in range(self.start_step, self.total_steps):
                metrics = self.train_step(step)
                done = step + 1
                if self.validates and cfg.test_freq > 0 and (done % cfg.test_freq == 0 or done == self.total_steps):
                    metrics.update(self.validate(done))
                self.tracker.log(done, metrics)
                # a step that left the weights as they were: an update skipped for a NaN/inf gradient, or no
                # episode to train on (every one failed)
                if metrics.get(SKIPPED_STEP_KEY, 0) > 0:
                    bad_steps.append("episodes")
                elif metrics.get("actor/skipped_updates", 0) > 0:
                    bad_steps.append("gradient")
                else:
                    bad_steps = []
                if len(bad_steps) >= cfg.max_bad_steps:
                    path = self.save(done)
                    self.tracker.episode_failures = self.failures.by_reason()
                    self.tracker.close()  # the summary, with the failures by reason
                    raise TrainingError(self._bad_steps_message(bad_steps, path))
                stopping = stop.requested()
                periodic = cfg.save_freq != "end" and cfg.save_freq > 0 and done % cfg.save_freq == 0
                if stopping or periodic or (done == self.total_steps and cfg.saves):
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
        self.tracker.episode_failures = self.failures.by_reason()
        summary = self.tracker.close()
        self.ahead.close()
        if self.episodes is not None:
            self.episodes.close()
        self.engine.close()
        if self.dist.is_main:  # the last step's checkpoint to the plugins that hand it on (plugrl-hub uploads it)
            final = self.run_dir / "checkpoints" / f"{checkpoint.PREFIX}{self.total_steps:06d}"
            final_checkpoint(self.registry, self.cfg, self.run_dir, final if final.is_dir() else None, self.total_steps)
        return summary

    def _bad_steps_message(self, kinds: list[str], path: Path) -> str:
        """Why ``trainer.max_bad_steps`` steps in a row trained nothing, and what to do."""
        n, no_episodes = len(kinds), kinds.count("episodes")
        failed = self.failures.by_reason()
        reason = f"; most often: {failed[0][0]} ({failed[0][1]} episodes)" if failed else ""
        if no_episodes == 0:
            return (
                f"{n} steps in a row had non-finite gradients (their updates were skipped); "
                f"stopped with the last good weights in {path}. Lower actor.optim.lr or actor.grad_clip, "
                "or check the rewards for NaN, then resume with the same command."
            )
        what = (
            "had no episode to train on (every episode failed at its start)"
            if no_episodes == n
            else f"trained nothing ({no_episodes} had no episode to train on, {n - no_episodes} non-finite gradients)"
        )
        return (
            f"{n} steps in a row {what} (trainer.max_bad_steps={self.cfg.trainer.max_bad_steps}){reason}. "
            f"Stopped with the last weights in {path}; fix what fails (the rollouts' env_error says it for each "
            "episode), then resume with the same command."
        )

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        timer = Timer()
        t0, cpu0 = time.perf_counter(), time.process_time()
        metrics: dict[str, float] = {}

        # generate and score (DAPO: varied groups only), or take what was generated while earlier steps trained
        record = self._take_rollouts(step, timer, metrics)
        if not self._count_failures(step, record, metrics):  # no episode to train on, on any rank
            return self._skipped_step(step, record, timer, t0, metrics)
        batch = self._make_batch(record)
        token_rewards = self._token_rewards(record, batch, metrics)
        on_policy_single_pass = cfg.actor.ppo_epochs == 1 and cfg.data.train_batch_size == cfg.mini_batch_size
        # a rollout correction weighs the engine's log-probs against these: computed in on-policy runs too
        if not on_policy_single_pass or cfg.algorithm.use_kl_in_reward or self.correction is not None:
            with timer("old_logprob"):
                batch.old_logprobs = self.policy.compute_logprobs(
                    batch, cfg.rollout.temperature, cfg.actor.ppo_max_token_len_per_gpu
                )
        if self.use_ref:
            with timer("ref_logprob"):
                args = (batch, cfg.rollout.temperature, cfg.ref.log_prob_max_token_len_per_gpu)
                if self.ref is not None:
                    batch.ref_logprobs = self.ref.compute_logprobs(*args)
                else:  # LoRA
                    batch.ref_logprobs = self.policy.compute_logprobs(*args, adapters=False)
        if cfg.algorithm.use_kl_in_reward:
            token_rewards = token_rewards - self._kl_in_reward(batch, metrics)
        if self.critic is not None:
            with timer("values"):
                batch.old_values = self.critic.compute_values(batch)
        adv = self._advantages(record, batch, token_rewards, timer)  # its metrics join the step's below
        self._update(step, record, batch, timer, metrics)
        if self.ahead.steps_ahead:
            with timer("wait_rollouts"):  # the engine takes new weights between two generations
                self.ahead.settle()
        with timer("sync_weights"):
            self._sync_engine()
        self.ahead.weights_changed(step + 1)

        timer.times["step"] = time.perf_counter() - t0
        # the CPU time of every thread of this process over the step: how many cores it kept busy
        metrics["perf/cpu_cores_busy"] = (time.process_time() - cpu0) / timer.times["step"]
        metrics.update(self._rollout_metrics(record, timer))
        metrics.update(adv.metrics)
        metrics.update({f"timing/{k}": v for k, v in timer.times.items()})
        metrics.update(plugin_step_metrics(self.registry, step + 1, metrics))
        metrics = mean_metrics(metrics)
        self._log_samples(step + 1, record)
        return metrics

    def _count_failures(self, step: int, record: StepRecord, metrics: dict[str, float]) -> bool:
        """Count the step's failed episodes over every rank (``rollout/failed_episodes``), say each new reason
        once, and tell whether any rank has an episode to train on (a collective: every rank gets the same
        answer, and skips the step together when it is False)."""
        lead = self.dist.tp_lead  # a tensor-parallel group's ranks hold the same episodes: its first one counts
        reasons = [r for e in record.episodes if (r := e.failure) is not None] if lead else []
        trainable = sum(e.trainable for e in record.episodes) if lead else 0
        failed, trainable, total = all_reduce([float(len(reasons)), float(trainable), float(len(record) * lead)])
        metrics["rollout/failed_episodes"] = failed
        why = ""
        if failed:
            counted, new = self.failures.add((r for part in gather_objects(reasons) for r in part), step + 1)
            for kind in new if self.dist.is_main else ():  # each reason said once; all are counted
                example = self.failures.examples[kind]
                log.warning("step %d: %d episodes failed: %s", step + 1, counted[kind], example)
            kind, count = counted.most_common(1)[0]
            why = f" ({failed:.0f} failed, {count} for the reason said at step {self.failures.first_step[kind]})"
        if not trainable and self.dist.is_main:
            log.warning("step %d skipped: none of its %d episodes has a token to train on%s", step + 1, total, why)
        return trainable > 0

    def _skipped_step(self, step: int, record: StepRecord, timer: Timer, t0: float, metrics: dict) -> dict[str, float]:
        """A step with no episode to train on: no update and no weight sync; the learning-rate schedules count it
        (as they count an update skipped for a non-finite gradient); its rollouts and metrics are logged."""
        with warnings.catch_warnings():  # a schedule stepped before any optimizer step warns
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            for model in (self.policy, self.critic):
                if model is not None and getattr(model, "scheduler", None) is not None:
                    model.scheduler.step()
        self.ahead.weights_changed(step + 1)  # the engine holds step + 1's weights: they are step's
        timer.times["step"] = time.perf_counter() - t0
        metrics[SKIPPED_STEP_KEY] = 1.0
        metrics.update(self._rollout_metrics(record, timer))
        metrics.update({f"timing/{k}": v for k, v in timer.times.items()})
        metrics.update(plugin_step_metrics(self.registry, step + 1, metrics))
        metrics = mean_metrics(metrics)
        self._log_samples(step + 1, record)
        return metrics

    # ------------------------------------------------------------------------------------------
    def _take_rollouts(self, step: int, timer: Timer, metrics: dict[str, float]) -> StepRecord:
        """This step's scored episodes: generated now (on-policy) or ahead (trainer.off_policy_steps); then the
        generation of step + k starts, with the weights the engine holds now. Their phase times and metrics join
        the step's."""
        ahead = self.ahead.take(step)
        self.ahead.schedule(min(step + self.ahead.steps_ahead, self.total_steps - 1))
        record, gen_timer, gen_metrics = ahead.result
        for phase, seconds in gen_timer.times.items():
            timer.times[phase] += seconds
        metrics.update(gen_metrics)
        if self.ahead.steps_ahead:
            timer.times["wait_rollouts"] += ahead.waited_s
            metrics["rollout/policy_lag"] = float(step - ahead.version)  # steps between sampling and training
        return record

    def _rollouts_of(self, step: int) -> tuple[StepRecord, Timer, dict[str, float]]:
        """:meth:`_collect_rollouts` of ``step`` with a timer and metrics of its own (it may run on the rollout
        thread, beside another step's training)."""
        timer, metrics = Timer(), {}
        record = self._collect_rollouts(step, timer, metrics)
        return record, timer, metrics

    def _generate_and_score(self, prompts: list[EncodedPrompt], seed: int | None, timer: Timer) -> StepRecord:
        """``rollout.n`` episodes per prompt, scored: one response each, or whole multi-turn conversations when
        an environment or tools are configured."""
        cfg = self.cfg
        sampling = sampling_settings(cfg, "train", seed=seed)
        lead = self.dist.tp_lead
        # the ranks of a tensor-parallel group hold the same prompts: the first generates, the rest join
        # the engine's collectives with none and receive its record below
        with timer("generate"):
            played, texts, scored = self._play(prompts, sampling)
        # generate_scored also scored: move that time, and the tools' and environments', to their own timers
        spent = {"reward": scored.metrics.get("reward/time_s", 0.0)}
        if self.episodes is not None:
            spent["env"] = self.episodes.timings["env"]
        for key, seconds in spent.items():
            timer.times[key] = timer.times.get(key, 0.0) + seconds
            timer.times["generate"] -= seconds
        if not lead:
            return broadcast_object(None, self._tp_group())
        episodes = [
            Episode(p, r, t, s, d, c)
            for (p, r, c), t, s, d in zip(played, texts, scored.scores, scored.details, strict=True)
        ]
        record = StepRecord(list(prompts), episodes, cfg.rollout.n, scored.metrics)
        if self.dist.tp_size > 1:  # the TP group trains on its first rank's episodes
            record = broadcast_object(record, self._tp_group())
        return record

    def _play(self, prompts: list[EncodedPrompt], sampling) -> tuple:
        """:func:`generate_scored` on the woken engine: this rank's prompts on the first rank of a tensor-parallel
        group, none on the others (they join the engine's collectives and receive the first rank's results)."""
        self.engine.wake_up()
        with self.rewards.scoring_round():  # a rank with nothing to score joins a collective reward with none
            out = generate_scored(
                self.engine,
                self.tokenizer,
                list(prompts) if self.dist.tp_lead else [],
                self.rewards,
                sampling,
                prefill=self.cfg.data.prefill,
                player=self.episodes,
            )
        self.engine.sleep()
        return out

    def _tp_group(self):
        from plugrl.parallel import device_mesh

        return device_mesh(self.dist.device.type, self.dist.tp_size)["tp"].get_group()

    def _collect_rollouts(self, step: int, timer: Timer, metrics: dict[str, float]) -> StepRecord:
        """This step's scored episodes; with DAPO's dynamic sampling (plugrl-dapo) only the groups whose
        ``filter_groups.metric`` varies, refilled from further prompts."""
        seed_base = None if self.cfg.rollout.seed is None else self.cfg.rollout.seed + step * self.dist.dp_size * 1000

        def generate(round_: int) -> StepRecord:
            seed = None if seed_base is None else seed_base + round_ * self.dist.dp_size + self.dist.dp_rank
            return self._generate_and_score(self.batcher.next_batch(), seed, timer)

        if not self.filtering:
            return generate(0)
        want = self.cfg.data.train_batch_size // self.dist.dp_size
        return dynamic_sampling().collect(generate, want, self.cfg, metrics)

    def _token_rewards(self, record: StepRecord, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """[B, T] each episode's score (plus DAPO's overlong penalty, when on) on the last token the policy
        sampled: of its response, of its last turn, or in step-wise runs of its last row (the others get 0)."""
        cfg = self.cfg
        scores = torch.tensor(record.scores, dtype=torch.float32)
        if self.overlong:  # DAPO: a soft penalty over the last tokens before the length limit
            penalty = dynamic_sampling().penalties(record.episodes, cfg)
            scores = scores + penalty
            metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
        token_rewards = torch.zeros_like(batch.response_mask)
        positions = torch.arange(batch.response_mask.shape[1])
        last_token = torch.where(batch.response_mask > 0, positions, -1).max(dim=1).values.clamp(min=0)
        rows = self._last_rows(record)
        token_rewards[rows, last_token[rows]] = scores
        return token_rewards

    @staticmethod
    def _last_rows(record: StepRecord) -> list[int]:
        """[E] the batch row of each episode's last sequence (the row itself, unless step-wise)."""
        last: dict[int, int] = {}
        for k, (i, _) in enumerate(record.rows()):
            last[i] = k
        return [last[i] for i in range(len(record))]

    def _advantages(
        self, record: StepRecord, batch: TrainBatch, token_rewards: torch.Tensor, timer: Timer
    ) -> AdvantageResult:
        """The estimator's advantages (and returns) of the step, set on ``batch``. Step-wise runs estimate over
        each episode's last row (SkyRL's step-wise trajectories) and give every row of an episode the advantage
        of its last row's first token."""
        rows = self._last_rows(record) if record.step_wise else slice(None)
        mask = batch.response_mask[rows]
        inputs = AdvantageBatch(
            token_level_rewards=token_rewards[rows],
            response_mask=mask,
            group_ids=torch.tensor([i // record.n for i in range(len(record))]),
            values=None if batch.old_values is None else batch.old_values[rows],
            prompts=[e.prompt.text for e in record.episodes],
            responses=record.texts,
            context=self._step_context(),
        )
        self._estimator_inputs(record, inputs, timer)
        with timer("advantage"):
            adv = self.estimator.fn(inputs, self.cfg.algorithm)
        if record.step_wise:
            row_episode = torch.tensor([i for i, _ in record.rows()])
            batch.advantages = step_wise_advantages(adv.advantages, mask, row_episode, batch.response_mask)
            batch.returns = None  # no critic in step-wise runs (startup.check_step_wise)
        else:
            batch.advantages = adv.advantages * batch.response_mask
            batch.returns = adv.returns
        return adv

    def _update(self, step: int, record: StepRecord, batch: TrainBatch, timer: Timer, metrics: dict) -> None:
        """The critic's and the policy's PPO epochs over the step's batch."""
        cfg = self.cfg
        if cfg.actor.mask_truncated_completions:  # counted in the advantages, left out of the loss
            batch = batch.select([k for k, (i, _) in enumerate(record.rows()) if not record.episodes[i].truncated])
        num_mini_batches = cfg.data.train_batch_size // cfg.mini_batch_size
        if self.critic is not None:
            with timer("critic_update"):
                metrics.update(
                    self.critic.update(
                        batch,
                        num_mini_batches=num_mini_batches,
                        epochs=cfg.critic.ppo_epochs or cfg.actor.ppo_epochs,
                        norm_length=cfg.data.max_response_length,
                    )
                )
        if step >= cfg.trainer.critic_warmup:  # the critic learns alone for its first warm-up steps
            with timer("update"):
                metrics.update(
                    self.policy.update(
                        batch,
                        num_mini_batches=num_mini_batches,
                        temperature=cfg.rollout.temperature,
                        norm_length=cfg.data.max_response_length,
                        policy_loss=self.policy_loss.fn,
                        rollout_correction=self.correction,
                    )
                )

    def _sync_engine(self) -> None:
        """The rollout engine gets the current policy: its full weights (with LoRA, the adapters merged in) or,
        with rollout.lora_sync=adapter, the adapter alone over the base weights the engine loaded."""
        if self.sync_adapter:
            self.engine.load_adapter(*self.policy.adapter_for_engine())
        else:
            self.engine.load_weights(self.policy.named_full_parameters(self.engine_dtype))

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

    def _estimator_inputs(self, record: StepRecord, inputs: AdvantageBatch, timer: Timer) -> None:
        """The inputs the estimator declared that only the kernel can provide beyond rewards and its critic's values,
        set on ``inputs``: the greedy baselines (``needs_greedy_baseline``, ReMax), generated by the rollout engine."""
        if not self.estimator.needs_greedy_baseline:
            return
        with timer("baseline"):
            inputs.baseline_scores = self._greedy_baseline_scores(record.prompts)
        if self.dist.tp_size > 1:  # one TP group, one set of advantages: the first rank's baselines
            inputs.baseline_scores = broadcast_object(inputs.baseline_scores, self._tp_group())

    def _step_context(self) -> StepContext:
        """The run's services for the estimator (``batch.context``): the registry, and ``share`` over the ranks of a
        tensor-parallel group (the first computes, the others receive: e.g. an LLM's answers, which may differ)."""
        if self.dist.tp_size == 1:
            return StepContext(registry=self.registry)
        group = self._tp_group()
        return StepContext(
            registry=self.registry,
            tp_lead=self.dist.tp_lead,
            tp_broadcast=lambda obj: broadcast_object(obj, group),
        )

    def validate(self, step: int) -> dict[str, float]:
        """Validation metrics (``val/...``) at ``step``; samples go to validation/step_N.jsonl."""
        sampling = sampling_settings(self.cfg, "validate")
        t0 = time.perf_counter()
        with self.rewards.scoring_round():  # every rank validates (its share may be empty): one round on each
            metrics, rows = validate(
                self.engine,
                self.tokenizer,
                self.val_prompts,
                self.rewards,
                sampling,
                prefill=self.cfg.data.prefill,
                threshold=self.cfg.trainer.val_correct_threshold,
                player=self.episodes,
            )
        if not self.val_prompts:  # an empty share: the mean over ranks is the other ranks' (mean_metrics skips it)
            metrics = {k: v for k, v in metrics.items() if not k.startswith("val/")}
        metrics["timing/validate"] = time.perf_counter() - t0
        everyone = gather_objects(rows if self.dist.tp_lead else [])  # a TP group's ranks hold the same rows
        if self.dist.is_main:
            out = self.run_dir / "validation"
            out.mkdir(parents=True, exist_ok=True)
            rows = [row for part in everyone for row in part]
            with open(out / f"step_{step:06d}.jsonl", "w") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str) + "\n")
            self._hand_on_samples(step, rows, validation=True)
        return mean_metrics(metrics)

    def _greedy_baseline_scores(self, prompts: list[EncodedPrompt]) -> torch.Tensor | None:
        """[B] the reward of one greedy episode per prompt (a greedy response, or a whole multi-turn episode),
        repeated for its n samples (ReMax); None on the later ranks of a tensor-parallel group, which join the
        engine with no prompts and receive the first rank's baseline."""
        greedy = sampling_settings(self.cfg, "greedy")
        lead = self.dist.tp_lead
        _, _, scored = self._play(prompts, greedy)
        if not lead:
            return None
        return torch.tensor(scored.scores, dtype=torch.float32).repeat_interleave(self.cfg.rollout.n)

    # ------------------------------------------------------------------------------------------
    def _make_batch(self, record: StepRecord) -> TrainBatch:
        """The step's sequences (:meth:`StepRecord.rows`); those with the same prompt tokens share them in the
        packed forward (a group's episodes, unless an environment started them differently)."""
        indexed = record.rows()
        rows = [r for _, r in indexed]
        made: dict[int, Any] = {}  # each prompt's pixel inputs made once: a group's rows share them
        pixels = []
        for i, _ in indexed:
            prompt = record.episodes[i].prompt
            if id(prompt) not in made:
                made[id(prompt)] = prompt.pixels
            pixels.append(made[id(prompt)])
        # rows share prompt tokens where they share the prompt; image prompts also need the same images
        shared: dict[tuple, int] = {}
        batch = TrainBatch.from_sequences(
            [list(r.prompt_ids) + list(r.response_ids) for r in rows],
            [len(r.prompt_ids) for r in rows],
            policy_masks=[r.policy_mask for r in rows],
            group_ids=[
                shared.setdefault((tuple(r.prompt_ids), id(px) if px is not None else None), len(shared))
                for r, px in zip(rows, pixels, strict=True)
            ],
            pixels=pixels if any(px is not None for px in pixels) else None,
        )
        if self.correction is not None:
            batch.rollout_logprobs = self._rollout_logprobs(rows, batch.response_mask)
        return batch

    def _rollout_logprobs(self, rows: list, mask: torch.Tensor) -> torch.Tensor:
        """[B, T] the engine's log-prob of each response token (``Rollout.logprobs``; a multi-turn episode's hold
        0.0 where a tool or an environment wrote), 0 on padding and wherever ``mask`` is 0."""
        out = torch.zeros_like(mask)
        for i, r in enumerate(rows):
            if r.logprobs is None or len(r.logprobs) != len(r.response_ids):
                got = "none" if r.logprobs is None else f"{len(r.logprobs)} for {len(r.response_ids)} tokens"
                raise TrainingError(
                    f"algorithm.rollout_correction.mode={self.correction.mode} needs the engine's log-prob of every "
                    f"response token, but a rollout of this step has {got} (rollout.name={self.cfg.rollout.name}, "
                    "rollout.calculate_log_probs must be true); set algorithm.rollout_correction.mode=off to train "
                    "without the correction"
                )
            if r.logprobs:
                out[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=out.dtype)
        return torch.where(mask != 0, out, torch.zeros((), dtype=out.dtype))

    def _rollout_metrics(self, record: StepRecord, timer: Timer) -> dict[str, float]:
        # per episode (a step-wise run's batch holds each episode's turns as rows)
        rlens = torch.tensor([len(e.rollout.response_ids) for e in record.episodes], dtype=torch.float32)
        prompt_tokens = float(sum(len(e.rollout.prompt_ids) for e in record.episodes))
        response_tokens = float(rlens.sum())
        # throughput counts every data-parallel rank's tokens (the ranks of a TP group hold the same ones)
        p_all, r_all = (x / self.dist.tp_size for x in all_reduce([prompt_tokens, response_tokens]))
        m = dict(record.reward_metrics)
        ended = rlens[[not e.truncated for e in record.episodes]]  # stopped on their own (EOS, a stop string)
        ended = ended if len(ended) else torch.zeros(1)  # none: 0, as TRL logs it
        m.update(
            {
                "response_length/mean": float(rlens.mean()),
                "response_length/max": float(rlens.max()),
                "response_length/min": float(rlens.min()),
                "response_length/terminated_mean": float(ended.mean()),
                "response_length/terminated_max": float(ended.max()),
                "response_length/terminated_min": float(ended.min()),
                "response_length/clip_ratio": sum(e.truncated for e in record.episodes) / len(record),
                "prompt_length/mean": prompt_tokens / len(record),
                "perf/tokens_per_s": (p_all + r_all) / timer.times["step"],
                "perf/rollout_tokens_per_s": r_all / max(timer.times["generate"], 1e-9),
            }
        )
        if timer.times.get("update"):
            m["perf/train_tokens_per_s"] = (p_all + r_all) / timer.times["update"]
        if self.episodes is not None:
            m.update(conversation_metrics([e.conversation for e in record.episodes]))
        return m

    def _log_samples(self, step: int, record: StepRecord) -> None:
        keep, hooks = self.cfg.trainer.save_rollouts, self.registry.hooks
        if not keep and not (hooks is not None and hooks.plugrl_samples.get_hookimpls()):
            return
        rows = [
            {
                "prompt": e.prompt.text,
                "completion": e.text,
                "data_source": e.prompt.sample.data_source,
                "ground_truth": e.prompt.sample.ground_truth,
                "reward": e.score,
                "details": e.details,
                "finish_reason": e.rollout.finish_reason,
                **({} if e.conversation is None else conversation_row(e.conversation, e.rollout, self.tokenizer)),
            }
            for e in record.episodes
        ]
        everyone = gather_objects(rows if self.dist.tp_lead else [])  # a TP group's ranks hold the same rows
        if self.dist.is_main:
            rows = [row for part in everyone for row in part]
            if keep:
                self.tracker.log_samples(step, rows)
            self._hand_on_samples(step, rows, validation=False)

    def _hand_on_samples(self, step: int, rows: list[dict[str, Any]], *, validation: bool) -> None:
        """Rank 0: the step's samples to the plugins' ``plugrl_samples`` (plugrl-compat writes verl's dumps)."""
        should = "it must hand on the samples or do nothing"
        kwargs = {"config": self.cfg, "run_dir": self.run_dir, "step": step, "rows": rows, "validation": validation}
        for _ in call_hook(self.registry, "plugrl_samples", should, **kwargs):
            pass

    # ------------------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        self.ahead.settle()  # the rollout thread takes batches: none may be in flight
        state = {"data": self.batcher.state_dict(), "world_size": self.dist.world_size, "kl_coef": self.kl_coef}
        state[RECORD_KEY] = run_identity(self.cfg)  # what the checkpoint was made with (resume_check.resume_problem)
        path = checkpoint.save_checkpoint(
            self.run_dir,
            step,
            self.policy,
            self.processor or self.tokenizer,  # a VLM's processor saves its tokenizer with its image settings
            state,
            keep=self.cfg.trainer.max_checkpoints,
            rank=self.dist.rank,
            critic=self.critic,
            rollouts_ahead=self.ahead.pending(),
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
        if mode != "auto" and self.dist.is_main:  # a checkpoint named by path: resumed as asked, differences said
            warn_named(self.cfg, ckpt)
        # rank 0 alone reads the weights and optimizer state, and broadcasts them into every rank's shards
        state = checkpoint.load_checkpoint(ckpt, self.policy, self.dist.rank, critic=self.critic)
        self.batcher.load_state_dict(state["data"])  # with rollouts generated ahead, past the batches they used
        self.ahead.restore(checkpoint.load_rollouts_ahead(ckpt, self.dist.rank, self.dist.world_size))
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        if self.dist.is_main:
            log.info("resumed from %s at step %d", ckpt, state["step"])
        return int(state["step"])


def train(cfg: Config) -> dict[str, Any]:
    """Run a whole training job; returns the tracker's summary."""
    summary = Trainer(cfg).train()
    shutdown()
    return summary
