"""The session's wire contract: control messages, activation frames and stage manifests."""
