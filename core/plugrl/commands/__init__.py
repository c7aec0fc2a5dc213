"""User commands built on the plugrl kernel: ``plugrl report`` (:mod:`plugrl.commands.report`, a dashboard PNG and
an HTML page for run directories) and ``plugrl new-plugin`` (:mod:`plugrl.commands.scaffold`, a plugin package
generator, plus the hook reference in docs/plugins.md) and ``plugrl export`` (:mod:`plugrl.commands.export`, a
checkpoint's policy as a model folder, a LoRA adapter merged or not). They use the kernel's public modules; the
kernel never imports them, so training does not depend on them: only the command line (:mod:`plugrl.cli`) reaches
them, lazily, inside the subcommand that runs each. (Tools the model calls during an episode are
:mod:`plugrl.rollout.tools`.)
"""
