"""Providers' and endpoints' live numbers, shared state and connectors."""
