"""First paint of every console page, in headless Chromium, against a running node (bench/console.sh starts one
with N tasks). For each page, RUNS fresh loads: first contentful paint, and the moment the page first showed its
data (the console marks it, `renderedAt`), both in ms from the start of navigation; prints the median and the
spread, and the bytes the page transferred."""

import json
import os
import statistics
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "browser"))
from test_console import browser  # noqa: E402  (the same headless Chromium at 1280x800)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def get(base, path):
    with urllib.request.urlopen(base + path) as r:
        return json.load(r)


def main():
    base, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    queues = get(base, "/v1/queues")["queues"]
    q = max(queues, key=lambda x: x["pending"])["queue"]
    task = get(base, f"/v1/tasks?queue={q}&page_size=1")["tasks"][0]["id"]
    pages = [("overview", "#/"), ("queue", f"#/queue/{q}"), ("task", f"#/task/{task}"), ("dead letters", f"#/dead/{q}"),
             ("schedules", "#/schedules"), ("cluster", "#/cluster")]
    d = browser()
    try:
        d.get(base + "/ui/")
        WebDriverWait(d, 30).until(lambda _: d.find_elements(By.ID, "open"))[0].click()
        print(f"{'page':<13} {'first paint ms':>22} {'data shown ms':>22} {'KB':>6}")
        for name, frag in pages:
            fcp, shown, kb = [], [], 0
            for _ in range(runs):
                d.get("about:blank")
                d.get(base + "/ui/" + frag)
                WebDriverWait(d, 60, poll_frequency=0.005).until(
                    lambda _: d.execute_script("return document.documentElement.dataset.renderedAt"))
                shown.append(float(d.execute_script("return document.documentElement.dataset.renderedAt")))
                fcp.append(d.execute_script(
                    "const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null")
                    or float("nan"))
                kb = d.execute_script(
                    "return (performance.getEntriesByType('navigation')[0].transferSize + performance"
                    ".getEntriesByType('resource').reduce((s, r) => s + r.transferSize, 0)) / 1024")
            def fmt(v):
                # A load whose first paint Chromium did not record (it reuses a paint) is left out, and counted.
                got = [x for x in v if x == x]
                if not got:
                    return "none recorded"
                miss = f" [{len(v) - len(got)} none]" if len(got) < len(v) else ""
                return f"{statistics.median(got):6.0f} ({min(got):.0f}-{max(got):.0f}){miss}"
            print(f"{name:<13} {fmt(fcp):>22} {fmt(shown):>22} {kb:6.0f}")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
