"""plugrl plugin: GSM8K (grade-school math word problems).

Registers the dataset ``gsm8k``, the template ``gsm8k`` and the reward ``gsm8k_reward``
for data source ``openai/gsm8k`` (verl's name). The plugin loader collects the
decorated functions below.
"""

from .dataset import INSTRUCTION, final_answer, gsm8k_dataset, gsm8k_messages, gsm8k_template
from .scoring import DATA_SOURCE, extract_answer, ground_truth_answer, gsm8k_reward

__all__ = [
    "DATA_SOURCE",
    "INSTRUCTION",
    "extract_answer",
    "final_answer",
    "ground_truth_answer",
    "gsm8k_dataset",
    "gsm8k_messages",
    "gsm8k_reward",
    "gsm8k_template",
]
