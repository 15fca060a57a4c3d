"""The HTML page's wording (issue 33 item 7): one time format per column, no raw backticks."""

from __future__ import annotations

import dataclasses
import re

from bridge.report import build_report
from bridge.report.html import offset, render_html
from bridge.report.window import explicit_window
from tests.report.helpers import T0, URL, S, rec


def test_phase_starts_share_one_format_whatever_their_size() -> None:
    assert [offset(s) for s in (0, 8.94, 12, 75.25, 3723)] == ["0:00.0", "0:08.9", "0:12.0", "1:15.2", "1:02:03.0"]


def test_a_warning_shows_its_command_as_code_not_as_backticks() -> None:
    records = [rec(T0 + i * S // 2, {"nvidia_power_usage": 300.0}) for i in range(-2, 22)]
    built = build_report(records, window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL],
                         endpoints_successful=[URL])
    data = {**built.telemetry_data, "summary": {**built.telemetry_data["summary"],
                                                "refresh_warning": "lower the interval: `-c 100` <b>"}}
    page = render_html(dataclasses.replace(built, telemetry_data=data))
    card = re.search(r"<span>Warning</span><b>(.*?)</b></div>", page)
    assert card and card.group(1) == "lower the interval: <code>-c 100</code> &lt;b&gt;"
