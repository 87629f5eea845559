"""The host's coordination: admitting members, planning and admitting each epoch's ring, handling losses, builds."""
