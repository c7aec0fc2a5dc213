"""plugrl plugin: the reward for training a rubric reward model (RRM).

Registers the reward ``grade_reward`` for data source ``grade``, and exposes the
grade parser (:func:`parse_total_score`, :func:`grade_to_score`) for other plugins
(a verifier that reads an RRM's output reuses it).
"""

from .scoring import MAX_NUMBER_CHARS, grade_reward, grade_to_score, parse_total_score

__all__ = ["MAX_NUMBER_CHARS", "grade_reward", "grade_to_score", "parse_total_score"]
