"""vf-sums: add two numbers, answer in <answer></answer> tags. A verifiers SingleTurnEnv written with the
library's classic API only, as published environments are; plugrl trains it through
`environment: verifiers:vf-sums` (examples/verifiers_sums.yaml)."""

import random

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Add the two numbers. Write only the result, as <answer>result</answer>."


def _problems(n: int, seed: int, max_number: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, max_number), rng.randint(1, max_number)
        rows.append({"question": f"{a} + {b}", "answer": str(a + b), "info": {"a": a, "b": b}})
    return Dataset.from_list(rows)


def load_environment(num_train: int = 2000, num_eval: int = 64, max_number: int = 20, format_weight: float = 0.2):
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(
        funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, format_weight], parser=parser
    )
    return vf.SingleTurnEnv(
        dataset=_problems(num_train, 0, max_number),
        eval_dataset=_problems(num_eval, 1, max_number),
        system_prompt=SYSTEM_PROMPT,
        few_shot=[
            {"role": "user", "content": "3 + 4"},
            {"role": "assistant", "content": "<answer>7</answer>"},
        ],
        parser=parser,
        rubric=rubric,
    )
