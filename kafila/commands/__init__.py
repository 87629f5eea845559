"""One module per CLI command: each has HELP, configure(parser) and run(args) -> int."""
