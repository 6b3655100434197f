"""Proxying: the upstream client, the SSE tap and relay, retries and fallback."""
