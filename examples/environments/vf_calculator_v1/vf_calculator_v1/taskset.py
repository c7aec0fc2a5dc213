"""vf-calculator-v1: multiply two numbers with the calculator tool, then say the product. A multi-turn taskset
written with verifiers' v1 API: the calculator is an MCP toolset shared by the taskset's rollouts, a `@vf.stop`
ends a rollout that keeps calling it, and the reward reads the final reply."""

import random

import verifiers.v1 as vf

from vf_calculator_v1.servers.calc import CalcToolset

SYSTEM_PROMPT = "Use the calc_multiply tool to multiply the numbers, then reply with the product only."


class CalculatorData(vf.TaskData):
    answer: str


class CalculatorTask(vf.Task[CalculatorData]):
    @vf.stop
    async def three_calls(self, trace: vf.Trace) -> bool:
        return len(trace.tool_messages) >= 3

    @vf.reward(weight=1.0)
    async def correct_product(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalculatorConfig(vf.TasksetConfig):
    num_tasks: int = 500
    seed: int = 0
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalculatorTaskset(vf.Taskset[CalculatorTask, CalculatorConfig]):
    @classmethod
    def toolsets(cls, config: CalculatorConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    def load(self) -> list[CalculatorTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(12, 99), rng.randint(12, 99)
            data = CalculatorData(prompt=f"What is {a} times {b}?", system_prompt=SYSTEM_PROMPT, answer=str(a * b))
            tasks.append(CalculatorTask(data, self.config.task))
        return tasks
