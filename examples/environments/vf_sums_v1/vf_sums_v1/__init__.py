from vf_sums_v1.taskset import SumsTaskset

__all__ = ["SumsTaskset"]
