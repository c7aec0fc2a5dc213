"""plugrl-dapo: DAPO's dynamic sampling and soft overlong punishment (Yu et al. 2025), as verl's DAPO recipe keys
ask for them.

- :mod:`plugrl_dapo.fields`: the keys (``algorithm.filter_groups``, ``data.gen_batch_size``,
  ``reward.overlong_buffer``), entry point ``dapo`` of the group ``plugrl.config_fields``; every run config imports
  it, so this package imports nothing else on import.
- :mod:`plugrl_dapo.sampling`: what the trainer calls when they are on (entry point of the group
  ``plugrl.dynamic_sampling``, found by :func:`plugrl.episodes.dynamic_sampling`): a step's groups that vary,
  refilled from further prompts (``collect``), and the overlong penalty added to each score (``penalties``).
"""
