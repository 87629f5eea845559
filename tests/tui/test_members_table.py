"""The Members table shows a status that grows after its row was added (joined → serving) in full."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from kafila.session.state import MemberView, SessionState
from kafila.tui.app import KafilaApp
from tests.tui.screen_text import screen_text
from tests.tui.test_app import until

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("size", [(120, 30), (80, 24)])
async def test_serving_is_not_truncated(size: tuple[int, int]) -> None:
    st = SessionState(role="host", phase="waiting", code="kf-1")
    app = KafilaApp(st, tick_s=3600)  # no timed re-render: this test renders on demand (below)
    async with app.run_test(size=size) as pilot:
        await until(lambda: app.rendered, 60)  # a shared machine can take seconds to start an app
        await pilot.pause()
        table = app.dashboard.query_one(DataTable)
        for name in ("ada", "bo"):
            st.upsert_member(MemberView(name, status="joined", nat="ordinary", rtt_ms=1.0))
        # render now rather than on the app's next tick: this test is about the table, not the timer
        app.render_state()
        await pilot.pause()
        assert table.row_count == 2
        st.update_member("ada", status="serving")
        st.update_member("bo", status="refused")
        app.render_state()
        await pilot.pause()
        lines = screen_text(app).splitlines()
        rows = {name: next(line for line in lines if line.split()[:1] == [name]) for name in ("ada", "bo")}
        assert rows["ada"].split()[1] == "serving" and rows["bo"].split()[1] == "refused", rows
