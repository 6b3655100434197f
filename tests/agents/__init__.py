"""End-to-end harness for real coding agents (Claude Code, Cline, Codex, Qwen Code).

``install`` pins and installs the CLIs from the npm registry into a cache folder,
``sandbox`` gives each run a throw-away HOME and working folder and a scrubbed
environment, ``setups`` writes each agent's configuration pointing at latgate, ``run``
runs one bounded turn, and ``recorder`` keeps what reached the gateway.
"""
