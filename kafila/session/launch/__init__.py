"""Whole sessions from one process: a host with this machine's own member beside its coordinator; the demo."""
