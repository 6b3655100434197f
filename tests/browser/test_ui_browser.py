"""``/ui`` in a real headless Chromium against a running demo stack: it loads without
console errors, shows the config's providers, lists a request sent during the test
with its route reason, filters, lists retries and fallbacks as events, and is saved as
a screenshot (build/artifacts/ui.png; docs/ui.png is one of these)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from chromium import chromium
from stack import FAST, demo_stack

from latgate.commands.sim import SimOptions

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "artifacts"
BODY = {"model": "glm-5.1", "messages": [{"role": "user", "content": "hello there"}], "stream": True}
ROWS = "document.querySelectorAll('#requests tr:not(:has(.empty))')"


def rows_text() -> str:
    return f"[...{ROWS}].map(r => r.innerText).join('\\n')"


def test_the_live_page_shows_providers_and_a_request_sent_while_it_watches(tmp_path: Path) -> None:
    # The decode pool fails now and then (seeded): retries and fallbacks show as events.
    flaky = SimOptions(name="tile-rt", error_rate=0.3, seed=7, **{**FAST, "default_max_tokens": 24})
    with demo_stack(tile=flaky) as stack, chromium(tmp_path / "profile") as page:
        page.send("Page.navigate", url=stack.url + "/ui")
        names = page.wait_for(
            "document.querySelectorAll('[data-provider]').length >= 3 && "
            "[...document.querySelectorAll('[data-provider]')].map(c => c.dataset.provider)"
        )
        assert sorted(names) == sorted(stack.config.providers)
        assert page.evaluate(f"{ROWS}.length") == 0  # nothing sent yet
        page.wait_for("document.getElementById('live').classList.contains('on')")

        response = httpx.post(stack.v1 + "/chat/completions", json=BODY, headers={"X-Latency-Sensitive": "1"}, timeout=30)
        assert response.status_code == 200
        reason, provider = response.headers["x-latgate-route-reason"], response.headers["x-latgate-provider"]
        row = page.wait_for(f"{ROWS}.length === 1 && {rows_text()}")
        assert provider in row and reason in row and "200" in row

        sent = 1
        with httpx.Client(base_url=stack.v1, timeout=30) as client:
            for batch in range(4):  # each batch after the page showed the last: spread over polls
                for index in range(6):
                    headers = {"X-Latency-Sensitive": "1"} if index % 2 else {}
                    body = {**BODY, "stream": index % 3 != 0, "max_tokens": 8 + 4 * index + batch}
                    assert client.post("/chat/completions", json=body, headers=headers).status_code == 200
                sent += 6
                page.wait_for(f"{ROWS}.length === {sent}")
        state = httpx.get(stack.url + "/ui/state").json()
        expected = sum("latency_sensitive" in r["reason"] for r in state["requests"])
        page.evaluate(
            "(() => { const f = document.getElementById('filter'); f.value = 'latency_sensitive';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        assert page.evaluate(f"{ROWS}.length") == expected > 0
        assert all("latency_sensitive" in line for line in page.evaluate(rows_text()).splitlines())
        page.evaluate(
            "(() => { const f = document.getElementById('filter'); f.value = '';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        assert state["events"], "the flaky decode pool made no retry or fallback"
        page.wait_for("document.querySelectorAll('#events li:not(.empty)').length > 0")
        page.wait_for("document.querySelectorAll('canvas.chart').length === 3")
        # a prefix index line only where the pool has endpoints to place a prefix among
        single = [n for n, p in state["providers"].items() if len(p["endpoints"]) == 1 and p["endpoints"][0].get("prefix_index")]
        assert single, "no single-endpoint pool with a prefix index in the demo stack"
        shown = "[...document.querySelectorAll('[data-provider]')].filter(c => c.querySelector('.prefix-index'))"
        assert not set(page.evaluate(f"{shown}.map(c => c.dataset.provider)")) & set(single)
        page.screenshot(ARTIFACTS / "ui.png")
        assert (ARTIFACTS / "ui.png").stat().st_size > 10_000
        assert page.errors == [], json.dumps(page.errors, indent=1)
