"""Stage delivery: hashing a stage, sending it chunk by chunk, receiving and verifying it, the cache."""
