"""Reading GGUF files, describing models, and cutting stage files."""
