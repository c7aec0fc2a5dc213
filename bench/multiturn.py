"""Multi-turn rollouts against single-turn generation of the same tokens, in one process, on one vLLM engine.

The multi-turn side plays the episodes of examples/countdown_multiturn.yaml with three attempts on the
default job's problems (SmolLM2-135M-Instruct, the environment ``countdown_retry``: up to 3 answers, feedback
after each wrong one; ``THREE_ATTEMPTS``, fixed here so that the example's tuning does not move the bench)
through plugrl-multiturn's :class:`plugrl_multiturn.turns.EpisodeRunner`, as training does. The baseline then
generates, for every episode, as many tokens as its policy turns held, in one request from its first prompt
(``ignore_eos``): the same sampled tokens' count without turns. Printed and saved:

- rollout tokens/s of both, and their ratio;
- turn overhead: the share of the multi-turn wall time spent outside the engine (environments, tools,
  the chat template's tokens, scheduling), against the target of at most 15%;
- the prefix cache: the share of the prompt tokens of turns 2+ that vLLM served from its cache
  (``RequestOutput.num_cached_tokens``), i.e. how much of the earlier turns was not recomputed.

    python bench/multiturn.py [--prompts 8] [--n 8] [--rounds 2] [--out bench/results/multiturn_DATE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

from _common import REPO, config_engine, machine_info, wait_until_idle

# the episodes measured: up to three answers to the default job's problems (examples/countdown_grpo.yaml)
THREE_ATTEMPTS = [
    "environment_options.max_attempts=3",
    "rollout.max_turns=3",
    "rollout.max_turn_tokens=24",
    "data.max_response_length=128",
    "data.dataset_options={size: 4000, seed: 0, min_numbers: 2, max_numbers: 2, max_number: 10, max_target: 20, "
    "ops: '+-'}",
]


def build(args):
    from plugrl.config import load_config
    from plugrl.precision import resolve_config_dtypes
    from plugrl.rollout.play import make_episode_runner
    from plugrl.startup import check_run, load_prompts, load_tokenizer

    cfg = load_config(REPO / "examples" / "countdown_multiturn.yaml", [*THREE_ATTEMPTS, f"rollout.n={args.n}"])
    registry = check_run(cfg, training=False).registry  # plugins loaded, options checked, model.path resolved
    resolve_config_dtypes(cfg, "cpu")
    tokenizer = load_tokenizer(cfg)
    prompts, _ = load_prompts(cfg, registry, tokenizer)
    engine = config_engine(cfg, tokenizer, name="vllm")
    return cfg, engine, make_episode_runner(cfg, registry, engine, tokenizer), prompts


def record_requests(engine):
    """Wrap the engine's ``llm.generate`` to keep each request's prompt length and cached prompt tokens."""
    seen: list[tuple[int, int]] = []
    real = engine.llm.generate

    def generate(requests, params, **kw):
        outs = real(requests, params, **kw)
        seen.extend((len(o.prompt_token_ids), o.num_cached_tokens or 0) for o in outs)
        return outs

    engine.llm.generate = generate
    return seen


def multi_turn(cfg, player, prompts, seen):
    from plugrl.rollout import sampling_settings

    sampling = sampling_settings(cfg, "train", seed=0)
    first = len(seen)
    t0 = time.perf_counter()
    played = player.play(prompts, sampling)
    wall = time.perf_counter() - t0
    policy = [sum(r.policy_mask) for r, _ in played]
    later = seen[first + len(played) :]  # the requests of turns 2+ (turn 1 holds one request per episode)
    return {
        "episodes": len(played),
        "turns_mean": statistics.mean(c.turns for _, c in played),
        "policy_tokens": sum(policy),
        "wall_s": wall,
        "engine_s": player.timings["generate"],
        "env_s": player.timings["env"],
        "later_turn_prompt_tokens": sum(p for p, _ in later),
        "later_turn_cached_tokens": sum(c for _, c in later),
    }, [(r.prompt_ids, n) for (r, _), n in zip(played, policy, strict=True)]


def single_turn(engine, requests):
    from vllm import SamplingParams

    t0 = time.perf_counter()
    params = [SamplingParams(max_tokens=max(n, 1), min_tokens=max(n, 1), ignore_eos=True) for _, n in requests]
    engine.llm.generate([{"prompt_token_ids": ids} for ids, _ in requests], params, use_tqdm=False)
    return {"policy_tokens": sum(n for _, n in requests), "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds after one warm-up round")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"multiturn_{date.today()}.json")
    args = ap.parse_args()

    load = wait_until_idle(120)
    cfg, engine, player, prompts = build(args)
    seen = record_requests(engine)
    rounds = []
    for r in range(args.rounds + 1):
        batch = prompts[r * args.prompts : (r + 1) * args.prompts]
        mt, requests = multi_turn(cfg, player, batch, seen)
        st = single_turn(engine, requests)
        if r == 0:
            continue  # warm-up
        rounds.append({"multi_turn": mt, "single_turn": st})
        print(
            f"round {r}: multi-turn {mt['policy_tokens'] / mt['wall_s']:.0f} tok/s ({mt['turns_mean']:.2f} turns, "
            f"engine {mt['engine_s']:.1f} s of {mt['wall_s']:.1f} s); "
            f"single-turn {st['policy_tokens'] / st['wall_s']:.0f} tok/s"
        )
    player.close()
    engine.close()

    mt_tok = sum(x["multi_turn"]["policy_tokens"] for x in rounds)
    mt_wall = sum(x["multi_turn"]["wall_s"] for x in rounds)
    mt_engine = sum(x["multi_turn"]["engine_s"] for x in rounds)
    st_tok = sum(x["single_turn"]["policy_tokens"] for x in rounds)
    st_wall = sum(x["single_turn"]["wall_s"] for x in rounds)
    later_p = sum(x["multi_turn"]["later_turn_prompt_tokens"] for x in rounds)
    later_c = sum(x["multi_turn"]["later_turn_cached_tokens"] for x in rounds)
    summary = {
        "multi_turn_tokens_per_s": mt_tok / mt_wall,
        "single_turn_tokens_per_s": st_tok / st_wall,
        "ratio_multi_to_single": (mt_tok / mt_wall) / (st_tok / st_wall),
        "turn_overhead_share": 1 - mt_engine / mt_wall,
        "turn_overhead_target": 0.15,
        "later_turns_prompt_tokens_cached_share": later_c / later_p if later_p else None,
    }
    result = {
        "command": "python bench/multiturn.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        "machine": machine_info(),
        "load_before": load,
        "rounds": rounds,
        "summary": summary,
    }
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
