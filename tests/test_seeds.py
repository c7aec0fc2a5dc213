"""The four documents plugrl's users come from (a creativity-weighted GRPO fork of verl, a single-file countdown
trainer, TinyV's rubric/verifier rewards on verl, TRL's GRPO math guide), each run from its own command or
config (issue 18, point 11): "each document's own command or config (paths to local files, the tiny model) runs
one step, and the resolved config shows the document's algorithm, estimator, reward mode and hyperparameters."

Each test takes the document's keys as the document writes them and replaces only what cannot run here, each
replacement marked where it is made:

- model paths: the tiny model (a 2-layer random llama with SmolLM2's tokenizer, 2048 positions);
- data paths: small files written into tmp_path from rows built here or from the repository's fixtures;
- GPU counts and sizes, steps and lengths: ``trainer.total_steps=1``, one process, ``rollout.name=hf``,
  ``model.dtype=float32``, 16 response tokens (a random model writes every token it may), batch sizes shrunk
  where the document's would take minutes (the document's ratios kept where they can be);
- servers on the internet or on GPUs: local stand-ins on 127.0.0.1 (``StandInOpenAI`` of tests/stand_in_openai.py,
  answering every chat request with one reply and listing the models given, with their ``max_model_len``), for
  OpenAI's API (document 000's solution classifier) and for the ``vllm serve`` verifier document 003 starts beside
  training.

Where plugrl refuses a document's settings on purpose, the test asserts the refusal first, then runs with the
smallest fix. Everything else is real: the ``plugrl train`` command (``plugrl.cli.main``, in this process), the
trainer, the tokenizer, the reward plugins, the classifier and verifier clients.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import yaml

from fixture_paths import GSM8K_FIXTURE
from plugrl.config import load_config
from plugrl_tinyv.readiness import PROBE_ANSWER
from stand_in_openai import StandInOpenAI

ROOT = Path(__file__).resolve().parent.parent
TINYZERO_ROWS = ROOT / "tests" / "fixtures" / "countdown_tinyzero" / "tinyzero_rows.py"
RESPONSE_TOKENS = 16  # every document's max_response_length / max_completion_length, shrunk (see above)


# ============================================================================================ helpers


def plugrl_train(args: list[str], capsys) -> tuple[int, str]:
    """``plugrl train ARGS`` in this process: the exit status and what it wrote to stderr."""
    from plugrl.cli import main

    capsys.readouterr()
    code = main(["train", *args])
    return code, capsys.readouterr().err


def train_ok(args: list[str], capsys) -> None:
    code, err = plugrl_train(args, capsys)
    assert code == 0, f"plugrl train failed ({code}):\n{err[-4000:]}"


def resolved(run_dir: Path) -> dict:
    """The config the run resolved and ran with, as the trainer keeps it in the run directory."""
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def step_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rollouts(run_dir: Path, step: int = 1) -> list[dict]:
    path = run_dir / "rollouts" / f"step_{step:06d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def routes(config: dict, data_sources: list[str]) -> dict[str, list[str]]:
    """The reward functions (sorted by name) each data_source is routed to by the run's resolved config (its
    plugins, and ``reward.default``), as the kernel routes them."""
    from plugrl.config import build_config
    from plugrl.plugins import check_config, load_plugins
    from plugrl.rewards.routing import rewards_for

    cfg = build_config(config)
    registry = load_plugins(cfg.plugins)
    check_config(cfg, registry)  # sets reward.default on the registry, as at a run's start
    return {ds: sorted(r.name for r in rewards_for(registry, ds)) for ds in data_sources}


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def verl_row(data_source: str, question: str, ground_truth: str, index: int, split: str = "train") -> dict:
    """A row as verl's preprocessing scripts write them: chat prompt, ``reward_model.ground_truth``, extra_info."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "question": question},
    }


def gsm8k_verl_parquet(path: Path, split: str, n: int) -> Path:
    """``n`` rows of the repository's GSM8K fixture, written as verl's gsm8k preprocessing writes them."""
    from plugrl_gsm8k.dataset import INSTRUCTION  # verl's instruction after the question

    raw = [json.loads(line) for line in (GSM8K_FIXTURE / f"{split}.jsonl").read_text().splitlines()][:n]
    rows = [
        verl_row(
            "openai/gsm8k",
            f"{r['question']} {INSTRUCTION}",
            r["answer"].split("####")[-1].strip().replace(",", ""),
            i,
            split,
        )
        for i, r in enumerate(raw)
    ]
    return write_parquet(path, rows)


# ============================================================================================ 000: verl fork


# The strategy groups the classifier's stand-in gives the 8 responses of every prompt: methods shared by 4, 2, 1
# and 1 responses. grpo_weighted_mul weighs a response 1 / freq^0.7 (the fork's power).
GROUPS_000 = [0, 0, 0, 0, 1, 1, 2, 3]
WEIGHTS_000 = [GROUPS_000.count(g) ** -0.7 for g in GROUPS_000]
RUN_000 = "qwen2.5_3b_instruct_creativity_training_grpo_weighted_mul_testing"  # the document's experiment name


def doc000_command(model: Path, mini_batch: int = 64) -> list[str]:
    """creativity_train.sh's keys, in the order and spelling of the document's parameter list."""
    return [
        "algorithm.adv_estimator=grpo_weighted_mul",
        "data.train_batch_size=4",
        "data.val_batch_size=8",
        "data.max_prompt_length=1024",  # the document: 4096, over the tiny model's 2048 positions
        f"data.max_response_length={RESPONSE_TOKENS}",  # the document: 1024
        f"actor_rollout_ref.model.path={model}",  # the document: Qwen/Qwen2.5-3B-Instruct
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.optim.lr=5e-7",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size=8",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=0.95",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
        "trainer.n_gpus_per_node=1",  # the document: 2
        "trainer.nnodes=1",
        "trainer.project_name='Creativity'",
        "trainer.save_freq=10",
        "trainer.test_freq=80",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.grad_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        f"trainer.experiment_name={RUN_000}",
    ]


def test_000_creativity_weighted_grpo_verl_command(tiny_model, tmp_path, capsys, caplog, monkeypatch):
    """Document 000 (creativity-weighted GRPO on a verl fork): its dotted verl keys as written. plugrl, like verl,
    refuses data.train_batch_size=4 with ppo_mini_batch_size=64; with the mini-batch at 4 the run trains one
    step of grpo_weighted_mul with k3 KL loss (coef 0.001), lr 5e-7, n=8, temperature 1.0, top_p 0.95, and the
    default solution classifier (openai, gpt-4o-mini, key from OPENAI_API_KEY), whose server here is a stand-in
    for api.openai.com on 127.0.0.1 (algorithm.classifier_options.base_url) that groups each prompt's 8 responses
    as GROUPS_000. The rows are verl's GSM8K parquet (openai/gsm8k -> gsm8k_reward), as verl routes them."""
    base = tmp_path / "verl.yaml"
    base.write_text("plugins: [gsm8k, advantages]   # what verl's default_compute_score hard-codes for these rows\n")
    train = gsm8k_verl_parquet(tmp_path / "train.parquet", "train", 8)
    val = gsm8k_verl_parquet(tmp_path / "test.parquet", "test", 2)
    key = "sk-stand-in-000-not-a-real-key"
    monkeypatch.setenv("OPENAI_API_KEY", key)  # the document: required for the GPT-4 solution classification
    with StandInOpenAI(json.dumps({"groups": GROUPS_000}), models={"gpt-4o-mini": None}) as openai_api:
        local = [
            f"data.train_files={train}",  # the script's own data files, not in the document
            f"data.val_files={val}",
            "actor_rollout_ref.rollout.name=hf",  # verl's rollout: vLLM on GPUs
            "model.dtype=float32",
            "trainer.total_steps=1",
            f"trainer.output_dir={tmp_path}",  # the document: ckpt/${EXPERIMENT_NAME}
            f"algorithm.classifier_options.base_url={openai_api.base_url}",  # the document: OpenAI's API
        ]
        # as written: verl's own rule, in verl's words, stops the run before anything loads
        code, err = plugrl_train([str(base), *doc000_command(tiny_model), *local], capsys)
        assert code == 2
        said = "data.train_batch_size (4) must be >= actor_rollout_ref.actor.ppo_mini_batch_size (64), as verl requires"
        assert said in err
        assert not openai_api.requests and not (tmp_path / RUN_000).exists()

        # the smallest fix: a mini-batch no larger than the batch (the document's step 2 raises both instead)
        with caplog.at_level(logging.WARNING, logger="plugrl.startup"):
            train_ok([str(base), *doc000_command(tiny_model, mini_batch=4), *local], capsys)
        requests = list(openai_api.requests)

    run = tmp_path / RUN_000
    cfg = resolved(run)
    assert cfg["algorithm"]["adv_estimator"] == "grpo_weighted_mul"
    assert cfg["algorithm"]["weight_power"] == 0.7  # the fork's hard-coded power
    assert cfg["algorithm"]["classifier"] == "openai" and "classifier_openai" in cfg["plugins"]
    options = cfg["algorithm"]["classifier_options"]
    assert (options["model"], options["api_key_env"], options["base_url"]) == (
        "gpt-4o-mini",
        "OPENAI_API_KEY",
        openai_api.base_url,
    )
    actor, rollout, data, trainer = cfg["actor"], cfg["rollout"], cfg["data"], cfg["trainer"]
    assert (actor["optim"]["lr"], actor["use_kl_loss"], actor["kl_loss_coef"], actor["kl_loss_type"]) == (
        5e-7,
        True,
        0.001,
        "low_var_kl",
    )
    assert actor["ppo_mini_batch_size"] == 4 and data["train_batch_size"] == 4
    assert (rollout["n"], rollout["temperature"], rollout["top_p"], rollout["gpu_memory_utilization"]) == (
        8,
        1.0,
        0.95,
        0.8,
    )
    assert (data["max_prompt_length"], data["max_response_length"]) == (1024, RESPONSE_TOKENS)
    assert cfg["model"]["enable_gradient_checkpointing"] is True and cfg["model"]["use_remove_padding"] is True
    fsdp = actor["fsdp_config"]
    assert (fsdp["param_offload"], fsdp["optimizer_offload"]) == (False, False)
    assert (trainer["project_name"], trainer["save_freq"], trainer["test_freq"]) == ("Creativity", 10, 80)
    assert routes(cfg, ["openai/gsm8k"]) == {"openai/gsm8k": ["gsm8k_reward"]}
    # the verl keys plugrl accepts and does not act on are named once at start, with what it does instead
    said = " ".join(r.getMessage() for r in caplog.records if "not acted on" in r.getMessage())
    for dropped in (
        "data.val_batch_size",
        "actor_rollout_ref.actor.ppo_micro_batch_size",
        "actor_rollout_ref.actor.fsdp_config.grad_offload",
        "trainer.n_gpus_per_node",
    ):
        assert dropped in said, said

    (m,) = step_metrics(run)
    assert m["step"] == 1 and 0.0 <= m["reward/gsm8k_reward/mean"] <= 1.0
    assert "actor/kl_loss" in m
    # every prompt's 8 responses were classified by the stand-in, and weighted by the groups it gave
    assert len(requests) == 4  # one per prompt
    assert {r["body"]["model"] for r in requests} == {"gpt-4o-mini"} and {r["auth"] for r in requests} == {
        f"Bearer {key}"
    }
    assert m["classifier/failures"] == 0.0 and m["creativity/groups_mean"] == 4.0
    assert m["creativity/weight_mean"] == pytest.approx(sum(WEIGHTS_000) / 8, rel=1e-5)
    assert m["creativity/weight_min"] == pytest.approx(4**-0.7, rel=1e-5) and m["creativity/weight_max"] == 1.0
    # test_freq=80 validates at the last step, as verl does; save_freq=10 saves at the last step
    assert any(k.startswith("val/") for k in m), sorted(m)
    assert (run / "checkpoints" / "step_000001" / "policy" / "config.json").is_file()


# ============================================================================================ 002: single file


def _tinyzero_rows():
    spec = importlib.util.spec_from_file_location("tinyzero_rows", TINYZERO_ROWS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The single-file trainer's settings as the plugrl config plugins/datasets_countdown/README.md ("Your own files")
# writes them: its rows (`messages`, `target`, `nums`; no data_source, no ground truth), its chat template off
# (ChatML by hand) with its assistant opening, GRPO, and the entropy bonus its takeaways add against collapse.
DOC002_CONFIG = """\
plugins: [countdown, advantages]
model: {{path: {model}}}
data:
  train_files: {rows}
  prompt_key: messages          # ex["messages"]
  data_source: countdown        # its reward_fn: countdown's answer check, from the row's target and nums
  apply_chat_template: false    # config.apply_chat_template false: the prompt is ChatML written by hand
  prefill: "Let me solve this step by step.\\n<think>"
actor:
  entropy_coeff: 0.001          # the entropy bonus (the document names no value)
algorithm:
  adv_estimator: grpo
"""


def test_002_single_file_countdown_trainer(tiny_model, tmp_path, capsys):
    """Document 002 (a single-file GRPO trainer on countdown): TinyZero's raw rows (`messages`, `target`, `nums`),
    chat template off with its ChatML written by hand and the assistant's opening, GRPO with an entropy bonus.
    The config's keys show in the resolved config; one step's prompts are exactly the hand-written ChatML, and
    countdown_reward scores every completion from the row's own target and nums (no ground truth, no errors)."""
    tz = _tinyzero_rows()
    rows = tz.write(tmp_path)["rows.jsonl"]
    config = tmp_path / "single_file.yaml"
    config.write_text(DOC002_CONFIG.format(model=tiny_model, rows=rows))
    train_ok(
        [
            str(config),
            # the document's `torchrun --nproc_per_node=4` with SGLang rollouts: one process and the HF engine here
            "rollout.name=hf",
            "model.dtype=float32",
            "data.train_batch_size=4",  # the fixture's 4 problems, each sampled rollout.n=8 times (plugrl's default)
            f"data.max_response_length={RESPONSE_TOKENS}",
            "trainer.total_steps=1",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=single_file",
        ],
        capsys,
    )
    run = tmp_path / "single_file"
    cfg = resolved(run)
    assert cfg["algorithm"]["adv_estimator"] == "grpo" and cfg["actor"]["entropy_coeff"] == 0.001
    data = cfg["data"]
    assert (data["prompt_key"], data["data_source"], data["apply_chat_template"]) == ("messages", "countdown", False)
    assert data["prefill"] == "Let me solve this step by step.\n<think>"
    assert routes(cfg, ["countdown"]) == {"countdown": ["countdown_reward"]}

    (m,) = step_metrics(run)
    assert m["step"] == 1 and m["reward/errors"] == 0.0 and 0.0 <= m["reward/countdown_reward/mean"] <= 1.0
    assert "actor/entropy" in m
    samples = rollouts(run)
    assert len(samples) == 4 * 8
    chatml = {
        "".join(f"<|im_start|>{msg['role']}\n{msg['content']}<|im_end|>\n" for msg in row["messages"])
        + "<|im_start|>assistant\nLet me solve this step by step.\n<think>"
        for row in tz.raw_rows()
    }
    assert {s["prompt"] for s in samples} == chatml
    for s in samples:
        assert s["ground_truth"] is None and s["data_source"] == "countdown"
        assert s["details"]["countdown_reward"] in (0.0, 0.1, 1.0) and not s["details"]["error"]


# ============================================================================================ 003: TinyV on verl


VERIFIER = "rubric-model"  # the document: VERIFIER_MODEL, "rubric model path", served under that name
SCORE_003 = 0.7  # the verifier stand-in grades every answer 7/10
TINYV_QUESTIONS = [
    ("What is 7 + 5?", "12"),
    ("What is 9 * 3?", "27"),
    ("What is 20 - 6?", "14"),
    ("What is 8 / 2?", "4"),
]


def doc003_rows(tmp_path: Path) -> tuple[Path, Path]:
    """train_polaris.parquet: rows for every route of the fork's default_compute_score (`*_tinyv*` to the
    verifier, `openai/gsm8k`, `grade`, and `polaris`, which no route names: the default, Prime Math), and
    test_math.parquet (data_source math)."""
    train = [verl_row("polaris_tinyv", q, a, i) for i, (q, a) in enumerate(TINYV_QUESTIONS)]
    train.append(verl_row("openai/gsm8k", "Tom has 3 apples and buys 4 more. How many apples has he?", "7", 4))
    train.append(
        verl_row(
            "grade",
            "Grade the answer 12 to 'What is 7 + 5?' (reference 12). End with a line 'Total Score: x/10'.",
            "1.0",
            5,
        )
    )
    train.append(verl_row("Grade", "Grade the answer 13 to 'What is 7 + 5?' (reference 12).", "0.0", 6))
    train.append(verl_row("polaris", "What is 6 + 6?", "12", 7))
    val = [verl_row("math", q, a, i, "test") for i, (q, a) in enumerate(TINYV_QUESTIONS[:2])]
    return write_parquet(tmp_path / "train_polaris.parquet", train), write_parquet(tmp_path / "test_math.parquet", val)


# What TinyV's fork hard-codes in its reward code, in plugrl's keys: the routes of default_compute_score (plugins;
# the last branch, Prime Math, is reward.default), and where its verifier is served (VERIFIER_MODEL on
# http://localhost:8000 by `vllm serve`: here the stand-in's port), a rubric reward model.
DOC003_BASE = """\
plugins: [gsm8k, grade, tinyv, math, advantages]
reward:
  default: math_accuracy
  options:
    tinyv: {{model: {verifier}, base_url: "{base_url}", template: rubric}}
"""


def doc003_command(model: Path, saved_dir: Path, run_name: str, train: Path, val: Path) -> list[str]:
    """run_rubric.sh's `python3 -m verl.trainer.main_ppo` keys, as written, its variables at their defaults
    (NO_ENTROPY_LOSS_AND_KL=True, VERIFIER_SETUP=tinyv_only, VERIFIER_WEIGHT=1.0, MAX_EPOCHS=12)."""
    return [
        "algorithm.use_kl_in_reward=FALSE",
        f"data.train_files={train}",  # the document: /data/train_polaris.parquet
        f"data.val_files={val}",  # the document: data/test_math.parquet
        "data.train_batch_size=8",  # ROLLOUT_BATCH_SIZE=512: 8 x 8 responses, ...
        "data.max_prompt_length=1024",
        f"data.max_response_length={RESPONSE_TOKENS}",  # MAX_RESPONSE_LEN=4096
        "data.filter_overlong_prompts=True",
        "data.truncation='error'",
        f"actor_rollout_ref.model.path={model}",  # MODEL_PATH
        "actor_rollout_ref.actor.optim.lr=5e-7",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",  # ... PPO_MINI_BATCH_SIZE=64: 512 / 64 = 8 mini-batches
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=15360",  # 3 x (1024 + 4096)
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.use_kl_loss=FALSE",
        "actor_rollout_ref.actor.kl_loss_coef=0.000",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.name=hf",  # the document: vllm
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
        "actor_rollout_ref.rollout.max_num_batched_tokens=5120",  # 1 x (1024 + 4096)
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.ref.fsdp_config.param_offload=False",
        f"+trainer.rollout_data_dir={saved_dir}",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "critic.optim.lr=9e-6",
        f"critic.model.path={model}",
        "critic.model.use_remove_padding=True",
        "critic.ppo_max_token_len_per_gpu=24000",
        "critic.forward_max_token_len_per_gpu=36000",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','wandb']",
        "trainer.project_name='TinyV-0429'",
        f"trainer.experiment_name={run_name}",
        "trainer.nnodes=1",
        f"trainer.default_local_dir={saved_dir}",
        "trainer.n_gpus_per_node=1",  # GPUS_PER_NODE: the GPUs of CUDA_VISIBLE_DEVICES
        "trainer.save_freq=10",
        "trainer.test_freq=2",
        f"trainer.validation_data_dir={saved_dir}",
        "trainer.resume_mode=auto",
        "trainer.total_epochs=12",
        "reward_model.reward_manager=prime",
        "reward_model.tinyv_setup=tinyv_only",
        "reward_model.tinyv_weight=1.0",
    ]


@pytest.mark.slow
def test_003_tinyv_rubric_rewards_verl_ppo_command(tiny_model, tmp_path, capsys, monkeypatch):
    """Document 003 (LLM-verifier and rubric rewards on verl): run_rubric.sh's PPO command as written. It sets
    critic options and no estimator, which in verl means GAE with a critic; plugrl's default is grpo, so it
    refuses the command at start naming gae; with algorithm.adv_estimator=gae it trains one PPO step with the
    critic. Rewards go by data_source as the fork routes them (`*_tinyv*` to the tinyv verifier, tinyv_only,
    weight 1.0, a rubric model; `openai/gsm8k`; `grade` in any case; Prime Math for the rest); the verifier is a
    stand-in for the document's `vllm serve` on 127.0.0.1 that grades every answer 7/10 (max-model-len 15000)."""
    monkeypatch.setenv("WANDB_MODE", "offline")  # the document's own `export WANDB_MODE=offline`
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR"):  # nothing of wandb's outside tmp_path
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    # RUN_NAME as the script builds it: $(basename $MODEL_PATH)-$DATASET-$VERIFIER_SETUP-ppo-rlgrade-v4, then -NEKL
    run_name = f"{tiny_model.name}-polaris-tinyv_only-ppo-rlgrade-v4-NEKL"
    saved_dir = tmp_path / "models_rl" / run_name  # SAVED_DIR="./models_rl/${RUN_NAME}"
    train, val = doc003_rows(tmp_path)
    with StandInOpenAI(
        f"The answer is mostly right.\nTotal Score: {round(SCORE_003 * 10)}/10", models={VERIFIER: 15000}
    ) as vllm:
        base = tmp_path / "tinyv_verl.yaml"
        base.write_text(DOC003_BASE.format(verifier=VERIFIER, base_url=vllm.base_url))
        command = doc003_command(tiny_model, saved_dir, run_name, train, val)
        local = ["model.dtype=float32", "trainer.total_steps=1"]

        # as written: the keys land where the document means them ...
        written = load_config(base, [*command, *local])
        assert written.trainer.logger == ["console", "wandb", "jsonl"] and written.algorithm.adv_estimator == "grpo"
        assert written.reward.options["tinyv"]["setup"] == "tinyv_only"
        assert written.reward.options["tinyv"]["weight"] == 1.0
        # ... and with no estimator, plugrl's default (grpo) would drop the critic: refused at start, naming gae
        code, err = plugrl_train([str(base), *command, *local], capsys)
        assert code == 2
        assert (
            "critic.forward_max_token_len_per_gpu, critic.model, critic.optim, critic.ppo_max_token_len_per_gpu set, "
            "but algorithm.adv_estimator 'grpo' trains no critic, so they would be ignored" in err
        )
        assert "verl's default is gae" in err and not vllm.requests

        # the fix: verl's default estimator, named; and jsonl beside wandb (docs/coming_from_verl.md's logger line)
        fix = ["algorithm.adv_estimator=gae", "trainer.logger=[console,jsonl,wandb]"]
        train_ok([str(base), *command, *local, *fix], capsys)
        # the run start's probe (one known question: does the verifier answer the rubric template?), then the step's
        probe, *requests = vllm.requests
    assert PROBE_ANSWER in probe["body"]["messages"][0]["content"]

    run = saved_dir  # verl's default_local_dir is the run directory itself
    cfg = resolved(run)
    algorithm, actor, critic, rollout, data, trainer = (
        cfg[k] for k in ("algorithm", "actor", "critic", "rollout", "data", "trainer")
    )
    assert algorithm["adv_estimator"] == "gae"
    assert (algorithm["use_kl_in_reward"], algorithm["kl_ctrl"]["kl_coef"]) == (False, 0.001)
    assert (critic["model"]["path"], critic["optim"]["lr"]) == (str(tiny_model), 9e-6)
    assert (critic["ppo_max_token_len_per_gpu"], critic["forward_max_token_len_per_gpu"]) == (24000, 36000)
    assert trainer["critic_warmup"] == 0
    assert (actor["optim"]["lr"], actor["use_kl_loss"], actor["kl_loss_coef"], actor["kl_loss_type"]) == (
        5e-7,
        False,
        0.0,
        "low_var_kl",
    )
    assert (actor["ppo_mini_batch_size"], actor["ppo_max_token_len_per_gpu"]) == (1, 15360)
    assert (rollout["n"], rollout["gpu_memory_utilization"], rollout["max_num_batched_tokens"]) == (8, 0.7, 5120)
    assert (data["train_batch_size"], data["max_prompt_length"], data["max_response_length"]) == (
        8,
        1024,
        RESPONSE_TOKENS,
    )
    assert (data["filter_overlong_prompts"], data["truncation"]) == (True, "error")
    assert (trainer["project_name"], trainer["experiment_name"]) == ("TinyV-0429", run_name)
    assert (trainer["save_freq"], trainer["test_freq"], trainer["total_epochs"], trainer["resume"]) == (
        10,
        2,
        12,
        "auto",
    )
    dirs = (trainer["rollout_data_dir"], trainer["validation_data_dir"], trainer["default_local_dir"])
    assert dirs == (str(saved_dir),) * 3
    tinyv = cfg["reward"]["options"]["tinyv"]
    assert (tinyv["setup"], tinyv["weight"], tinyv["template"], tinyv["model"]) == (
        "tinyv_only",
        1.0,
        "rubric",
        VERIFIER,
    )
    assert routes(cfg, ["polaris_tinyv", "openai/gsm8k", "grade", " Grade ", "polaris", "math"]) == {
        "polaris_tinyv": ["tinyv"],
        "openai/gsm8k": ["gsm8k_reward"],
        "grade": ["grade_reward"],
        " Grade ": ["grade_reward"],  # verl: data_source.lower().strip() == 'grade'
        "polaris": ["math_accuracy"],  # the fork's last branch, Prime Math: reward.default
        "math": ["math_accuracy", "tag_count", "think_answer_format"],
    }

    (m,) = step_metrics(run)
    assert m["step"] == 1
    # tinyv_only asks the verifier for every sample of a *_tinyv* row: 4 rows x 8 responses, each graded 7/10
    assert len(requests) == len(TINYV_QUESTIONS) * 8 and {r["body"]["model"] for r in requests} == {VERIFIER}
    assert m["reward/tinyv/mean"] == pytest.approx(SCORE_003) and m["reward/tinyv/verdict"] == pytest.approx(SCORE_003)
    assert m["reward/tinyv/verifier_failed"] == 0.0
    for name in ("gsm8k_reward", "grade_reward", "math_accuracy"):
        assert 0.0 <= m[f"reward/{name}/mean"] <= 1.0, name
    assert m["reward/errors"] == 0.0
    # PPO: the critic trained beside the policy, 8 mini-batches each
    assert m["actor/optimizer_steps"] == 8 and m["critic/optimizer_steps"] == 8 and "critic/vf_loss" in m
    # every sample was scored by its data_source's route, and only by it
    samples = rollouts(run)
    scored_by: dict[str, set[str]] = {}
    for s in samples:
        scored_by.setdefault(s["data_source"], set()).update(
            k for k in s["details"] if "/" not in k and k not in ("error", "timeout")
        )
    assert len(samples) == 8 * 8 and scored_by == {
        "polaris_tinyv": {"tinyv"},
        "openai/gsm8k": {"gsm8k_reward"},
        "grade": {"grade_reward"},
        "Grade": {"grade_reward"},
        "polaris": {"math_accuracy"},
    }
    for s in samples:
        if s["data_source"] == "polaris_tinyv":
            assert s["reward"] == pytest.approx(SCORE_003) and s["details"]["tinyv/setup"] == "tinyv_only"
    # test_freq=2 validates at the last step, as verl does. The document points rollout_data_dir and
    # validation_data_dir at the same SAVED_DIR: step 1's dump in verl's layout is there (as in verl, the
    # validation's, written after the step's own, takes the file name {step}.jsonl)
    assert m["val/all/prompts"] == 2.0 and "val/math/score_mean" in m
    dump = [json.loads(line) for line in (saved_dir / "1.jsonl").read_text().splitlines()]
    assert dump and all({"input", "output", "gts", "score", "step", "data_source"} <= set(d) for d in dump)
    assert {d["step"] for d in dump} == {1}
    wandb_id = (run / "wandb_id").read_text().strip()  # the document's logger: wandb, offline
    assert list(run.rglob(f"offline-run-*/run-{wandb_id}.wandb")), "no offline wandb run"
    assert (run / "checkpoints" / "step_000001" / "critic" / "config.json").is_file()


# ============================================================================================ 004: TRL guide


# The guide's GRPOConfig YAML: its training configuration, model, GRPO, vLLM and dataset keys as it writes them.
# What its script does in Python (the format and math-verify accuracy rewards, the system prompt that asks for
# them) goes under `plugrl:` (docs/coming_from_trl.md).
DOC004_CONFIG = """\
model_name_or_path: {model}         # the guide: Qwen/Qwen2.5-1.5B-Instruct
torch_dtype: bfloat16
bf16: true
datasets:
  - path: json                      # the guide: AmirMohseni/Big-Math-RL-filtered
    data_files: {rows}
    split: train
field_mapping:
  question_field: question
  answer_field: answer_correct
learning_rate: 5.0e-7
lr_scheduler_type: cosine
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
beta: 0.001
max_prompt_length: 512
max_completion_length: 2048
num_generations: 16
use_vllm: true
vllm_mode: colocate
vllm_gpu_memory_utilization: 0.5
output_dir: {out}
plugrl:
  plugins: [math]
  data:
    data_source: math
    system_prompt: >-
      Reason about the problem inside <think> </think> tags, then write only the final answer inside
      <answer> </answer> tags.
"""

BIG_MATH_ROWS = [
    {"question": "Compute 15 + 27.", "answer_correct": "42"},
    {"question": "What is 3/4 of 20?", "answer_correct": "15"},
    {"question": "Solve for x: 2x + 3 = 11.", "answer_correct": "4"},
    {"question": "What is the square root of 81?", "answer_correct": "9"},
]


def test_004_trl_grpo_math_guide_config(tiny_model, tmp_path, capsys):
    """Document 004 (a TRL GRPO math guide): its GRPOConfig YAML through `plugrl train --trl-config`. Its batch on
    one process (1 per device x 8 accumulation steps = 8 completions, groups of 16) is half a group, which TRL
    refuses too; with gradient_accumulation_steps=16 (the fix docs/coming_from_trl.md names) one step trains GRPO
    with lr 5e-7 cosine, beta 0.001 (k3 KL loss), 16 generations, prompts up to 512 tokens, the guide's field
    mapping (question, answer_correct), and its two rewards: math-verify accuracy and the think/answer format."""
    rows = tmp_path / "big_math.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in BIG_MATH_ROWS))
    out = tmp_path / "grpo_math"
    config = tmp_path / "grpo_math_config.yaml"
    config.write_text(DOC004_CONFIG.format(model=tiny_model, rows=rows, out=out))
    # what cannot run here, as TRL keys: float32 on this CPU, the HF engine (no vLLM), 16 tokens, one step
    local = ["bf16=false", "use_vllm=false", f"max_completion_length={RESPONSE_TOKENS}", "max_steps=1"]

    code, err = plugrl_train(["--trl-config", str(config), *local], capsys)
    assert code == 2
    for named in ("per_device_train_batch_size (1)", "gradient_accumulation_steps (8)", "num_generations (16)"):
        assert named in err
    assert "= 8 completions" in err and not out.exists()

    train_ok(["--trl-config", str(config), *local, "gradient_accumulation_steps=16"], capsys)
    cfg = resolved(out)
    actor, data, rollout = cfg["actor"], cfg["data"], cfg["rollout"]
    assert cfg["algorithm"]["adv_estimator"] == "grpo" and cfg["plugins"] == ["math", "advantages"]
    assert (actor["optim"]["lr"], actor["optim"]["lr_scheduler"]) == (5e-7, "cosine")
    assert (actor["use_kl_loss"], actor["kl_loss_coef"], actor["kl_loss_type"]) == (True, 0.001, "low_var_kl")
    assert rollout["n"] == 16 and rollout["gpu_memory_utilization"] == 0.5
    # 1 completion per device x 16 accumulation steps = one group of 16 = 1 prompt per step and optimizer step
    assert (data["train_batch_size"], actor["ppo_mini_batch_size"]) == (1, 1)
    assert (data["max_prompt_length"], data["max_response_length"]) == (512, RESPONSE_TOKENS)
    assert (data["question_field"], data["answer_field"], data["data_source"]) == ("question", "answer_correct", "math")
    assert data["train_files"] == [str(rows)]
    assert (rollout["name"], cfg["model"]["dtype"], cfg["trainer"]["metric_aliases"]) == ("hf", "float32", "trl")
    assert routes(cfg, ["math"]) == {"math": ["math_accuracy", "tag_count", "think_answer_format"]}

    (m,) = step_metrics(out)
    assert m["step"] == 1 and m["actor/optimizer_steps"] == 1
    for name in ("math_accuracy", "think_answer_format"):  # the guide's accuracy and format rewards
        assert 0.0 <= m[f"reward/{name}/mean"] <= 1.0
        assert m[f"rewards/{name}/mean"] == m[f"reward/{name}/mean"]  # and under TRL's names
    assert "actor/kl_loss" in m and m["reward"] == m["reward/mean"]
    # the field mapping: the prompt from `question`, the ground truth from `answer_correct`
    samples = rollouts(out)
    (truth,) = {s["ground_truth"] for s in samples}  # one prompt, 16 completions
    (row,) = [r for r in BIG_MATH_ROWS if r["answer_correct"] == truth]
    assert len(samples) == 16 and all(row["question"] in s["prompt"] for s in samples)
