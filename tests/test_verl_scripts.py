"""verl's example scripts, run as a verl user runs them: ``plugrl train`` with the script's overrides and no config
file. The scripts are written here in verl's spelling (GRPO, GRPO with LoRA, PPO with a critic, RLOO, REINFORCE++,
the DAPO recipe with both of verl's overlong-buffer spellings), with the sizes cut to a 135M model on a CPU and the
model and data paths pointing at local files: every key passes ``plugrl train --check`` with a fate, and the GRPO
and DAPO scripts train a step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fixture_paths import GSM8K_FIXTURE
from plugrl import cli

MODEL = "local:SmolLM2-135M-Instruct"


def _gsm8k_parquet(tmp_path: Path, split: str) -> Path:
    """verl's GSM8K rows (examples/data_preprocess/gsm8k.py's layout) from the repository's 16-row fixture."""
    rows = []
    for i, line in enumerate((GSM8K_FIXTURE / f"{split}.jsonl").read_text().splitlines()):
        item = json.loads(line)
        question = item["question"] + ' Let\'s think step by step and output the final answer after "####".'
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": item["answer"].split("####")[-1].strip()},
                "extra_info": {"split": split, "index": i},
            }
        )
    path = tmp_path / f"gsm8k_{split}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _dapo_parquet(tmp_path: Path, name: str, n: int = 16) -> Path:
    """DAPO-Math-17k's layout (data_source math_dapo, the answer after "Answer:"), with sums written here."""
    rows = []
    for i in range(n):
        a, b = 3 + i, 11 + 2 * i
        content = (
            "Solve the following math problem step by step. The last line of your response should be of the form "
            f"Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is {a} + {b}?\n\n"
            'Remember to put your answer on its own line after "Answer:".'
        )
        rows.append(
            {
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": content}],
                "ability": "MATH",
                "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": str(a + b)},
                "extra_info": {"index": str(i)},
            }
        )
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _gsm8k_data_and_actor(train: Path, test: Path) -> list[str]:
    """The lines verl's GSM8K example scripts (GRPO, PPO) open with: the data, the model, the actor's batches."""
    return [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.max_response_length=24",
        "data.filter_overlong_prompts=True",
        "data.truncation='error'",
        f"actor_rollout_ref.model.path={MODEL}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]


def grpo_script(train: Path, test: Path, out: Path, estimator: str = "grpo") -> list[str]:
    """The shape of verl's examples/grpo_trainer scripts (RLOO and REINFORCE++ differ in the estimator)."""
    return [
        f"algorithm.adv_estimator={estimator}",
        *_gsm8k_data_and_actor(train, test),
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console']",
        f"trainer.project_name=verl_{estimator}_example_gsm8k",
        "trainer.experiment_name=smollm2_function_rm",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
        f"trainer.default_local_dir={out}",
    ]


def lora_script(train: Path, test: Path, out: Path) -> list[str]:
    """verl's GRPO LoRA script: the GRPO keys plus the adapter's and the engine's LoRA loading keys."""
    return [
        *grpo_script(train, test, out),
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear",
        "actor_rollout_ref.model.use_shm=True",
        "actor_rollout_ref.rollout.load_format=safetensors",
        "actor_rollout_ref.rollout.layered_summon=True",
    ]


def ppo_script(train: Path, test: Path, out: Path) -> list[str]:
    """verl's examples/ppo_trainer shape: GAE with a critic of its own (no estimator key: verl's default, gae)."""
    return [
        *_gsm8k_data_and_actor(train, test),
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True",
        f"critic.model.path={MODEL}",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.model.fsdp_config.param_offload=False",
        "critic.model.fsdp_config.optimizer_offload=False",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console']",
        "trainer.project_name=verl_example_gsm8k",
        "trainer.experiment_name=smollm2_critic",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
        f"trainer.default_local_dir={out}",
    ]


def dapo_script(train: Path, test: Path, out: Path, overlong: str) -> list[str]:
    """The DAPO recipe's keys: dynamic sampling on acc over a larger generation batch, decoupled clip, token-level
    loss, the soft overlong penalty in one of verl's two spellings (``reward_kwags``: verl's current reward
    manager's; ``legacy``: the recipe's older ``reward_model.overlong_buffer``)."""
    if overlong == "reward_kwargs":
        penalty = [
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=8",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
            "+reward_model.reward_kwargs.max_resp_len=24",
        ]
    else:
        penalty = [
            "reward_model.overlong_buffer.enable=True",
            "reward_model.overlong_buffer.len=8",
            "reward_model.overlong_buffer.penalty_factor=1.0",
        ]
    return [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.prompt_key=prompt",
        "data.truncation='left'",
        "data.max_prompt_length=256",
        "data.max_response_length=24",
        "data.gen_batch_size=6",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "actor_rollout_ref.model.use_remove_padding=True",
        "+actor_rollout_ref.model.override_config.max_position_embeddings=8192",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=2048",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=2048",
        f"actor_rollout_ref.model.path={MODEL}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
        "actor_rollout_ref.actor.optim.weight_decay=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.80",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.rollout.max_num_batched_tokens=280",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
        "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
        "actor_rollout_ref.ref.fsdp_config.param_offload=False",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra']",
        "reward_model.reward_manager=dapo",
        *penalty,
        "trainer.logger=['console']",
        "trainer.project_name=DAPO",
        "trainer.experiment_name=DAPO-SmolLM2-135M",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.val_before_train=True",
        "trainer.test_freq=5",
        "trainer.save_freq=5",
        "trainer.total_epochs=1",
        f"trainer.default_local_dir={out}",
        "trainer.resume_mode=auto",
        "trainer.log_val_generations=2",
    ]


def _scripts(tmp_path: Path) -> dict[str, list[str]]:
    train, test = _gsm8k_parquet(tmp_path, "train"), _gsm8k_parquet(tmp_path, "test")
    dapo_train, dapo_test = _dapo_parquet(tmp_path, "dapo_math"), _dapo_parquet(tmp_path, "aime_2024", 4)
    out = tmp_path / "ckpts"
    return {
        "grpo": grpo_script(train, test, out),
        "grpo_lora": lora_script(train, test, out),
        "ppo": ppo_script(train, test, out),
        "rloo": grpo_script(train, test, out, "rloo"),
        "reinforce_plus_plus": grpo_script(train, test, out, "reinforce_plus_plus"),
        "dapo": dapo_script(dapo_train, dapo_test, out, "reward_kwargs"),
        "dapo_legacy_overlong": dapo_script(dapo_train, dapo_test, out, "legacy"),
    }


def _check(script: list[str], capsys) -> str:
    code = cli.main(["train", "--check", *script])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


@pytest.mark.parametrize(
    "name", ["grpo", "grpo_lora", "ppo", "rloo", "reinforce_plus_plus", "dapo", "dapo_legacy_overlong"]
)
def test_each_verl_script_passes_the_check_with_every_key_accounted_for(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    script = _scripts(tmp_path)[name]
    out = _check(script, capsys)
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    typed = {o.lstrip("+").split("=", 1)[0] for o in script}
    assert {line.split()[0].split("=", 1)[0] for line in lines} == typed  # one line per key, as typed
    assert "REFUSED" not in out
    assert "check: ok" in out


def test_the_check_reports_what_each_key_became(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = _check(_scripts(tmp_path)["dapo"], capsys)
    fate = {line.split()[0].split("=", 1)[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "-> reward.overlong_buffer.len" in fate["reward_model.reward_kwargs.overlong_buffer_cfg.len"]
    assert "-> actor.optim.warmup_steps" in fate["actor_rollout_ref.actor.optim.lr_warmup_steps"]
    assert "not acted on: plugrl makes micro-batches" not in fate["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    assert "not acted on" in fate["actor_rollout_ref.actor.checkpoint.save_contents"]
    assert "not acted on" in fate["reward_model.reward_kwargs.max_resp_len"]
    assert (
        "-> model.override_config.max_position_embeddings"
        in fate["actor_rollout_ref.model.override_config.max_position_embeddings"]
    )
    assert "plugins: advantages, verl_default" in out
    assert re.search(r"run directory: .*ckpts", out)


def test_the_ppo_script_trains_a_critic_by_verls_default_estimator(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = _check(_scripts(tmp_path)["ppo"], capsys)
    assert "estimator: gae (advantages)" in out


def test_a_dapo_metric_the_rewards_never_return_is_found_by_the_check(tmp_path, capsys, monkeypatch):
    """filter_groups.metric names a field verl's GSM8K scorer (a number) never returns: the check fails at start,
    not the run at step 1 after the model loaded."""
    monkeypatch.chdir(tmp_path)
    script = [*_scripts(tmp_path)["grpo"], "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=pred"]
    code = cli.main(["train", "--check", *script])
    out = capsys.readouterr().out
    assert code == 2 and "algorithm.filter_groups.metric is 'pred'" in out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "dapo"])
def test_the_grpo_and_dapo_scripts_train_a_step(tmp_path, capsys, monkeypatch, name, tiny_model):
    """The script as the check passed it, plus the cuts of a test: one step, no validation before it, and the tiny
    random llama with SmolLM2's tokenizer for the model (what is tested is that the keys drive a real step)."""
    monkeypatch.chdir(tmp_path)
    model = f"actor_rollout_ref.model.path={MODEL}"
    script = [f"actor_rollout_ref.model.path={tiny_model}" if k == model else k for k in _scripts(tmp_path)[name]]
    assert model not in script
    cut = ["trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.save_freq=-1"]
    assert cli.main(["train", *script, *cut]) == 0
    run = tmp_path / "ckpts"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert not (run / "checkpoints").exists()  # save_freq=-1: verl saves nothing
    if name == "dapo":
        assert metrics[0]["dapo/gen_rounds"] >= 1 and "reward/overlong_penalty_mean" in metrics[0]
