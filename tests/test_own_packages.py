"""plugin_errors.OWN_PACKAGES, the one table of what plugrl's own packages provide (the missing-package hints of
config keys, commands, local models, config readers and loggers), against what the packages declare."""

from __future__ import annotations

from pathlib import Path

import tomllib

from plugrl import config
from plugrl.plugin_errors import OWN_PACKAGES, own_packages

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
GROUP_OF_KIND = {
    "command": "plugrl.commands",
    "local model": "plugrl.local_models",
    "config reader": "plugrl.config_readers",
    "logger": "plugrl.loggers",
}


def _projects() -> dict[str, dict]:
    found = {}
    for pyproject in PLUGINS.glob("*/pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = project
    return found


def test_each_package_provides_what_the_table_says_it_does():
    projects = _projects()
    for package, provides in OWN_PACKAGES.items():
        assert package in projects, f"{package} is no package under plugins/"
        entry_points = projects[package].get("entry-points", {})
        for kind, names in provides.items():
            if kind == "config key":
                continue  # the keys are checked against the built config (test_config_fields)
            declared = set(entry_points.get(GROUP_OF_KIND[kind], {}))
            assert set(names) <= declared, (package, kind, set(names) - declared)


def test_every_command_local_model_reader_and_logger_of_the_packages_is_in_the_table():
    for package, project in _projects().items():
        entry_points = project.get("entry-points", {})
        for kind, group in GROUP_OF_KIND.items():
            for name in entry_points.get(group, {}):
                assert own_packages(kind).get(name) == package, (package, kind, name)


def test_the_config_keys_are_the_tables():
    assert config.PACKAGE_KEYS == own_packages("config key")
    assert config.PACKAGE_KEYS["actor.lora"] == "plugrl-lora"
