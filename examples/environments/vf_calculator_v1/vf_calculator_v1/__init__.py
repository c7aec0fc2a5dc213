from vf_calculator_v1.taskset import CalculatorTaskset

__all__ = ["CalculatorTaskset"]
