"""verl and TRL configs read into plugrl's: the config readers ``verl`` (:mod:`plugrl_compat.verl`, the fate of
every verl key in :mod:`plugrl_compat.verl_keys`) and ``trl`` (:mod:`plugrl_compat.trl`, the translation in
:mod:`plugrl_compat.trl_config`, the fate of every TRL key in :mod:`plugrl_compat.trl_keys`). The kernel never
imports them: it finds them through the entry-point group ``plugrl.config_readers`` (:mod:`plugrl.readers`).
"""
