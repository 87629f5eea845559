"""The ring's data plane: the head's batching and sampling, request slots, and stage workers."""
