"""The keys of rollout servers, which this package adds to the run config's ``rollout`` section (entry-point group
``plugrl.config_fields``): where the servers are (``server_urls``, ``servers``), how new weights reach them
(``weight_transport``, ``weight_chunk_mb``) and how long a request may take (``server_timeout_s``). They are for
``rollout.mode: server``, the kernel's key, whose engine this package registers."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from plugrl.config import ConfigFields, Section, turn_off

SERVER_KEYS = ("server_urls", "servers", "weight_transport", "weight_chunk_mb", "server_timeout_s")


class ServerKeys(Section):
    server_urls: list[str] = Field(
        default_factory=list,
        description="mode server: the rollout servers (http://host:port), started with `plugrl rollout-serve`; "
        "requests are shared out over them. Empty: plugrl starts rollout.servers of them on 127.0.0.1.",
    )
    servers: int = Field(
        1, ge=1, description="mode server without server_urls: how many rollout servers plugrl starts on this host."
    )
    weight_transport: Literal["auto", "shm", "http", "collective"] = Field(
        "auto",
        description="mode server: how new weights reach the servers. shm: a safetensors file in /dev/shm that "
        "servers on this host read in place; http: the file's bytes in the request (servers on other hosts); "
        "collective: a process group of the trainer's rank 0 and every server (gloo on CPU, NCCL when the weights "
        "and the servers' engines are on GPUs), the tensors broadcast one at a time, no file and no HTTP body (the "
        "servers must reach the trainer's host); auto: shm when every server is on this host, else http.",
    )
    weight_chunk_mb: int = Field(
        256, ge=1, description="mode server: the weights are pushed in pieces of at most this many MiB."
    )
    server_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="mode server: how long a request to a rollout server may take (a generation or a weight "
        "piece), and how long a started server may take to come up.",
    )


class ServerChecks(Section):
    @model_validator(mode="after")
    def _server_mode(self) -> ServerChecks:
        """rollout.mode=server: the servers keep their own memory (no sleep); a LoRA policy reaches them merged
        (plugrl-lora's check)."""
        r = self.rollout  # type: ignore[attr-defined]
        if r.mode != "server":
            for key in SERVER_KEYS:
                # a run's config.yaml sets every key: only a value other than the default is the user's
                if getattr(r, key) != type(r).model_fields[key].get_default(call_default_factory=True):
                    raise ValueError(
                        f"rollout.{key} is for rollout.mode=server, but rollout.mode is {r.mode}; set "
                        f"rollout.mode=server or remove rollout.{key}"
                    )
            return self
        if r.free_cache_engine and "free_cache_engine" in r.model_fields_set:
            raise ValueError(
                "rollout.free_cache_engine=true puts a colocated engine to sleep while training; rollout servers "
                "have devices of their own and never sleep: remove it (or set rollout.mode=colocate)"
            )
        turn_off(r, "free_cache_engine")
        for url in r.server_urls:
            if not re.match(r"^https?://[^/\s]+(:\d+)?/?$", url):
                raise ValueError(f"rollout.server_urls: {url!r} is not http://host:port (a rollout server's address)")
        return self


FIELDS = ConfigFields(sections={"rollout": ServerKeys, "": ServerChecks})
