"""Every start-up failure is one line on stderr (exit 2), no traceback, before any model loads where it can be.

Driven through the real command line (``plugrl.cli.main``) in this process; the config and data are tiny
files written per test.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest

from plugrl.cli import main


def write_config(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "run.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plugrl: error: "), err
    assert "Traceback" not in err[0]
    return err[0]


BASE = "plugins: [countdown, advantages]\ndata: {dataset: countdown}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            b'model: {path: m}\ndata: {dataset: countdown, prefill: "\xff\xfe"}\n',
            "is not UTF-8 text (byte 0xff at offset",
        ),
        ("model: {path: !!int abc}\n", "a value cannot be read as its YAML tag says (ValueError"),
        ("model: {path: !!timestamp 'never'}\n", "a value cannot be read as its YAML tag says"),
        (
            "model: {path: !!python/object:os.system x}\n",
            "is not valid YAML: line 1, column 15: could not determine a constructor",
        ),
    ],
)
def test_unreadable_config_files(tmp_path, capsys, text, expected):
    line = one_line_error(capsys, ["train", write_config(tmp_path, text)])
    assert expected in line


def test_a_secret_override_is_never_echoed(tmp_path, capsys):
    line = one_line_error(capsys, ["train", write_config(tmp_path, BASE), "reward.options.x.api_key=[sk-123"])
    assert "reward.options.x.api_key=***" in line and "sk-123" not in line


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            "local:SmolLM3",
            "model.path 'local:SmolLM3': no local model 'SmolLM3'; known: Idefics3-SmolLM2-135M-test, "
            "SmolLM2-135M-Instruct",
        ),
        ("/no/such/model", "model.path '/no/such/model' does not exist"),
        ("./models/mine", "model.path './models/mine' does not exist"),
        ("a/b/c", "model.path 'a/b/c' does not exist"),
    ],
)
def test_a_missing_model_is_named_before_anything_loads(tmp_path, capsys, model, expected):
    config = write_config(tmp_path, BASE + f"model: {{path: {json.dumps(model)}}}\n")
    assert expected in one_line_error(capsys, ["train", config])


def test_a_missing_tokenizer_path_is_named(tmp_path, capsys, smollm2_path):
    config = write_config(tmp_path, BASE + f"model: {{path: {smollm2_path}, tokenizer_path: local:nope}}\n")
    assert "model.tokenizer_path 'local:nope': no local model 'nope'" in one_line_error(capsys, ["train", config])


def run_config(tmp_path: Path, model: Path, output_dir: Path) -> str:
    return write_config(
        tmp_path,
        BASE
        + f"model: {{path: {model}}}\n"
        + "rollout: {name: hf, n: 2}\ndata: {dataset: countdown, train_batch_size: 2, max_response_length: 8}\n"
        + f"trainer: {{output_dir: {output_dir}, experiment_name: x, total_steps: 1}}\n",
    )


def test_an_output_dir_behind_a_file_fails_before_the_model_loads(tmp_path, capsys, tiny_model, monkeypatch):
    import plugrl.trainer as trainer_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the output directory was checked")

    monkeypatch.setattr(trainer_module, "PolicyModel", no_model)
    (tmp_path / "blocker").write_text("a file where a directory should be")
    line = one_line_error(capsys, ["train", run_config(tmp_path, tiny_model, tmp_path / "blocker" / "runs")])
    assert f"trainer.output_dir: {tmp_path / 'blocker'} is a file" in line


def test_an_immutable_output_dir_fails_before_the_model_loads(tmp_path, capsys, tiny_model, monkeypatch):
    """chattr +i: not even root may create a file inside (stands for a read-only or foreign directory)."""
    import plugrl.trainer as trainer_module

    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not permitted here (no CAP_LINUX_IMMUTABLE)")
    try:
        monkeypatch.setattr(trainer_module, "PolicyModel", lambda *a, **k: pytest.fail("the model loaded"))
        line = one_line_error(capsys, ["train", run_config(tmp_path, tiny_model, locked)])
        assert f"trainer.output_dir: cannot write in {locked} (Operation not permitted)" in line
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)


def test_a_plugin_that_registers_nothing_is_named(tmp_path, monkeypatch, caplog):
    from plugrl.plugins import load_plugins

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "idle_plugin.py").write_text("def reward(completion, ground_truth):\n    return 1.0\n")
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        load_plugins(["idle_plugin:", "countdown"])
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "plugin 'idle_plugin:' (idle_plugin:) registers nothing" in warned[0]


def test_a_local_plugin_module_imports_from_the_working_directory(tmp_path):
    """`plugins: ["my_module:"]` through the installed `plugrl` script (whose sys.path starts at its bin
    directory, not the working directory): the module next to the user is found, as with `python -m`."""
    import sys

    (tmp_path / "my_local_probe.py").write_text("X = 1\n")
    (tmp_path / "c.yaml").write_text('plugins: ["my_local_probe:"]\nmodel: {path: x}\ndata: {train_files: [a.jsonl]}\n')
    script = Path(sys.executable).parent / "plugrl"
    out = subprocess.run([str(script), "train", "c.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "cannot import module" not in out.stderr, out.stderr
    assert out.returncode == 2 and "algorithm.adv_estimator 'grpo' is not registered" in out.stderr


def test_critic_keys_for_an_estimator_without_a_critic_are_an_error(tmp_path, capsys):
    """verl's PPO command sets critic options and no estimator (verl's default is gae): in plugrl, whose default
    is grpo, they would be ignored in silence. One line names the keys and the estimator that uses them."""
    config = write_config(tmp_path, BASE + "model: {path: local:SmolLM2-135M-Instruct}\n")
    line = one_line_error(capsys, ["train", config, "critic.optim.lr=1e-5", "critic.ppo_epochs=2"])
    assert "critic.optim, critic.ppo_epochs set, but algorithm.adv_estimator 'grpo' trains no critic" in line
    assert "(gae; verl's default is gae)" in line


def test_keys_accepted_for_compatibility_but_not_acted_on_are_named_in_one_warning(tmp_path, caplog):
    """verl's micro-batch keys, and the fields kept for verl's sake, load as written; one warning line at start
    names each with what plugrl does instead."""
    from plugrl.config import load_config
    from plugrl.startup import check_run

    config = write_config(tmp_path, BASE + "model: {path: local:SmolLM2-135M-Instruct}\n")
    overrides = [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.model.use_remove_padding=True",
        "trainer.n_gpus_per_node=8",
        "rollout.val_kwargs.do_sample=False",
    ]
    with caplog.at_level(logging.WARNING, logger="plugrl.startup"):
        check_run(load_config(config, overrides), training=True)
    (line,) = [r.getMessage() for r in caplog.records if "not acted on" in r.getMessage()]
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (plugrl makes micro-batches by token budget" in line
    assert "actor_rollout_ref.model.use_remove_padding (always packed sequences)" in line  # as typed
    assert "trainer.n_gpus_per_node (torchrun's --nproc_per_node decides)" in line
    assert "rollout.val_kwargs.do_sample" in line


def test_vllm_settings_with_the_hf_engine_are_named(tmp_path, caplog):
    """verl's scripts set vLLM's memory knobs; with rollout.name=hf they change nothing, and the start-up
    warning says so (TinyV's document sets gpu_memory_utilization and max_num_batched_tokens)."""
    from plugrl.config import load_config
    from plugrl.startup import check_run

    config = write_config(tmp_path, BASE + "model: {path: local:SmolLM2-135M-Instruct}\n")
    overrides = ["rollout.name=hf", "rollout.gpu_memory_utilization=0.7", "rollout.max_num_batched_tokens=5120"]
    with caplog.at_level(logging.WARNING, logger="plugrl.startup"):
        check_run(load_config(config, overrides), training=True)
    (line,) = [r.getMessage() for r in caplog.records if "not acted on" in r.getMessage()]
    assert "rollout.gpu_memory_utilization (a vLLM setting; rollout.name is hf)" in line
    assert "rollout.max_num_batched_tokens (a vLLM setting; rollout.name is hf)" in line
    assert "rollout.temperature" not in line


def test_a_vllm_setting_for_another_device_is_named(caplog):
    """On CPU vLLM's KV cache is rollout.cpu_kv_cache_gb: a gpu_memory_utilization set there is said, not dropped
    in silence (and the other way round on GPUs)."""
    from plugrl.config import RolloutConfig
    from plugrl.rollout.vllm_engine import engine_kwargs

    def warned(cfg, device):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="plugrl.rollout.vllm_engine"):
            kwargs = engine_kwargs(
                cfg,
                model_path="m",
                dtype="float32",
                max_model_len=64,
                device=device,
                world_size=1,
                rank=0,
                trainer_seed=0,
                sleep=None,
            )
        return kwargs, " ".join(r.getMessage() for r in caplog.records)

    kwargs, said = warned(RolloutConfig(gpu_memory_utilization=0.8), "cpu")
    assert "gpu_memory_utilization" not in kwargs and "rollout.gpu_memory_utilization is not used on CPU" in said
    kwargs, said = warned(RolloutConfig(cpu_kv_cache_gb=2.0), "cuda")
    assert kwargs["gpu_memory_utilization"] == 0.5 and "rollout.cpu_kv_cache_gb is not used on GPUs" in said
    assert warned(RolloutConfig(), "cpu")[1] == ""


def test_a_config_without_compatibility_keys_warns_nothing(tmp_path, caplog):
    from plugrl.config import load_config
    from plugrl.startup import check_run

    config = write_config(tmp_path, BASE + "model: {path: local:SmolLM2-135M-Instruct}\n")
    with caplog.at_level(logging.WARNING, logger="plugrl.startup"):
        check_run(load_config(config), training=True)
    assert not [r for r in caplog.records if "not acted on" in r.getMessage()]
