"""The ring's data plane: the head's batching and sampling, its running figures and reply pacing, request slots,
and stage workers."""
