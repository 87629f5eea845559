"""Sessions: host, member, ring scheduling."""
