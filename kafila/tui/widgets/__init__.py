"""Dashboard widgets. Each renders a part of a SessionState given to its `show(state)` (attributes down)
and posts messages for what the user does (messages up); none does I/O except the chat pane's worker."""
