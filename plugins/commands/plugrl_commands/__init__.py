"""User commands built on the plugrl kernel: ``plugrl eval`` (:mod:`plugrl_commands.evaluate`, a config's model or a
checkpoint on validation data), ``plugrl report`` (:mod:`plugrl_commands.report`, a dashboard PNG and
an HTML page for run directories), ``plugrl new-plugin`` (:mod:`plugrl_commands.scaffold`, a plugin package
generator, plus the hook reference in docs/plugins.md) and ``plugrl export`` (:mod:`plugrl_commands.export`, a
checkpoint's policy as a model folder, a LoRA adapter merged or not); :mod:`plugrl_commands.config_reference` writes
the config reference of docs/configuration.md. They use the kernel's public modules; the
kernel never imports them: its command line finds them through the entry-point group ``plugrl.commands``, whose
``register(commands)`` adds each subcommand to ``plugrl``'s parser.
"""
