"""One module per advantage estimator (or family of closely related ones).

To add one: write ``estimators/<name>.py`` with a function decorated
``@plugrl.advantage_estimator("<name>")`` taking ``(batch: AdvantageBatch, config)`` and
returning an ``AdvantageResult``, then re-export it from ``plugrl_advantages/__init__.py``.
Shared helpers are in :mod:`plugrl_advantages.common`.
"""
