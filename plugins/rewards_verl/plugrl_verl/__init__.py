"""plugrl plugin ``verl_default``: verl's default rewards, routed by data_source as verl 0.9.1's
``default_compute_score`` routes them, each scoring as verl's own function does.

| reward | data sources | verl's scorer |
| --- | --- | --- |
| ``verl_gsm8k`` | ``openai/gsm8k`` | ``gsm8k`` |
| ``verl_math`` | ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500`` | math_reward |
| ``verl_math_dapo`` | ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*`` | ``math_dapo`` |
| ``verl_prime_math`` | the six ``numina_*`` sources | ``prime_math`` |
| ``verl_code`` | ``codecontests``, ``apps``, ``codeforces``, ``taco`` | ``prime_code`` (in plugrl's sandbox) |
| ``verl_geo3k`` | ``hiyouga/geometry3k`` | ``geo3k`` |
| ``verl_search_r1`` | the seven ``searchR1_*`` sources | ``search_r1_like_qa_em`` |

Any of them can score the data sources no route names: ``reward.default: verl_prime_math`` is TinyV's fallback
(seed 003). Model output is never executed outside plugrl's sandbox (:mod:`plugrl_verl.safe_eval`).
"""

from .rewards import (
    DATA_SOURCES,
    verl_code,
    verl_geo3k,
    verl_gsm8k,
    verl_math,
    verl_math_dapo,
    verl_prime_math,
    verl_search_r1,
)

__all__ = [
    "DATA_SOURCES",
    "verl_code",
    "verl_geo3k",
    "verl_gsm8k",
    "verl_math",
    "verl_math_dapo",
    "verl_prime_math",
    "verl_search_r1",
]
