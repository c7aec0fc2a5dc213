"""plugrl's agents: functions written with the ``openai`` client that play an episode each, trained on the exact
tokens of every call they make (:func:`openai_agent`; the endpoint they call: :mod:`.endpoint`; how their calls
become trained tokens: :mod:`.episodes`)."""

from plugrl_agents.agents import AgentEpisode, openai_agent

__all__ = ["AgentEpisode", "openai_agent"]
