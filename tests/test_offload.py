"""FSDP2 CPU offload (``actor.fsdp_config.param_offload``) and gradient checkpointing: the same update,
and what each does to memory, as far as a CPU-only machine can show it.

Two processes (torchrun, gloo) run one policy update on the same global batch (tests/offload_worker.py)
three ways: plain, with FSDP2's ``CPUOffloadPolicy``, and with gradient checkpointing. All three must
end with the same weights.

What is measured and printed, and what cannot be shown here:
- Offload moves the sharded parameters, gradients and AdamW state from the accelerator to host
  memory, and runs the optimizer step on the CPU. On this machine the accelerator *is* the host: FSDP2
  runs on a CPU mesh, so with or without offload every byte lives in the same RAM, and offload cannot
  lower the peak here (the printed peak RSS is the same within noise). What the test checks is that
  the policy works on a CPU mesh (before this test, ``param_offload`` crashed: pinned memory needs an
  accelerator), gives the same update, and where each tensor lives (``device.type``; all "cpu" here,
  and on GPUs the offloaded run would show "cpu" where the plain run shows "cuda"). The GPU memory it
  saves is computed in docs/scaling.md (16 bytes per parameter / dp per GPU for fp32 master weights,
  gradients and AdamW moments).
- Gradient checkpointing does lower memory on CPU: the peak bytes of activations held for backward
  (through ``saved_tensors_hooks``) are printed and must be lower with it on.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from test_e2e import ROOT

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def deeper_tiny_model(tmp_path_factory, smollm2_path):
    """8 layers of width 256: enough decoder-layer activations for checkpointing to show beside the logits."""
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny8") / "llama", smollm2_path, arch="llama", hidden=256, layers=8)


def _run(model, out, offload: bool, checkpointing: bool) -> dict:
    worker = str(ROOT / "tests" / "offload_worker.py")
    cmd = [*TORCHRUN, worker, str(model), str(out), str(int(offload)), str(int(checkpointing))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return torch.load(out)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


@pytest.mark.slow
def test_offload_and_checkpointing_give_the_same_update_and_print_memory(deeper_tiny_model, tmp_path):
    runs = {
        "plain": _run(deeper_tiny_model, tmp_path / "plain.pt", False, False),
        "offload": _run(deeper_tiny_model, tmp_path / "offload.pt", True, False),
        "checkpointing": _run(deeper_tiny_model, tmp_path / "ckpt.pt", False, True),
    }
    print()
    for name, r in runs.items():
        for rep in r["reports"]:
            print(
                f"{name:>13} rank {rep['rank']}: params {rep['param_bytes']}, grads {rep['grad_bytes']}, "
                f"AdamW state {rep['optimizer_state_bytes']} (bytes by device type); activations held for "
                f"backward, peak {_mib(rep['activation_bytes_peak'])}; peak RSS "
                f"{rep['peak_rss_mib_before_update']} -> {rep['peak_rss_mib_after_update']} MiB"
            )
    plain = runs["plain"]["weights"]
    for name in ("offload", "checkpointing"):
        for k, w in plain.items():
            torch.testing.assert_close(runs[name]["weights"][k], w, atol=1e-6, rtol=1e-5, msg=f"{name}: {k}")
    for rep_plain, rep_off in zip(runs["plain"]["reports"], runs["offload"]["reports"], strict=True):
        # each rank holds half of everything, in host memory, whichever the policy
        assert set(rep_off["param_bytes"]) == set(rep_off["optimizer_state_bytes"]) == {"cpu"}
        assert rep_off["param_bytes"] == rep_plain["param_bytes"]
        assert rep_off["optimizer_state_bytes"]["cpu"] == 2 * rep_off["param_bytes"]["cpu"]  # AdamW: m and v
    for rep_plain, rep_ckpt in zip(runs["plain"]["reports"], runs["checkpointing"]["reports"], strict=True):
        assert rep_ckpt["activation_bytes_peak"] < 0.75 * rep_plain["activation_bytes_peak"]
