"""plugrl's rollout servers: ``plugrl rollout-serve`` (:mod:`.server`, :mod:`.command`) and the trainer's
``server`` engine for ``rollout.mode: server`` (:mod:`.remote`, registered by :mod:`.engine`)."""
