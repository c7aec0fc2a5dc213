"""Two GPUs (each test skips with the reason on fewer, or without vllm): torchrun over 2 GPUs one step off the
policy, each rank's rollout thread generating on its own GPU; a rollout server plugrl starts on the second GPU,
its weights over NCCL."""

from __future__ import annotations

from gpu_checks import check_resolved_dtype
from gpu_runs import OFF_POLICY_VLLM, SERVER_COLLECTIVE, check_step_metrics, metrics
from test_gpu_vllm import SYNCED


def test_two_gpus_one_step_off_the_policy(plugrl_train, vllm_installed, two_gpus):
    run = plugrl_train(OFF_POLICY_VLLM, steps=2, nproc=2, probe=True)
    check_resolved_dtype(run.run_dir)
    logged = metrics(run.run_dir)
    assert [m["rollout/policy_lag"] for m in logged] == [0, 1], logged
    for record in logged:
        check_step_metrics(record, ("rollout_corr/logp_abs_diff_mean",))
    assert logged[0]["rollout_corr/logp_abs_diff_mean"] < SYNCED, logged[0]
    # rank r generated on GPU r on its main thread (step 1) and on its rollout thread (step 2 on)
    assert [p["rank"] for p in run.probes] == [0, 1], run.probes
    for probe in run.probes:
        assert probe["exit_code"] == 0
        threads = dict(map(tuple, probe["generation_devices"]))
        assert threads.get("plugrl-rollouts-ahead") == probe["rank"], probe["generation_devices"]
        assert set(threads.values()) == {probe["rank"]}, probe["generation_devices"]


def test_a_rollout_server_on_the_second_gpu_takes_weights_over_nccl(plugrl_train, vllm_installed, two_gpus):
    run = plugrl_train(SERVER_COLLECTIVE, steps=2)
    logged = metrics(run.run_dir)
    assert [m["step"] for m in logged] == [1, 2], logged
    for record in logged:
        check_step_metrics(record, ("rollout_corr/logp_abs_diff_mean",))
    assert logged[1]["rollout_corr/logp_abs_diff_mean"] < SYNCED, logged[1]  # the server serves step 1's update
    assert "rollout server 0 on GPU(s)" in run.log and "its own GPU(s)" in run.log, "the server shares a GPU"
    assert "rollout.weight_transport=collective over nccl" in run.log, "the weights did not go over NCCL"
    assert (run.run_dir / "rollout_server_0.log").is_file()
