"""`plugrl train --trl-config`: a TRL GRPOConfig YAML translated into plugrl's config, TRL's metric names beside
plugrl's, and `push_to_hub` through huggingface_hub.

This machine has no internet: the hub tests run huggingface_hub's real client (`HfApi.create_repo` and
`HfApi.upload_folder`, the code plugrl calls) against a stand-in for the Hub, a local HTTP server on 127.0.0.1
(:class:`StandInHub`) that answers the three endpoints those calls use (repo creation, preupload, commit) the way
the Hub's API documents them, and keeps the files committed. What is real: plugrl's code, huggingface_hub's
requests, the token in the Authorization header, the bytes sent. What stands in: the Hub's server side (it
accepts every file as a regular git blob, never as LFS/Xet, and keeps no git history).
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from plugrl.config import ConfigError, build_config
from plugrl.tracking import Tracker
from plugrl_compat.trl_config import load_trl_config, split_overrides, translate
from plugrl_compat.trl_metrics import trl_aliases

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "trl_grpo.yaml"
TOKEN = "hf_standinTokenForTheTestsOnly0123"


def fixture_trl() -> dict:
    from plugrl.config import _load_yaml

    return _load_yaml(FIXTURE.read_text())


def deep_get(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


# --- translation ------------------------------------------------------------------------------------------------


def test_the_guides_yaml_translates_to_hand_computed_values():
    """The fixture has the guide's numbers: 1 completion per device, 8 accumulation steps, 16 generations. On 8
    processes (the guide's multi-GPU setup) TRL generates 1 x 8 x 8 = 64 completions per optimizer step."""
    result = translate(fixture_trl(), num_processes=8)
    tree = result.tree
    expected = {
        "rollout.n": 16,
        "data.train_batch_size": 4,  # 64 completions / 16 per prompt
        "actor.ppo_mini_batch_size": 4,  # one optimizer step takes 1 x 8 x 8 = 64 completions = 4 prompts
        "actor.ppo_epochs": 1,  # num_iterations, TRL's default 1
        "trainer.total_steps": 20,  # max_steps 20, one optimizer step per plugrl step
        "actor.optim.lr": 5e-7,
        "actor.optim.lr_scheduler": "cosine",
        "actor.optim.warmup_steps": 2,  # ceil(0.1 x 20)
        "actor.use_kl_loss": True,
        "actor.kl_loss_coef": 0.001,
        "actor.kl_loss_type": "low_var_kl",  # TRL's k3
        "actor.clip_ratio_low": 0.2,  # TRL's default epsilon
        "actor.clip_ratio_high": 0.2,
        "actor.loss_mode": "vanilla",  # loss_type grpo: PPO's clip, the mean over each sequence's tokens
        "actor.loss_agg_mode": "seq-mean-token-mean",
        "actor.clip_ratio_c": None,  # TRL's clip has no dual clip (no delta)
        "reward.default_weight": 1.0,  # TRL weighs every reward 1.0: the math plugin's format reward too
        "data.max_prompt_length": 512,
        "data.max_response_length": 2048,
        "data.train_files": ["examples/data/math_tiny.jsonl"],  # datasets: [{path: json, data_files: ...}]
        "data.split": "train",
        "data.question_field": "problem",
        "data.answer_field": "answer",
        "data.data_source": "math",  # from the file's plugrl: block
        "data.seed": 42,
        "rollout.name": "vllm",
        "rollout.gpu_memory_utilization": 0.5,
        "rollout.temperature": 1.0,
        "model.path": "local:SmolLM2-135M-Instruct",
        "model.dtype": "bfloat16",
        "model.enable_gradient_checkpointing": True,
        "trainer.output_dir": "runs",  # the run directory is output_dir itself: runs/trl_grpo_math
        "trainer.experiment_name": "trl_grpo_math",
        "trainer.save_freq": 10,
        "trainer.log_freq": 1,
        "trainer.seed": 42,
        "trainer.logger": ["console", "jsonl", "wandb"],
        "trainer.metric_aliases": "trl",
        "plugins": ["math", "advantages"],  # advantages added: GRPO's estimator
    }
    assert {k: deep_get(tree, k) for k in expected} == expected
    assert result.optimizer_steps_per_step == 1
    assert result.unmapped == [
        "use_bias_correction_kl=True (plugrl's KL term is not weighted by the importance ratio, TRL's default)",
        "dataloader_num_workers=2 (plugrl batches prompts itself, with no torch DataLoader)",
        "num_completions_to_print=2 (plugrl writes every completion to rollouts/step_N.jsonl)",
    ]
    build_config(tree)  # a valid plugrl config


def test_the_guides_batch_on_one_process_is_refused_naming_the_keys():
    """1 x 1 x 8 = 8 completions cannot hold groups of 16: TRL refuses this too."""
    with pytest.raises(ConfigError) as info:
        translate(fixture_trl(), num_processes=1)
    text = str(info.value)
    for key in ("per_device_train_batch_size (1)", "gradient_accumulation_steps (8)", "num_generations (16)"):
        assert key in text
    assert "= 8 completions" in text and "Raise gradient_accumulation_steps" in text


@pytest.mark.parametrize(
    "trl, processes, expected",
    [
        # b=2 on 1 process, GA=2, G=2, S=4: 2x1x4 = 8 completions = 4 prompts per generation; an optimizer step
        # takes 2x1x2 = 4 completions = 2 prompts; k = 1 x 4/2 = 2 optimizer steps per plugrl step
        (
            {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_generations": 2,
             "steps_per_generation": 4, "max_steps": 4},
            1,
            {"data.train_batch_size": 4, "actor.ppo_mini_batch_size": 2, "actor.ppo_epochs": 1,
             "trainer.total_steps": 2, "k": 2},
        ),
        # b=4 x 2 processes x GA 4 = 32 completions of G=8: 4 prompts, one optimizer step each iteration; two
        # iterations: k = 2, so TRL's 10 optimizer steps are 5 plugrl steps and save_steps 4 is every 2
        (
            {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_generations": 8,
             "num_iterations": 2, "max_steps": 10, "save_steps": 4},
            2,
            {"data.train_batch_size": 4, "actor.ppo_mini_batch_size": 4, "actor.ppo_epochs": 2,
             "trainer.total_steps": 5, "trainer.save_freq": 2, "k": 2},
        ),
        # generation_batch_size 24 over b=2 x 2 processes: S = 6; 24/3 = 8 prompts; a step takes 2x2x3 = 12
        # completions = 4 prompts; k = 6/3 = 2
        (
            {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3, "num_generations": 3,
             "generation_batch_size": 24},
            2,
            {"data.train_batch_size": 8, "actor.ppo_mini_batch_size": 4, "actor.ppo_epochs": 1,
             "trainer.total_epochs": 3, "k": 2},  # TRL's default 3 epochs
        ),
    ],
)  # fmt: skip
def test_gradient_accumulation_is_the_mini_batch(trl, processes, expected):
    result = translate({"model_name_or_path": "m", "dataset_name": "d.jsonl", **trl}, num_processes=processes)
    got = {k: deep_get(result.tree, k) for k in expected if k != "k"}
    assert {**got, "k": result.optimizer_steps_per_step} == expected
    cfg = build_config(result.tree)
    # the trainer's own arithmetic: optimizer steps per step = epochs x train_batch_size / mini-batch
    steps = cfg.actor.ppo_epochs * (cfg.data.train_batch_size // cfg.mini_batch_size)
    assert steps == expected["k"]


def test_optimizer_steps_that_do_not_divide_are_rounded_up_and_said():
    trl = {"model_name_or_path": "m", "per_device_train_batch_size": 2, "num_generations": 2, "num_iterations": 2}
    result = translate({**trl, "max_steps": 5}, num_processes=1)
    assert result.tree["trainer"]["total_steps"] == 3  # ceil(5 / 2)
    assert any(n.startswith("max_steps=5 (one plugrl step takes 2 optimizer steps: 3 steps") for n in result.unmapped)


def test_batches_no_plugrl_run_can_reproduce_are_errors():
    base = {"model_name_or_path": "m", "per_device_train_batch_size": 2, "num_generations": 4}
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):  # 2 per step cannot hold groups of 4
        translate({**base, "gradient_accumulation_steps": 1, "steps_per_generation": 2})
    with pytest.raises(ConfigError, match="not a multiple of gradient_accumulation_steps"):
        translate({**base, "gradient_accumulation_steps": 2, "steps_per_generation": 3})
    with pytest.raises(ConfigError, match="both set"):
        translate({**base, "generation_batch_size": 8, "steps_per_generation": 4})
    with pytest.raises(ConfigError, match="'per_device_train_batch_size' must be an integer"):
        translate({**base, "per_device_train_batch_size": "two"})
    with pytest.raises(ConfigError, match=r"reads the splits \['test', 'train'\]; plugrl reads one split"):
        translate({**base, "num_generations": 2, "datasets": [{"path": "a/b"}, {"path": "c/d", "split": "test"}]})


@pytest.mark.parametrize(
    "loss_type, mode", [("grpo", "seq-mean-token-mean"), ("dr_grpo", "seq-mean-token-sum-norm"), ("dapo", "token-mean")]
)
def test_loss_types(loss_type, mode):
    result = translate(
        {"model_name_or_path": "m", "loss_type": loss_type, "lr_scheduler_type": "constant", "use_vllm": True}, 1
    )
    assert result.tree["actor"]["loss_agg_mode"] == mode and result.unmapped == []


def test_beta_zero_loads_no_reference_and_sequence_level_is_gspo():
    result = translate({"model_name_or_path": "m", "importance_sampling_level": "sequence", "epsilon_high": 0.28})
    actor = result.tree["actor"]
    assert actor["use_kl_loss"] is False and "kl_loss_coef" not in actor  # TRL's default beta 0
    assert actor["loss_mode"] == "gspo" and "loss_agg_mode" not in actor
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (0.2, 0.28)
    build_config({**result.tree, "data": {**result.tree["data"], "train_files": ["x.jsonl"]}})


def test_a_reward_model_in_reward_funcs_becomes_the_reward_model_plugin_beside_the_functions():
    """TRL's reward_funcs mixes functions and a model id, weighted by reward_weights: the functions go to
    reward.reward_funcs (loaded at start), the model scores every sample through the reward_model plugin
    (reward.extra)."""
    trl = {
        "model_name_or_path": "m",
        "reward_funcs": ["accuracy_reward", "OpenAssistant/reward-model-deberta-v3-large-v2"],
        "reward_weights": [1.0, 0.5],
        "reward_processing_classes": "OpenAssistant/reward-model-deberta-v3-large-v2",
    }
    result = translate(trl, 1)
    tree = result.tree
    assert "reward_model" in tree["plugins"] and "advantages" in tree["plugins"]
    assert tree["reward"]["extra"] == ["reward_model"]
    assert tree["reward"]["options"]["reward_model"] == {
        "path": "OpenAssistant/reward-model-deberta-v3-large-v2",
        "tokenizer_path": "OpenAssistant/reward-model-deberta-v3-large-v2",
    }
    assert tree["reward"]["weights"] == {"accuracy_reward": 1.0, "reward_model": 0.5}
    assert tree["reward"]["reward_funcs"] == ["accuracy_reward"]
    assert not any(n.startswith("reward_funcs") for n in result.unmapped)
    legacy = translate({"model_name_or_path": "m", "reward_model_name_or_path": "/models/rm"}, 1).tree
    assert legacy["reward"]["options"]["reward_model"] == {"path": "/models/rm"}
    with pytest.raises(ConfigError, match="name 2 reward models"):
        translate({"model_name_or_path": "m", "reward_funcs": ["a/b", "c/d"]}, 1)


def test_keys_not_mapped_are_named_with_why_and_secrets_are_not_shown():
    trl = {
        "model_name_or_path": "m",
        "learning_rat": 1e-5,  # a typo
        "vllm_mode": "server",
        "use_peft": True,
        "loss_type": "cispo",
        "repetition_penalty": 1.0,  # what plugrl does anyway: silent
        "push_to_hub": True,
        "hub_token": TOKEN,
        "scale_rewards": "batch",
    }
    notes = translate(trl).unmapped
    text = "; ".join(notes)
    assert "learning_rat=1e-05 (no plugrl setting; did you mean learning_rate?)" in notes
    assert "vllm_mode=server (the server there must be `plugrl rollout-serve MODEL`, not `trl vllm-serve`)" in text
    assert not any(n.startswith("use_peft") for n in notes)  # mapped to actor.lora now
    assert "loss_type" not in text  # cispo trains as TRL's (tests/test_trl_losses.py)
    assert "scale_rewards=batch (" in text
    assert "hub_token=*** (plugrl reads the token from HF_TOKEN" in text and TOKEN not in text
    # a TRL default plugrl cannot follow is named too, as TRL's default
    assert "lr_scheduler_type=linear (plugrl has constant and cosine schedules: constant used, TRL's default)" in notes
    assert "repetition_penalty" not in text


def test_trl_server_mode_is_plugrl_server_mode_at_the_same_address():
    """TRL's `vllm_mode: server` (a `trl vllm-serve` at vllm_server_base_url, or host:port, default 0.0.0.0:8000 on
    this machine) -> rollout.mode=server with that address; the timeout follows."""
    base = {"model_name_or_path": "m", "vllm_mode": "server"}
    tree = translate(base).tree["rollout"]
    assert tree["mode"] == "server" and tree["server_urls"] == ["http://127.0.0.1:8000"]
    tree = translate({**base, "vllm_server_host": "10.0.0.7", "vllm_server_port": 8100}).tree["rollout"]
    assert tree["server_urls"] == ["http://10.0.0.7:8100"]
    tree = translate({**base, "vllm_server_base_url": "http://gen-node:9000/", "vllm_server_timeout": 60}).tree
    assert tree["rollout"]["server_urls"] == ["http://gen-node:9000"] and tree["rollout"]["server_timeout_s"] == 60.0
    assert "mode" not in translate({"model_name_or_path": "m", "vllm_mode": "colocate"}).tree.get("rollout", {})


def test_load_trl_config_overrides_and_one_warning_line(tmp_path, caplog):
    """TRL keys on the command line change the file before translation, dotted plugrl keys the result."""
    trl = fixture_trl()
    trl["dataset_num_proc"] = 4
    path = tmp_path / "grpo.yaml"
    import yaml

    path.write_text(yaml.safe_dump(trl))
    assert split_overrides(["num_generations=4", "plugins=[math]", "actor.optim.lr=1e-5"]) == (
        {"num_generations": 4},
        ["plugins=[math]", "actor.optim.lr=1e-5"],
    )
    with caplog.at_level(logging.WARNING, logger="plugrl.trl_config"):
        cfg = load_trl_config(
            path, ["num_generations=4", "gradient_accumulation_steps=4", "actor.optim.lr=1e-5"], num_processes=1
        )
    # 1 x 1 x 4 = 4 completions of 4 generations: 1 prompt per step and per optimizer step
    assert (cfg.rollout.n, cfg.data.train_batch_size, cfg.mini_batch_size) == (4, 1, 1)
    assert cfg.actor.optim.lr == 1e-5 and cfg.trainer.metric_aliases == "trl"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("TRL settings not mapped: ")
    assert "dataset_num_proc=4 (no plugrl setting)" in warnings[0]


def test_load_trl_config_names_a_missing_model_and_an_unsplittable_batch(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("dataset_name: data.jsonl\nper_device_train_batch_size: 2\nnum_generations: 2\n")
    with pytest.raises(ConfigError, match="model_name_or_path is missing"):
        load_trl_config(path, num_processes=1)
    # 2 x 2 processes x 1 / 4 = 1 prompt per step: plugrl gives each process whole prompts
    with pytest.raises(ConfigError, match=r"1 prompts per step do not split over 2 data-parallel processes"):
        load_trl_config(path, ["model_name_or_path=m", "num_generations=4"], num_processes=2)


def test_cli_takes_one_config_or_the_other(tmp_path, capsys):
    from plugrl.cli import main

    assert main(["train"]) == 2
    assert "--trl-config FILE" in capsys.readouterr().err
    assert main(["train", str(FIXTURE), "--trl-config", str(FIXTURE)]) == 2
    assert "not both" in capsys.readouterr().err


# --- metric aliases ---------------------------------------------------------------------------------------------


class FakeWandbRun:
    def __init__(self):
        self.logged: list[dict] = []
        self.summary: dict = {}

    def log(self, data, step):
        self.logged.append(dict(data))

    def finish(self):
        pass


def test_tracker_logs_trls_names_beside_plugrls(tmp_path, monkeypatch):
    run = FakeWandbRun()
    fake_wandb = SimpleNamespace(init=lambda **kw: run, Settings=lambda **kw: None)
    monkeypatch.setattr("plugrl_loggers.wandb_logger._import_wandb", lambda: fake_wandb)
    step_metrics = {
        "reward/mean": 0.75,
        "reward/std": 0.5,
        "reward/math_accuracy/mean": 0.5,
        "reward/think_answer_format/mean": 1.0,
        "response_length/mean": 12.0,
        "actor/kl_loss": 0.01,
        "actor/entropy": 2.5,
        "timing/step": 3.0,
    }
    for aliases, name in (("trl", "on"), ("none", "off")):
        trainer_cfg = SimpleNamespace(logger=["jsonl", "wandb"], metric_aliases=aliases)
        tracker = Tracker(tmp_path / name, trainer_cfg, total_steps=1)
        tracker.log(1, step_metrics)
        tracker.close()
    on = json.loads((tmp_path / "on" / "metrics.jsonl").read_text())
    expected = {
        "reward": 0.75,
        "reward_std": 0.5,
        "rewards/math_accuracy/mean": 0.5,
        "rewards/think_answer_format/mean": 1.0,
        "completion_length": 12.0,
        "completions/mean_length": 12.0,
        "kl": 0.01,
        "entropy": 2.5,
        "step_time": 3.0,
    }
    assert {k: on[k] for k in expected} == expected and on["reward/mean"] == 0.75
    assert "rewards/mean/mean" not in on and "rewards/std/mean" not in on
    # wandb gets them as transformers' WandbCallback writes TRL's logs: under train/
    wandb_names = ("train/reward", "train/completion_length", "train/rewards/math_accuracy/mean")
    assert [run.logged[0][k] for k in wandb_names] == [0.75, 12.0, 0.5]
    assert run.logged[0]["reward/mean"] == 0.75 and "reward" not in run.logged[0]
    off = json.loads((tmp_path / "off" / "metrics.jsonl").read_text())
    assert not set(expected) & set(off) and not any(k.startswith("train/") for k in run.logged[1])
    assert trl_aliases({"reward/overlong_penalty_mean": -0.1, "reward/time_s": 1.0}) == {}


# --- push_to_hub ------------------------------------------------------------------------------------------------


class StandInHub:
    """The Hub's API for create_repo + upload_folder, on 127.0.0.1 (see the module docstring)."""

    def __init__(self, token: str, user: str = "plugrl-test"):
        self.token, self.user = token, user
        self.repos: dict[str, dict] = {}  # repo id -> {"private": ..., "files": {path: bytes}, "commits": [...]}
        self.unexpected: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if not self.path.startswith("/api/agent-harnesses"):  # huggingface_hub's own user-agent lookup
                    hub.unexpected.append(f"GET {self.path}")
                self._answer(404, {"error": "not in the stand-in"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._answer(401, {"error": "Invalid credentials in Authorization header"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts == ["api", "repos", "create"]:
                    return self._answer(200, hub.create(json.loads(body), self._base()))
                if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                    return self._answer(200, {"files": modes})
                if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
                    return self._answer(200, hub.commit(f"{parts[2]}/{parts[3]}", body, self._base()))
                hub.unexpected.append(f"POST {self.path}")
                self._answer(404, {"error": "not in the stand-in"})

            def _base(self):
                return f"http://{self.headers['Host']}"

            def _answer(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def create(self, payload: dict, base: str) -> dict:
        repo = f"{payload.get('organization') or self.user}/{payload['name']}"
        self.repos.setdefault(repo, {"visibility": payload.get("visibility"), "files": {}, "commits": []})
        return {"url": f"{base}/{repo}"}

    def commit(self, repo: str, body: bytes, base: str) -> dict:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(x["value"] for x in lines if x["key"] == "header")
        files = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines if x["key"] == "file"}
        self.repos[repo]["files"].update(files)
        self.repos[repo]["commits"].append(header["summary"])
        oid = f"{len(self.repos[repo]['commits']):040x}"
        return {"commitUrl": f"{base}/{repo}/commit/{oid}", "commitOid": oid}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in_hub(monkeypatch):
    hub = StandInHub(TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield hub
    hub.close()


def hub_trainer_cfg(**kw):
    tree = {"model": {"path": "m"}, "data": {"train_files": ["x.jsonl"]}, "trainer": {"push_to_hub": True, **kw}}
    return build_config(copy.deepcopy(tree)).trainer


def test_hub_repo_is_created_at_start_and_the_checkpoint_uploaded(tmp_path, stand_in_hub):
    """plugrl-hub through huggingface_hub's HfApi against the stand-in: a bare hub_model_id lands in the token's
    namespace, every file of checkpoint/policy arrives byte for byte, the token travels in the header."""
    from plugrl_hub import prepare_repo, push_checkpoint

    cfg = hub_trainer_cfg(hub_model_id="tiny-grpo", hub_private_repo=True)
    problem, repo = prepare_repo(cfg)
    assert (problem, repo) == (None, "plugrl-test/tiny-grpo")
    assert stand_in_hub.repos[repo]["visibility"] == "private"
    policy = tmp_path / "step_000002" / "policy"
    policy.mkdir(parents=True)
    sent = {"config.json": b'{"model_type": "llama"}', "model.safetensors": bytes(range(256)) * 64, "x.txt": b""}
    for name, data in sent.items():
        (policy / name).write_bytes(data)
    url = push_checkpoint(policy.parent, repo, "plugrl: run, step 2")
    assert url.startswith(f"{stand_in_hub.url}/{repo}/commit/")
    assert stand_in_hub.repos[repo]["files"] == sent
    assert stand_in_hub.repos[repo]["commits"] == ["plugrl: run, step 2"]
    assert stand_in_hub.unexpected == []


def test_hub_problems_stop_the_run_at_start(tmp_path, stand_in_hub, monkeypatch):
    from plugrl_hub import prepare_repo

    monkeypatch.setenv("HF_TOKEN", "hf_aWrongTokenForTheStandIn000")
    problem, repo = prepare_repo(hub_trainer_cfg(hub_model_id="tiny"))
    assert repo is None and "cannot create or reach the hub repo 'tiny'" in problem and "HF_TOKEN" in problem
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no_token"))
    problem, _ = prepare_repo(hub_trainer_cfg())
    assert problem.startswith("trainer.push_to_hub is true but there is no Hugging Face token: set HF_TOKEN")
    # the trainer says so before it loads anything (the model path here does not even exist): plugrl-hub's
    # plugrl_check_config, for training only (plugrl eval of such a run's checkpoint uploads nothing)
    from plugrl.plugins import check_config, load_plugins
    from plugrl.trainer import Trainer

    tree = {"model": {"path": str(tmp_path / "none")}, "data": {"train_files": ["x"]}}
    cfg = build_config(tree, ["trainer.push_to_hub=true"])
    with pytest.raises(ConfigError, match="plugin 'hub': trainer.push_to_hub is true but there is no Hugging Face"):
        Trainer(cfg)
    check_config(cfg, load_plugins(["advantages"]), training=False)
    with pytest.raises(ConfigError, match="trainer.save_freq=0 writes"):
        hub_trainer_cfg(save_freq=0)


def test_push_to_hub_without_plugrl_hub_is_refused_naming_the_package(without_config_fields):
    """trainer.push_to_hub and its keys are plugrl-hub's (entry-point group plugrl.config_fields): without it, a
    config that sets one is refused before any model loads, naming the key and the package; one that sets none
    needs no package."""
    without_config_fields("plugrl-hub")
    tree = {"model": {"path": "m"}, "data": {"train_files": ["x"]}}
    with pytest.raises(ConfigError) as err:
        build_config(tree, ["trainer.push_to_hub=true", "trainer.hub_model_id=me/tiny"])
    assert str(err.value) == (
        "invalid config:\n"
        "  trainer.push_to_hub is a key of the package plugrl-hub, which is not installed: pip install plugrl-hub "
        "(in a plugrl checkout: pip install -e plugins/hub)\n"
        "  trainer.hub_model_id is a key of the package plugrl-hub, which is not installed: pip install plugrl-hub "
        "(in a plugrl checkout: pip install -e plugins/hub)"
    )
    assert "push_to_hub" not in type(build_config(tree).trainer).model_fields


def test_the_hub_hooks_create_the_repo_at_start_and_upload_the_final_checkpoint(tmp_path, stand_in_hub, caplog):
    """plugrl-hub's hooks, as the trainer calls them (they are an extension's: every run has them, no `plugins:`
    entry): the repo at plugrl_run_start, the upload at plugrl_final_checkpoint; a run stopped early uploads nothing
    and says so; a failed upload ends the run with the hub's own message (a PluginError, as it is); plugrl eval (no
    run directory) creates no repo."""
    from plugrl.plugins import PluginRun, final_checkpoint, load_plugins
    from plugrl_hub import HubError

    registry = load_plugins([])
    tree = {"model": {"path": "m"}, "data": {"train_files": ["x.jsonl"]}, "trainer": {"experiment_name": "exp"}}
    cfg = build_config(tree, ["trainer.push_to_hub=true", "trainer.hub_model_id=tiny-hooks"])
    with PluginRun(registry, cfg, None):  # plugrl eval
        assert stand_in_hub.repos == {}
    run_dir = tmp_path / "run"
    final = run_dir / "checkpoints" / "step_000002"
    (final / "policy").mkdir(parents=True)
    (final / "policy" / "config.json").write_bytes(b"{}")
    with PluginRun(registry, cfg, run_dir):
        assert list(stand_in_hub.repos) == ["plugrl-test/tiny-hooks"]  # at the start, before any step
        final_checkpoint(registry, cfg, run_dir, final, 2)
    assert stand_in_hub.repos["plugrl-test/tiny-hooks"]["files"] == {"config.json": b"{}"}
    assert stand_in_hub.repos["plugrl-test/tiny-hooks"]["commits"] == ["plugrl: exp, step 2"]
    with caplog.at_level(logging.WARNING, logger="plugrl.hub"), PluginRun(registry, cfg, run_dir):
        final_checkpoint(registry, cfg, run_dir, None, 2)
    assert "not uploaded to plugrl-test/tiny-hooks: the run did not reach its last step (2)" in caplog.text
    assert stand_in_hub.repos["plugrl-test/tiny-hooks"]["commits"] == ["plugrl: exp, step 2"]
    with pytest.raises(HubError, match=r"^uploading .* failed .* the checkpoint is kept: run the same command again"):
        with PluginRun(registry, cfg, run_dir):
            final_checkpoint(registry, cfg, run_dir, tmp_path / "no_such_checkpoint", 2)
    off = build_config(tree, ["trainer.hub_model_id=tiny-off"])
    with PluginRun(registry, off, run_dir):  # push_to_hub false: the hooks do nothing
        final_checkpoint(registry, off, run_dir, final, 2)
    assert list(stand_in_hub.repos) == ["plugrl-test/tiny-hooks"] and stand_in_hub.unexpected == []


# --- end to end -------------------------------------------------------------------------------------------------


def test_train_from_the_trl_yaml_logs_trl_names_and_pushes(tiny_model, tmp_path, stand_in_hub, capsys):
    """The fixture YAML through `plugrl train --trl-config` on the tiny model, with TRL keys as overrides: 2
    completions per device and optimizer step (gradient_accumulation_steps 2 x 1), generations of 4 steps' worth
    (steps_per_generation 4): each plugrl step generates 4 prompts x 2 and takes 2 optimizer steps, so max_steps 4
    is 2 plugrl steps. The last checkpoint goes to the stand-in hub."""
    from plugrl.cli import main

    run_dir = tmp_path / "trl_run"
    code = main(
        [
            "train",
            "--trl-config",
            str(FIXTURE),
            f"model_name_or_path={tiny_model}",
            "bf16=false",
            "use_vllm=false",
            "per_device_train_batch_size=1",
            "gradient_accumulation_steps=2",
            "steps_per_generation=4",
            "num_generations=2",
            "max_steps=4",
            "max_completion_length=16",
            "max_prompt_length=256",
            "learning_rate=1e-4",
            "report_to=none",
            f"output_dir={run_dir}",
            "push_to_hub=true",
            "hub_model_id=tiny-trl-grpo",
            f"datasets=[{{path: json, data_files: {ROOT / 'examples/data/math_tiny.jsonl'}}}]",
            "reward.num_workers=0",
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["actor/optimizer_steps"] == 2  # gradient_accumulation_steps honoured: 2 updates per step
        assert m["reward"] == m["reward/mean"] and m["completion_length"] == m["response_length/mean"]
        assert m["rewards/math_accuracy/mean"] == m["reward/math_accuracy/mean"]
    ckpt = run_dir / "checkpoints" / "step_000002" / "policy"
    files = stand_in_hub.repos["plugrl-test/tiny-trl-grpo"]["files"]
    assert files == {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    assert "model.safetensors" in files and stand_in_hub.unexpected == []


def test_use_peft_becomes_actor_lora_with_trls_defaults():
    tree = translate({"model_name_or_path": "m", "use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]}, 1).tree
    assert tree["actor"]["lora"] == {"r": 16, "alpha": 32.0, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    tree = translate({"model_name_or_path": "m", "use_peft": True, "lora_r": 8, "lora_alpha": 8}, 1).tree
    assert tree["actor"]["lora"]["r"] == 8 and tree["actor"]["lora"]["alpha"] == 8.0
    assert "lora" not in translate({"model_name_or_path": "m"}, 1).tree.get("actor", {})
