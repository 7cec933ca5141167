"""HTTP handlers: chat completions, passthrough, and the admin API."""
