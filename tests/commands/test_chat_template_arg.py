"""`--chat-template FILE` on host and demo: a file that is not a template Kafila can render is refused before
anything starts; a good one travels to the head in the assign message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafila.session.protocol import messages as m
from kafila.session.protocol.fields import MAX_CHAT_TEMPLATE
from kafila.session.protocol.manifest import CHUNK_SIZE, StageManifest
from kafila.session.settings import SessionSettings
from tests.conftest import run_kafila
from tests.engine.chat_templates.cases import template

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("command", ["host", "demo"])
def test_a_missing_or_broken_template_is_refused(command: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    for path, says in ((tmp_path / "none.jinja", "cannot read the chat template"),
                       (broken, "is not a template Kafila can render")):
        out = run_kafila(command, "--chat-template", str(path), "--api-port", "-1" if command == "host" else "0",
                         timeout=60)
        assert out.returncode == 1 and says in out.stderr, out.stderr


def test_the_template_travels_in_the_assign_message() -> None:
    text = template("Qwen-Qwen2.5-7B-Instruct")
    assign = m.Assign(epoch=1, order=("a",), head="a", ranges={"a": (0, 1)},
                      settings=SessionSettings(chat_template=text), plan={}, model="x",
                      stage=StageManifest("0" * 64, 1, CHUNK_SIZE, ("0" * 64,)), fingerprints={"a": "e" * 64})
    back = m.decode(m.encode(assign))
    assert isinstance(back, m.Assign) and back.settings.chat_template == text
    obj = json.loads(m.encode(assign))
    obj["settings"]["chat_template"] = "x" * (MAX_CHAT_TEMPLATE + 1)
    with pytest.raises(m.ProtocolError, match="chat_template"):
        m.decode(json.dumps(obj).encode())
