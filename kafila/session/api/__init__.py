"""The local chat API: an OpenAI-compatible server on loopback, its client, and who may call it."""
