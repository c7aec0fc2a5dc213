"""vf-sums-v1: add two numbers, answer in <answer></answer> tags. A single-turn taskset written with verifiers'
v1 API; verifiers' `null` harness (its tool-less chat loop) plays it. plugrl trains it through
`environment: verifiers:vf-sums-v1` (examples/verifiers_v1_sums.yaml)."""

import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "Add the two numbers. Write only the result, as <answer>result</answer>."
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class SumsData(vf.TaskData):
    answer: str
    """The sum, as the model should write it."""


class SumsTask(vf.Task[SumsData]):
    @vf.reward(weight=1.0)
    async def correct_answer(self, trace: vf.Trace) -> float:
        found = ANSWER.search(trace.last_reply)
        return float(found is not None and found.group(1).strip() == self.data.answer)

    @vf.reward(weight=0.2)
    async def answer_format(self, trace: vf.Trace) -> float:
        return float(ANSWER.fullmatch(trace.last_reply.strip()) is not None)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumsConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    """How many problems to build."""
    max_number: int = 20
    """The largest number to add."""
    seed: int = 0
    """Which problems: the example trains on seed 0 and validates on seed 1."""


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def load(self) -> list[SumsTask]:
        rng = random.Random(self.config.seed)
        few_shot = [vf.UserMessage(content="3 + 4"), vf.AssistantMessage(content="<answer>7</answer>")]
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(1, self.config.max_number), rng.randint(1, self.config.max_number)
            data = SumsData(
                prompt=[*few_shot, vf.UserMessage(content=f"{a} + {b}")],
                system_prompt=SYSTEM_PROMPT,
                answer=str(a + b),
            )
            tasks.append(SumsTask(data, self.config.task))
        return tasks
