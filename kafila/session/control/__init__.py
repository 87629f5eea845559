"""Members: joining, serving, taking coordination over after the host's loss, heartbeats, measurement."""
