"""The ASGI app, its config reload, client connection limits and /ui."""
