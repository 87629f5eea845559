"""The control plane: the coordinator (host), members, takeover after a loss, builds and measurement."""
