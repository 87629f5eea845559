"""Chats with tools as llama.cpp's `--jinja` serves them: the template (template.py), the model's tool-call
dialect and its prompt (formats.py), the grammar that forces a call (grammar.py), and reading calls back
out of the reply, whole (parse.py) or as it streams (stream.py)."""
