"""Running a stage (a contiguous block range) on llama.cpp."""
