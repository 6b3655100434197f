"""Routing: prompt-token estimation and the rules that pick a provider."""
