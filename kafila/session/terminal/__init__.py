"""What a person at a terminal sees of a session: event printing, reports, chat transcripts."""
