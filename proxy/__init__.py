"""context-proxy: an OpenAI-compatible reverse proxy that gives any agent managed, persistent context."""

__version__ = "0.1.0"
