"""The Chat tab: several conversations with the ring, streamed, with each reply's timing, saved as typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from kafila.session.api.client import ApiClient, Notice, Progress, ReplyStats
from kafila.session.state import SessionState
from kafila.session.terminal.transcripts import Conversation, chats_dir, shown
from kafila.tui.format import ms, pct, short


@dataclass(frozen=True)
class ChatSettings:
    """How replies are requested."""

    max_tokens: int = 512
    temperature: float = 0.7


def stats_text(tokens_per_s: float | None, network_share: float | None,
               stages: Mapping[str, tuple[float | None, float | None]]) -> Text:
    """'31.2 tok/s · network 14% · stage ms measured/predicted: a 4.5/4.0 …' (the slowest stage in yellow)."""
    t = Text()
    t.append(f"{tokens_per_s:.1f} tok/s" if tokens_per_s is not None else "— tok/s", style="bold")
    t.append(f" · network {pct(network_share)} of each token")
    if stages:
        t.append(" · stage ms measured/predicted:", style="dim")
        slowest = max(stages, key=lambda n: stages[n][0] or stages[n][1] or 0.0)
        for name, (measured, predicted) in stages.items():
            over = measured is not None and predicted is not None and measured > predicted * 1.25
            style = "bold red" if over else "yellow" if name == slowest else ""
            t.append(f" {short(name, 12)} ", style="dim")
            t.append(f"{ms(measured, 1)}/{ms(predicted, 1)}", style=style)
    return t


class MessageView(Static):
    """One message; an assistant reply grows as its pieces arrive."""

    DEFAULT_CSS = """
    MessageView { height: auto; padding: 0 1; margin-bottom: 1; }
    MessageView.-user { color: $text; background: $boost; }
    MessageView.-error { color: $error; }
    """

    def __init__(self, role: str, content: str = "", error: str | None = None) -> None:
        super().__init__(markup=False)
        self.role, self.body, self.error = role, content, error
        self.progress = ""  # a long prompt's prefill so far, shown until the reply's first piece
        self.add_class(f"-{role}")
        self._render_text()

    def _render_text(self) -> None:
        user = self.role == "user"
        t = Text()
        t.append("you  " if user else "ring ", style="bold cyan" if user else "bold green")
        waiting = self.progress or "…"
        t.append(self.body or (waiting if self.role == "assistant" and self.error is None else ""))
        if self.error:
            t.append(f"\n⚠ {self.error}", style="bold red")
        self.update(t)

    def append(self, piece: str) -> None:
        """Add a streamed piece."""
        self.body += piece
        self._render_text()

    def show_progress(self, line: str) -> None:
        """Show how much of the prompt the ring has read (before the first piece of the reply)."""
        self.progress = line
        self._render_text()

    def fail(self, error: str) -> None:
        """Mark the reply as stopped, with why."""
        self.error = error
        self._render_text()


class ChatPane(Horizontal):
    """Conversation list on the left; messages, the last reply's timing and the prompt on the right."""

    DEFAULT_CSS = """
    ChatPane #conv-list { width: 20; border: none; border-right: solid $primary; padding: 0; }
    ChatPane #chat-main { width: 1fr; }
    ChatPane #messages { height: 1fr; }
    ChatPane #chat-stats { height: auto; max-height: 3; padding: 0 1; color: $text-muted; }
    ChatPane #prompt { dock: bottom; }
    ChatPane #chat-hint { padding: 1 2; color: $text-muted; height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+n", "new_conversation", "New"),  # "New chat" pushed "f5 Chat" off 80 columns
        Binding("escape", "stop_reply", "Stop reply", show=False),
    ]

    class ReplyFinished(Message):
        """A reply ended (messages up: the app may show its stats elsewhere)."""

        def __init__(self, stats: ReplyStats | None, error: str | None) -> None:
            super().__init__()
            self.stats, self.error = stats, error

    def __init__(self, settings: ChatSettings | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings or ChatSettings()
        self.conversations: list[Conversation] = []
        self.current = -1
        self.api_url: str | None = None
        self.model = "kafila"
        self.available = False
        self.streaming = False
        self._client: ApiClient | None = None
        self._last_stats: ReplyStats | None = None

    def compose(self) -> ComposeResult:
        yield OptionList(id="conv-list")
        with Vertical(id="chat-main"):
            with VerticalScroll(id="messages"):
                yield Static("The chat opens when the session is admitted.", id="chat-hint")
            yield Static(id="chat-stats")
            yield Input(placeholder="the chat opens when the session is admitted", id="prompt", disabled=True)

    # -- state down ---------------------------------------------------------------------------------
    def show(self, state: SessionState) -> None:
        """Enable the prompt when the ring serves; show the session's live stage timings until a reply has its own."""
        self.model = state.model or "kafila"
        url = state.api_url if state.phase == "admitted" else None
        if url != self.api_url and url is not None:
            self._client = None  # a new session URL: the next reply opens a new client
        self.api_url = url or self.api_url
        was = self.available
        self.available = url is not None
        prompt = self.query_one("#prompt", Input)
        if state.phase == "lost":
            placeholder = f"session lost — conversations are saved in {shown(chats_dir())}"
        elif not self.available:
            placeholder = f"the chat opens when the session is admitted (now: {state.phase})"
        else:
            placeholder = "type a message, Enter sends · Ctrl+N new chat · Esc stops a reply"
        # Assign only on change: each assignment repaints, and this runs on every state change.
        if prompt.disabled == self.available:
            prompt.disabled = not self.available
        if prompt.placeholder != placeholder:
            prompt.placeholder = placeholder
        if self.available and not was:
            hint = self.query_one("#chat-hint", Static)
            hint.update(f"Admitted: the ring serves {self.model}. Type below; transcripts go to {shown(chats_dir())}.")
            if not self.conversations:
                self.new_conversation()
        if self._last_stats is None and (state.tokens_per_s is not None or state.stages):
            stages = {n: (s.measured_s, s.predicted_s) for n, s in state.stages.items()}
            self.query_one("#chat-stats", Static).update(stats_text(state.tokens_per_s, state.network_share, stages))

    # -- conversations ------------------------------------------------------------------------------
    def new_conversation(self) -> Conversation:
        """Start a conversation (its transcript file is created at once) and switch to it."""
        conv = Conversation.create(api=self.api_url)
        self.conversations.append(conv)
        self.query_one(OptionList).add_option(Option(self._title(conv, len(self.conversations)), id=conv.id))
        self.switch_to(len(self.conversations) - 1)
        return conv

    @staticmethod
    def _title(conv: Conversation, n: int) -> str:
        return f"{n}. {short(conv.title, 14)}" if conv.title else f"{n}. new chat"

    def switch_to(self, index: int) -> None:
        """Show conversation `index`: its messages replace the visible ones."""
        self.current = index
        conv = self.conversations[index]
        self.query_one(OptionList).highlighted = index
        box = self.query_one("#messages", VerticalScroll)
        for view in box.query(MessageView):
            view.remove()
        box.mount_all([MessageView(m.role, m.content, m.error) for m in conv.messages])
        box.scroll_end(animate=False)
        prompt = self.query_one("#prompt", Input)
        prompt.value = conv.draft_path.read_text() if conv.draft_path.exists() else ""

    def action_new_conversation(self) -> None:
        """Ctrl+N: a fresh conversation (the previous ones stay in the list)."""
        if self.available and not self.streaming:
            self.new_conversation()
            self.query_one("#prompt", Input).focus()

    @on(OptionList.OptionSelected, "#conv-list")
    def _pick(self, event: OptionList.OptionSelected) -> None:
        if not self.streaming:
            self.switch_to(event.option_index)
            self.query_one("#prompt", Input).focus()

    # -- typing and sending ---------------------------------------------------------------------------
    @on(Input.Changed, "#prompt")
    def _draft(self, event: Input.Changed) -> None:
        # Saved on every change, so text typed into a session that then dies is still on disk.
        if 0 <= self.current < len(self.conversations):
            self.conversations[self.current].save_draft(event.value)

    @on(Input.Submitted, "#prompt")
    def _submit(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or not self.available or self.streaming:
            return
        if self.current < 0:
            self.new_conversation()
        conv = self.conversations[self.current]
        conv.add_user(event.value)
        event.input.value = ""
        self.query_one(OptionList).replace_option_prompt_at_index(self.current, self._title(conv, self.current + 1))
        box = self.query_one("#messages", VerticalScroll)
        reply = MessageView("assistant")
        box.mount_all([MessageView("user", event.value), reply])
        box.scroll_end(animate=False)
        self.streaming = True
        self._stream(conv, reply)

    def action_stop_reply(self) -> None:
        """Esc: stop the reply being streamed (what arrived so far is kept)."""
        if self.streaming:
            self.workers.cancel_group(self, "chat")

    @work(group="chat", exclusive=True, exit_on_error=False)
    async def _stream(self, conv: Conversation, reply: MessageView) -> None:
        """Stream one reply in a worker on the app's loop (aiohttp: the UI never waits on the network)."""
        from kafila.errors import KafilaError

        stats: ReplyStats | None = None
        error: str | None = None
        box = self.query_one("#messages", VerticalScroll)
        try:
            if self._client is None or self._client.url != (self.api_url or "").rstrip("/"):
                self._client = ApiClient(self.api_url or "")
            async for item in self._client.stream_reply(conv.history(), model=self.model,
                                                        max_tokens=self.settings.max_tokens,
                                                        temperature=self.settings.temperature):
                if isinstance(item, ReplyStats):
                    stats = item
                    continue
                if isinstance(item, Notice):
                    self.app.notify(item.text, title=item.source,
                                    severity="warning" if item.source == "ring" else "information")
                    continue
                if isinstance(item, Progress):
                    reply.show_progress(item.line())
                    continue
                conv.add_delta(item)
                reply.append(item)
                box.scroll_end(animate=False)
        except KafilaError as exc:
            error = str(exc)
        except BaseException:  # Esc (the worker is cancelled) or the app closing
            error = "stopped before the end"
            raise
        finally:
            conv.end_reply(stats=stats.raw if stats else None, error=error)
            if error:
                reply.fail(error)
            self.streaming = False
            self.post_message(self.ReplyFinished(stats, error))
        if stats is not None:
            self._last_stats = stats
            stages = {n: (s.measured_s, s.predicted_s) for n, s in stats.stages.items()}
            self.query_one("#chat-stats", Static).update(stats_text(stats.tokens_per_s, stats.network_share, stages))

    async def on_unmount(self) -> None:
        """Close the API client and the transcript files."""
        if self._client is not None:
            await self._client.close()
        for conv in self.conversations:
            conv.close()
