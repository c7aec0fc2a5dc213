"""The request sent to the classifier model: a problem, its numbered solutions, and the answer format."""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You compare several solutions to the same problem and sort them by the method they use. You answer with JSON only."
)

INSTRUCTIONS = """\
Below are a problem and {n} solutions to it, numbered 1 to {n}. Group the solutions by their \
OVERARCHING METHOD: the main idea or strategy the solution uses to reach its answer.

- Two solutions belong to the same group when they follow the same overall approach, even if they differ \
in wording, notation, variable names, the order of the steps, arithmetic details or length.
- Put them in different groups only when the approach itself differs (for example: working backwards from \
the goal versus building up from the givens, an algebraic argument versus trying cases, a formula versus a \
simulation).
- Do NOT consider correctness: a wrong or unfinished solution belongs to the group of the method it attempts. \
A solution without any recognisable method forms a group of its own."""

ANSWER_FORMAT = """\
Answer with a single JSON object and nothing else: {{"groups": [g1, g2, ..., g{n}]}}, with exactly {n} \
integers, one per solution, in the order of the solutions; solutions that share a method get the same \
integer. For example, for {m} solutions where {example_text}: {{"groups": {example}}}"""

TRUNCATION_MARK = "\n[... {omitted} more characters omitted ...]"


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to its first ``max_chars`` characters plus a note of how much was left out (unchanged if short)."""
    if max_chars < 1:
        raise ValueError(f"max_chars_per_response must be >= 1, got {max_chars!r}")
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARK.format(omitted=len(text) - max_chars)


def _example(n: int) -> tuple[int, list[int], str]:
    """A worked example of the answer format whose length differs from ``n`` (so copying it is an error)."""
    if n == 3:
        return 4, [1, 2, 1, 1], "solutions 1, 3 and 4 share a method and solution 2 uses another"
    return 3, [1, 1, 2], "solutions 1 and 2 share a method and solution 3 uses another"


def build_messages(prompt: str, responses: list[str], *, max_chars_per_response: int = 2000) -> list[dict[str, str]]:
    """Chat messages asking to group ``responses`` (the solutions to ``prompt``) by overarching method.

    Each response is numbered from 1 and cut to ``max_chars_per_response`` characters; the problem
    is cut to four times that. The model is asked for ``{"groups": [g1, ..., gn]}``.
    """
    n = len(responses)
    m, example, example_text = _example(n)
    parts = [
        INSTRUCTIONS.format(n=n),
        f"Problem:\n<problem>\n{truncate(prompt.strip(), 4 * max_chars_per_response)}\n</problem>",
    ]
    for i, response in enumerate(responses, 1):
        parts.append(f"Solution {i}:\n<solution>\n{truncate(response.strip(), max_chars_per_response)}\n</solution>")
    parts.append(ANSWER_FORMAT.format(n=n, m=m, example=example, example_text=example_text))
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]
