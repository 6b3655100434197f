"""latgate: an OpenAI-compatible, latency-aware routing gateway for LLM serving."""

__version__ = "0.1.0"
