"""latgate's commands: ``check``, ``route``, ``clients`` and the CLI that wires them.

Each command module exposes ``add_arguments(parser)`` and ``main(args) -> int`` (the
exit code); :mod:`latgate.commands.cli` imports only the one chosen. Commands are the top layer
(tools/layers.py): they may import anything below, nothing imports them.
"""
