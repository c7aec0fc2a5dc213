"""The rewards, one per scorer of verl 0.9.1's ``default_compute_score``, each registered for the data sources verl
routes to that scorer (module-level functions, so plugrl's reward workers import them by reference)."""

from __future__ import annotations

from typing import Any

from plugrl.specs import reward

from .code import code_score
from .geo3k import geo3k_score
from .gsm8k import gsm8k_score
from .hendrycks import math_score
from .minerva import dapo_score
from .prime_math import prime_math_score
from .search_r1 import search_r1_score

GSM8K = ("openai/gsm8k",)
MATH = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO = ("math_dapo", "math", "math_dapo_reasoning", "aime*")  # verl: data_source.startswith("aime")
NUMINA = (
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
CODE = ("codecontests", "apps", "codeforces", "taco")
GEO3K = ("hiyouga/geometry3k",)
SEARCH_R1 = tuple(
    f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)
DATA_SOURCES = {
    "verl_gsm8k": GSM8K,
    "verl_math": MATH,
    "verl_math_dapo": DAPO,
    "verl_prime_math": NUMINA,
    "verl_code": CODE,
    "verl_geo3k": GEO3K,
    "verl_search_r1": SEARCH_R1,
}


@reward(*GSM8K, name="verl_gsm8k", fields=())
def verl_gsm8k(
    completion: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """verl's ``gsm8k.compute_score``: the number after the last ``#### `` equals the ground truth (as text)."""
    return gsm8k_score(completion, ground_truth, method, format_score, score)


@reward(*MATH, name="verl_math", fields=())
def verl_math(completion: str, ground_truth: Any) -> float:
    """verl's ``math_reward.compute_score``: the last box equals the ground truth after MATH's normalisation."""
    return math_score(completion, ground_truth)


@reward(*DAPO, name="verl_math_dapo", fields=("acc", "pred"))
def verl_math_dapo(completion: str, ground_truth: Any, strict_box_verify: bool = False) -> dict[str, Any]:
    """verl's ``math_dapo.compute_score``: +1 / -1, with ``acc`` and ``pred``."""
    return dapo_score(completion, ground_truth, strict_box_verify)


@reward(*NUMINA, name="verl_prime_math", fields=("format", "pred"))
def verl_prime_math(completion: str, ground_truth: Any) -> dict[str, Any]:
    """verl's ``prime_math.compute_score`` as a score (1.0 / 0.0), with ``format`` and ``pred``; seed 003's
    fallback for every data source without ``_tinyv`` (``reward.default: verl_prime_math``)."""
    return prime_math_score(completion, ground_truth)


@reward(*CODE, name="verl_code")
def verl_code(completion: str, ground_truth: Any) -> dict[str, Any]:
    """verl's ``prime_code.compute_score(..., continuous=True)``: the share of the first 10 test cases passed, the
    program run in plugrl's sandbox."""
    return code_score(completion, ground_truth)


@reward(*GEO3K, name="verl_geo3k", fields=())
def verl_geo3k(completion: str, ground_truth: Any, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """verl's ``geo3k.compute_score``: 0.9 x the boxed answer's grade + 0.1 x the think-then-box format."""
    return geo3k_score(completion, ground_truth, use_boxed, format_score)


@reward(*SEARCH_R1, name="verl_search_r1", fields=())
def verl_search_r1(completion: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0) -> float:
    """verl's ``search_r1_like_qa_em.compute_score``: exact match of the last ``<answer>`` with a target."""
    return search_r1_score(completion, ground_truth, format_score, score)
