"""The engine simulator behind ``latgate sim``: an OpenAI-compatible fake engine with a
vLLM-like timing model (FIFO batch scheduler, prefill rate, per-token time growing with
the batch), a prefix cache, tool calls and injectable faults.

Public API: :func:`create_sim_app` / :class:`SimApp` (the ASGI app), :class:`SimOptions`,
:func:`profile_for` (options standing in for a configured provider), and the clocks
(:class:`MonotonicClock`, :class:`VirtualClock` for tests).
"""

from latgate.commands.sim.app import SimApp, create_sim_app
from latgate.commands.sim.clock import Clock, MonotonicClock, VirtualClock
from latgate.commands.sim.options import SimOptions
from latgate.commands.sim.profiles import profile_for

__all__ = ["Clock", "MonotonicClock", "SimApp", "SimOptions", "VirtualClock", "create_sim_app", "profile_for"]
