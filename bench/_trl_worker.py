"""TRL side of bench/vs_trl.py: GRPOTrainer on the countdown job, timed per step; prints one JSON line.

Run by vs_trl.py in its own process (so its peak RSS is its own); by hand:

    python bench/_trl_worker.py --steps 5 --out /tmp/trl.json

The work matches the plugrl run of vs_trl.py: SmolLM2-135M-Instruct from ``prepare_smollm2()`` (plugrl-commands),
the countdown plugin's problems (rows in order, ``shuffle_dataset=False``), its chat messages rendered with the
tokenizer's chat template (TRL's conversational prompts), its reward, 2 prompts x 8 completions per step, at most
128 new tokens, temperature 1, beta 0, lr 1e-6, one optimizer step per generation batch. Everything else is
TRL's default, on CPU without vLLM (``use_cpu=True``): note that TRL's defaults there are ``bf16=True`` (autocast,
fp32 master weights) and ``gradient_checkpointing=True``; ``--precision`` / ``--no-gradient-checkpointing`` change
them for side runs.

Timing: a ``TrainerCallback`` from ``on_step_begin`` to ``on_step_end`` (generation, reward, loss, backward and the
optimizer step; not logging). Phases come from wrapping the trainer's own methods. Tokens: the prompt tokens of
every completion's prompt plus the completion tokens, seen by the reward function (which receives
``completion_ids``), cross-checked against TRL's ``num_tokens`` log.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import COUNTDOWN_OPTIONS  # noqa: E402

TRAIN_DONE = "BENCH_TRAIN_DONE"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps, the first is the warm-up (default 5)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (default 2)")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--precision", choices=["default", "fp32", "bf16"], default="default")
    ap.add_argument("--no-gradient-checkpointing", action="store_true")
    ap.add_argument("--out", help="write the JSON result here too")
    args = ap.parse_args(argv)

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_start = time.perf_counter()

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from plugrl_commands.local_models import prepare_smollm2
    from plugrl_countdown import countdown_dataset, countdown_reward, countdown_template

    transformers.logging.set_verbosity_error()
    model_dir = str(prepare_smollm2())
    tok = AutoTokenizer.from_pretrained(model_dir)

    size = max(COUNTDOWN_OPTIONS["size"], args.prompts * args.steps)
    rows = list(countdown_dataset("train", **dict(COUNTDOWN_OPTIONS, size=size)))
    records = [{"prompt": countdown_template(r), "ground_truth": json.dumps(r["ground_truth"])} for r in rows]

    # the prompt ids TRL will generate from vs the ones plugrl encodes (chat template text, no added specials)
    def trl_ids(messages):
        out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    prompt_tokens: dict[str, int] = {}
    ids_match = True
    for rec in records[: args.prompts * args.steps]:
        ids = trl_ids(rec["prompt"])
        text = tok.apply_chat_template(rec["prompt"], add_generation_prompt=True, tokenize=False)
        ids_match &= ids == tok(text, add_special_tokens=False)["input_ids"]
        prompt_tokens[rec["prompt"][-1]["content"]] = len(ids)
    dataset = Dataset.from_list(records)

    # --- reward: the plugin's function as a TRL reward function; it also counts tokens per step
    counts = {"prompt": 0, "completion": 0, "sequences": 0}
    step_prompts: list[str] = []

    def countdown(prompts, completions, ground_truth, completion_ids=None, **_: Any) -> list[float]:
        scores = []
        for prompt, completion, gt, ids in zip(prompts, completions, ground_truth, completion_ids, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            r = countdown_reward(text, gt)
            scores.append(float(r["score"] if isinstance(r, dict) else r))
            key = prompt[-1]["content"] if isinstance(prompt, list) else prompt
            counts["prompt"] += prompt_tokens.get(key) or len(trl_ids(prompt))
            counts["completion"] += len(ids)
            counts["sequences"] += 1
            step_prompts.append(key)
        return scores

    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        kwargs: dict[str, Any] = dict(
            output_dir=tmp,
            use_cpu=True,
            per_device_train_batch_size=args.prompts * args.n,
            gradient_accumulation_steps=1,
            num_generations=args.n,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            beta=0.0,
            learning_rate=args.lr,
            max_steps=args.steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            shuffle_dataset=False,  # rows in order, as plugrl with data.shuffle=false
            seed=0,
        )
        if args.precision != "default":
            kwargs["bf16"] = args.precision == "bf16"
        if args.no_gradient_checkpointing:
            kwargs["gradient_checkpointing"] = False
        config = GRPOConfig(**kwargs)
        assert config.steps_per_generation == 1 and config.generation_batch_size == args.prompts * args.n

        trainer = GRPOTrainer(model=model_dir, reward_funcs=countdown, args=config, train_dataset=dataset)
        model = trainer.model
        n_params = sum(p.numel() for p in model.parameters())

        # --- phases: wrap the trainer's own methods (instance attributes shadow the class's)
        phase_t: dict[str, float] = defaultdict(float)
        current = {"phase": "other"}

        def timed(name: str, fn):
            @functools.wraps(fn)
            def inner(*a, **kw):
                prev, current["phase"] = current["phase"], name
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    phase_t[name] += time.perf_counter() - t0
                    current["phase"] = prev

            return inner

        trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
        trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
        trainer._prepare_inputs = timed("prepare_inputs", trainer._prepare_inputs)
        trainer.compute_loss = timed("loss_forward", trainer.compute_loss)
        trainer.training_step = timed("training_step", trainer.training_step)

        # --- what forwards run, and in which precision: a hook on the first decoder layer
        layer0 = model.model.layers[0]
        seen: dict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0, "tokens": 0, "autocast": set()})

        def layer_hook(_module, inputs, kw):
            hidden = inputs[0] if inputs else kw.get("hidden_states")
            phase = current["phase"]
            if phase == "training_step":  # inside training_step but outside the loss forward: the backward
                phase = "backward_recompute"
            s = seen[phase]
            s["calls"] += 1
            s["tokens"] += int(hidden.shape[0] * hidden.shape[1])
            s["autocast"].add(bool(torch.is_autocast_enabled("cpu")))

        layer0.register_forward_pre_hook(layer_hook, with_kwargs=True)

        steps: list[dict[str, Any]] = []

        class StepTimer(TrainerCallback):
            t0 = 0.0

            def on_step_begin(self, args_, state, control, **kw):
                counts.update(prompt=0, completion=0, sequences=0)
                step_prompts.clear()
                phase_t.clear()
                self.t0 = time.perf_counter()

            def on_step_end(self, args_, state, control, **kw):
                dt = time.perf_counter() - self.t0
                raw = dict(phase_t)
                ts = raw.get("training_step", 0.0)
                prep = raw.get("prepare_inputs", 0.0)
                gen, rew = raw.get("generate", 0.0), raw.get("reward", 0.0)
                loss = raw.get("loss_forward", 0.0)
                phases = {  # disjoint, adding up to the step
                    "generate": gen,
                    "reward": rew,
                    "prepare_other": max(prep - gen - rew, 0.0),  # tokenising, padding, advantages
                    "loss_forward": loss,
                    "backward": max(ts - prep - loss, 0.0),  # incl. activation recomputation
                    "optimizer_and_rest": max(dt - ts, 0.0),  # grad clip, AdamW step, scheduler, callbacks
                    "step": dt,
                }
                steps.append(
                    {
                        "step": state.global_step,
                        "time_s": dt,
                        "prompt_tokens": counts["prompt"],
                        "completion_tokens": counts["completion"],
                        "tokens": counts["prompt"] + counts["completion"],
                        "sequences": counts["sequences"],
                        "prompts": sorted(set(step_prompts)),
                        "phases": phases,
                    }
                )

            def on_log(self, args_, state, control, logs=None, **kw):
                if logs and steps and "num_tokens" in logs:
                    steps[-1]["trl_num_tokens_cumulative"] = logs["num_tokens"]
                    steps[-1]["reward_mean"] = logs.get("reward")
                    steps[-1]["clip_ratio"] = logs.get("completions/clipped_ratio")

        trainer.add_callback(StepTimer())
        t_train = time.perf_counter()
        trainer.train()
        train_wall = time.perf_counter() - t_train
        print(TRAIN_DONE, flush=True)  # vs_trl.py stops its training-RSS polling here

    prev = 0.0
    for s in steps:  # TRL logs num_tokens cumulatively
        cum = s.get("trl_num_tokens_cumulative")
        if cum is not None:
            s["trl_num_tokens"] = cum - prev
            prev = cum
    forwards = {
        k: {"calls": v["calls"], "tokens_incl_padding": v["tokens"], "autocast_bf16": sorted(v["autocast"])}
        for k, v in seen.items()
    }
    result = {
        "framework": "trl",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "config": {
            "bf16": config.bf16,
            "gradient_checkpointing": config.gradient_checkpointing,
            "loss_type": config.loss_type,
            "steps_per_generation": config.steps_per_generation,
            "generation_batch_size": config.generation_batch_size,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "num_iterations": config.num_iterations,
            "model_dtype": str(next(model.parameters()).dtype),
            "torch_threads": torch.get_num_threads(),
        },
        "prompt_ids_match_plugrl_encoding": ids_match,
        "n_params": n_params,
        "steps": steps,
        "forwards_seen_by_layer0": forwards,
        "train_wall_s": train_wall,
        "process_wall_s": time.perf_counter() - t_start,
        "self_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(text)
    print("BENCH_RESULT " + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
