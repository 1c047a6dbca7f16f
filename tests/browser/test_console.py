"""The web console in headless Chromium against real `raftq serve` processes (run by tests/browser/ci.sh).

A single node with authentication on and tasks in every state: sign in with a token, the queue counts shown are
the API's, a dead-lettered task is opened and its error group redriven, a worker (REST claim/complete, here)
completes it and the task page shows it; a read-only token sees no action button and its POSTs are refused;
another tenant sees none of it; no URL the browser requested carries the token; every console answer carries the
CSP. A node without authentication is used without a token. Then a 3-node cluster: the cluster page, opened on a
follower, follows a leadership transfer made from it.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("RAFTQ_BIN", os.path.join(ROOT, "target", "release", "raftq"))
OUT = os.path.join(ROOT, "target", "browser")
SHOTS = os.path.join(OUT, "screenshots")
DOCS = os.path.join(ROOT, "docs", "console")
UPDATE_DOCS = "--update-docs" in sys.argv
WAIT_S = 20


_GIVEN = set()


def free_port():
    """A port nothing listens on now and that this run has not handed out before: the kernel can give a port
    just closed again at once, and two nodes of one cluster were once given the same gRPC port."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class Node:
    """One `raftq serve` process on ephemeral ports; `peers` makes it a member of a cluster."""

    def __init__(self, data, secret, node_id=1, ports=None, peers=None, auth=True):
        self.id = node_id
        self.grpc, self.raft, self.http = ports or (free_port(), free_port(), free_port())
        self.url = f"http://127.0.0.1:{self.http}"
        cmd = [BIN, "serve", "--data-dir", data, "--node-id", str(node_id),
               "--grpc-addr", f"127.0.0.1:{self.grpc}", "--raft-addr", f"127.0.0.1:{self.raft}",
               "--http-addr", f"127.0.0.1:{self.http}",
               *(["--auth-hs256-secret-file", secret, "--auth-hs256-secret-create"] if auth else ["--auth", "none"])]
        for p in peers or []:
            cmd += ["--peer", p]
        self.log = open(data + ".log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def token(secret, tenant, scopes):
    out = subprocess.run([BIN, "token", "issue", "--secret-file", secret, "--tenant", tenant, "--scopes", scopes,
                          "--ttl", "1h"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def call(base, tok, method, path, body=None):
    """One REST call: (status, JSON body, headers)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if tok:
        req.add_header("authorization", "Bearer " + tok)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            raw, status, headers = r.read(), r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, headers = e.read(), e.code, e.headers
    try:
        v = json.loads(raw) if raw else None
    except ValueError:
        v = raw.decode(errors="replace")
    return status, v, headers


def ok(base, tok, method, path, body=None, want=200):
    status, v, _ = call(base, tok, method, path, body)
    assert status == want, f"{method} {path}: {status} {v}"
    return v


def wait_for(what, f, limit=WAIT_S):
    deadline = time.time() + limit
    last = None
    while time.time() < deadline:
        try:
            v = f()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 (anything: retried until the deadline)
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def claim_one(base, tok, queue, worker="w1"):
    v = ok(base, tok, "POST", "/v1/claim", {"worker_id": worker, "queues": [queue], "lease_ms": 600000})
    assert v["tasks"], f"nothing to claim in {queue}"
    return v["tasks"][0]


def seed(base, tok):
    """Tasks of `emails` in every state (one worked at a time, so each claim takes the task just made)."""
    def enqueue(**kw):
        body = {"queue": "emails", **kw}
        if "payload_base64" not in kw:
            body["payload"] = "To: ada@example.com"
        return ok(base, tok, "POST", "/v1/tasks", body, want=201)["task_id"]

    def worked(ack, body, **kw):
        tid = enqueue(max_attempts=1, **kw)
        t = claim_one(base, tok, "emails")
        assert t["id"] == tid, (t["id"], tid)
        if ack:
            ok(base, tok, "POST", f"/v1/tasks/{tid}/{ack}", {"token": t["lease"]["token"], **body})
        return tid

    for i in range(2):
        worked("complete", {"result": f"sent {i}"})
    worked("fail", {"error": "mailbox full", "retryable": False})
    dead = [worked("fail", {"error": "smtp: connection refused", "retryable": True}) for _ in range(2)]
    worked("fail", {"error": "bad address", "retryable": True})
    worked(None, {})  # in progress
    ok(base, tok, "POST", f"/v1/tasks/{enqueue()}/cancel")
    enqueue(delay_ms=3600000, payload_base64="AAECA/8=")
    for _ in range(3):
        enqueue()
    ok(base, tok, "POST", "/v1/tasks", {"queue": "reports", "payload": "daily"}, want=201)
    for key in ["eu", "eu", "us"]:
        ok(base, tok, "POST", "/v1/tasks", {"queue": "reports", "payload": key, "concurrency_key": key}, want=201)
    ok(base, tok, "POST", "/v1/schedules", {"name": "nightly-report", "interval_ms": 3600000,
                                             "task": {"queue": "reports", "payload": "nightly"}}, want=201)
    return dead


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800",
              "--disable-gpu", "--hide-scrollbars"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    # The page's viewport itself 1280×800 (what the screenshots show), whatever the window's frame takes.
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                      {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    return d


class Console:
    def __init__(self, driver, base):
        self.d, self.base = driver, base
        self.urls = []

    def find(self, css, limit=WAIT_S):
        return WebDriverWait(self.d, limit).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))

    def until(self, what, f, limit=WAIT_S):
        # The pages redraw while polling: an element found a moment ago may be gone; look again.
        return WebDriverWait(self.d, limit, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda _: f(), message=what)

    def text(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css).text

    def wait_text(self, css, *parts, limit=WAIT_S):
        """Waits until the element shows every part; on timeout says what it showed."""
        try:
            self.until(f"{css} to show {parts}", lambda: all(p in self.text(css) for p in parts), limit)
        except TimeoutException:
            raise AssertionError(f"{css} does not show {parts}: {self.text(css)!r}") from None

    def go(self, hash_):
        self.d.get(self.base + "/ui/" + hash_)

    def sign_in(self, tok):
        self.d.get(self.base + "/ui/")
        self.d.execute_script("sessionStorage.clear()")
        self.d.get(self.base + "/ui/")
        area = self.find("#token")
        # Pasted, as a user would (send_keys of a long JWT types it slowly and the same).
        self.d.execute_script("arguments[0].value = arguments[1]", area, tok)
        # With the keyboard only: the field has the focus, Tab reaches the button, Enter presses it.
        assert self.d.switch_to.active_element == area
        area.send_keys(Keys.TAB)
        focused = self.d.switch_to.active_element
        assert focused.get_attribute("id") == "signin-submit", focused.get_attribute("outerHTML")
        focused.send_keys(Keys.ENTER)
        self.find("#nav:not([hidden])")

    def shot(self, name, docs=True):
        os.makedirs(SHOTS, exist_ok=True)
        time.sleep(0.3)
        path = os.path.join(SHOTS, name + ".png")
        self.d.save_screenshot(path)
        if UPDATE_DOCS and docs:
            from PIL import Image
            os.makedirs(DOCS, exist_ok=True)
            img = Image.open(path).convert("RGB").quantize(colors=64)
            img.save(os.path.join(DOCS, name + ".png"), optimize=True)

    def requested(self):
        """Every URL the browser has requested since the last call (from Chromium's performance log)."""
        for e in self.d.get_log("performance"):
            m = json.loads(e["message"])["message"]
            if m.get("method") == "Network.requestWillBeSent":
                self.urls.append(m["params"]["request"]["url"])
        return self.urls

    def action_buttons(self):
        return self.d.find_elements(By.CSS_SELECTOR, "button[data-action]")

    def table_rows(self, css):
        # Read in one script call: the console re-renders its tables on every refresh, so cells fetched one by
        # one can go stale between two calls.
        return self.d.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
            ".map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.innerText.trim()))", css)


def check_headers(base):
    for path, ctype in [("/ui/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")]:
        status, _, headers = call(base, None, "GET", path)
        assert status == 200, (path, status)
        assert headers["content-type"].startswith(ctype), (path, headers["content-type"])
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "unsafe-inline" not in csp, (path, csp)
        assert headers["x-content-type-options"] == "nosniff", path


def single_node(tmp, d):
    secret = os.path.join(tmp, "secret.hs256")
    node = Node(os.path.join(tmp, "single"), secret)
    try:
        base = node.url
        wait_for("the node to be ready", lambda: call(base, None, "GET", "/readyz")[0] == 200)
        admin = token(secret, "acme", "enqueue,work,read,admin")
        reader = token(secret, "acme", "read")
        other = token(secret, "globex", "enqueue,work,read,admin")
        dead = seed(base, admin)
        ok(base, other, "POST", "/v1/tasks", {"queue": "globex-secret-queue", "payload": "x"}, want=201)
        check_headers(base)
        c = Console(d, base)

        # Sign in; the overview's counts are the API's.
        c.sign_in(admin)
        c.find("#queues table")
        api = {q["queue"]: q for q in ok(base, admin, "GET", "/v1/queues")["queues"]}
        keys = ["pending", "delayed", "in_progress", "completed", "failed", "cancelled", "dead_lettered"]
        shown = {r[0].split()[0]: r[1:8] for r in c.table_rows("#queues")}
        assert set(shown) == set(api), (shown, api)
        for q, v in api.items():
            assert shown[q] == [str(v[k]) for k in keys], (q, shown[q], v)
        assert api["emails"]["dead_lettered"] == 3 and api["emails"]["in_progress"] == 1, api["emails"]
        assert "globex-secret-queue" not in d.page_source
        c.shot("overview")

        # The queue page, filtered to dead letters, paged by the server.
        c.go("#/queue/emails")
        c.find("#f-state")
        c.shot("queue")
        Select(c.find("#f-state")).select_by_value("DEAD_LETTERED")
        c.find("form.filters button[type=submit]").click()
        c.until("3 dead letters listed", lambda: len(c.table_rows("main")) == 3)

        # A dead-lettered task, then its error group, redriven.
        c.go("#/task/" + dead[0])
        c.wait_text("main", dead[0], "smtp: connection refused")
        c.shot("task")
        c.find("main a[href^='#/dead/']").click()
        def smtp_group():
            return next((tr for tr in d.find_elements(By.CSS_SELECTOR, "main tbody tr")
                         if "smtp: connection refused" in tr.text), None)
        # Read within the wait: the page redraws while polling, and a row found a moment ago may be gone.
        count = c.until("the smtp group", lambda: (smtp_group() or None) and smtp_group().find_elements(By.TAG_NAME, "td")[1].text)
        assert count == "2", count
        c.shot("dead-letters")
        c.until("the smtp group's redrive", lambda: smtp_group().find_element(
            By.CSS_SELECTOR, "button[data-action=redrive-group]").click() or True)
        c.wait_text("#status", "Redrove 2 tasks")
        groups = ok(base, admin, "GET", "/v1/queues/emails/dead-letters/groups")["groups"]
        assert [g["error"] for g in groups] == ["bad address"], groups

        # A worker completes the redriven tasks; the task page shows it.
        c.go("#/task/" + dead[0])
        c.wait_text("main", dead[0], "PENDING")
        done = set()
        while len(done) < 2:
            t = claim_one(base, admin, "emails", worker="console-worker")
            ok(base, admin, "POST", f"/v1/tasks/{t['id']}/complete", {"token": t["lease"]["token"],
                                                                       "result": "delivered"})
            done.add(t["id"]) if t["id"] in dead else None
        c.wait_text("main", "COMPLETED", "delivered", limit=15)

        # A queue with fairness keys lists them: waiting and running tasks per key, and the weight an admin set
        # (weights need cluster version 2, which the node raised long before this point).
        ok(base, admin, "PUT", "/v1/queues/reports/fairness/eu", {"weight": 3})
        c.go("#/queue/reports")
        c.until("the key table", lambda: len(c.table_rows("#keys")) == 3)
        api_keys = ok(base, admin, "GET", "/v1/queues/reports/fairness")["keys"]
        want = sorted([k["key"] or "(no key)", str(k["weight"]), str(k["ready"]), str(k["running"])] for k in api_keys)
        assert ["eu", "3", "2", "0"] in want and ["us", "1", "1", "0"] in want, want
        assert sorted(r[:4] for r in c.table_rows("#keys")) == want, c.table_rows("#keys")
        c.shot("queue-keys", docs=False)

        # A concurrency key override shows on the overview, with what runs and waits under the key and its expiry,
        # as the API lists it; cleared, it goes away.
        ok(base, admin, "PUT", "/v1/concurrency-keys/eu", {"limit": 5, "ttl_s": 3600})
        c.go("#/")
        c.until("the override table", lambda: len(c.table_rows("#overrides")) == 1)
        [o] = ok(base, admin, "GET", "/v1/concurrency-keys")["overrides"]
        assert o["key"] == "eu" and o["limit"] == 5 and o["expires_at_ms"], o
        row = c.table_rows("#overrides")[0]
        assert row[:4] == ["eu", "5", str(o["running"]), str(o["pending"])], (row, o)
        assert row[4] != "never", row
        ok(base, admin, "DELETE", "/v1/concurrency-keys/eu")
        c.until("the override table gone", lambda: not c.d.find_elements(By.CSS_SELECTOR, "#overrides"))

        c.go("#/schedules")
        c.wait_text("main", "nightly-report")
        c.shot("schedules")
        c.go("#/cluster")
        c.wait_text("main", "LEADER")
        c.shot("cluster-single", docs=False)

        # A read-only token: every page without an action button, and its POSTs refused.
        c.sign_in(reader)
        for page, marker in [("#/", "#queues table"), ("#/queue/emails", "#f-state"), ("#/task/" + dead[1], "#facts"),
                             ("#/dead/emails", "main table"), ("#/schedules", "main table"), ("#/cluster", "main h1")]:
            c.go(page)
            c.find(marker)
            time.sleep(0.3)
            assert not c.action_buttons(), (page, [b.text for b in c.action_buttons()])
        refused = d.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/v1/queues/emails/pause', {method: 'POST',
                headers: {authorization: 'Bearer ' + sessionStorage.getItem('raftq.token')}})
              .then(r => r.json().then(b => done([r.status, b.error.code])));
        """)
        assert refused == [403, "SCOPE_REQUIRED"], refused

        # On a phone: nothing wider than the screen but the tables, which scroll inside their box.
        d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                          {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
        c.go("#/queue/emails")
        c.find("#f-state")
        wide = d.execute_script("return document.documentElement.scrollWidth")
        assert wide <= 390, f"the queue page is {wide} px wide on a 390 px screen"
        d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                          {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})

        # Another tenant sees only its own queue.
        c.sign_in(other)
        c.find("#queues table")
        assert "globex-secret-queue" in c.find("#queues").text
        assert "emails" not in c.find("#queues").text and "reports" not in c.find("#queues").text

        # No URL the browser requested, and no URL it shows, carried a token.
        for url in c.requested() + [d.current_url]:
            for tok in (admin, reader, other):
                assert tok not in url and tok.split(".")[2] not in url, url
        severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and "401" not in e["message"]
                  and "403" not in e["message"]]
        assert not severe, severe
        print("single node: sign-in, counts, dead-letter group redrive, read-only and tenant checks passed")
    finally:
        node.stop()


def without_auth(tmp, d):
    """A node started with --auth none: the console works without a token."""
    node = Node(os.path.join(tmp, "open"), None, auth=False)
    try:
        wait_for("the node to be ready", lambda: call(node.url, None, "GET", "/readyz")[0] == 200)
        ok(node.url, None, "POST", "/v1/tasks", {"queue": "open-queue", "payload": "x"}, want=201)
        c = Console(d, node.url)
        d.get(node.url + "/ui/")
        d.execute_script("sessionStorage.clear()")
        d.get(node.url + "/ui/")
        c.find("#open").click()
        c.find("#queues table")
        c.wait_text("#queues", "open-queue")
        c.wait_text("#who", "no authentication")
        print("no authentication: the console works without a token")
    finally:
        node.stop()


def three_nodes(tmp, d):
    secret = os.path.join(tmp, "cluster-secret.hs256")
    ports = {i: (free_port(), free_port(), free_port()) for i in (1, 2, 3)}
    peers = [f"{i}=127.0.0.1:{p[1]},127.0.0.1:{p[0]}" for i, p in ports.items()]
    # Node 1 creates the shared secret before the others read it.
    nodes = [Node(os.path.join(tmp, "n1"), secret, 1, ports[1], peers)]
    wait_for("the secret", lambda: os.path.exists(secret))
    nodes += [Node(os.path.join(tmp, f"n{i}"), secret, i, ports[i], peers) for i in (2, 3)]
    try:
        admin = token(secret, "ops", "enqueue,work,read,admin")
        for n in nodes:
            wait_for(f"node {n.id} ready", lambda n=n: call(n.url, None, "GET", "/readyz")[0] == 200, limit=30)
        status = ok(nodes[0].url, admin, "GET", "/v1/cluster/status")
        leader = status["leader_id"]
        follower = next(n for n in nodes if n.id != leader)
        target = next(n.id for n in nodes if n.id not in (leader, follower.id))
        c = Console(d, follower.url)
        c.sign_in(admin)
        c.go("#/cluster")
        # Rows with one cell (a placeholder, or a table of the page before) are not nodes.
        c.until("three reachable nodes", lambda: len([r for r in c.table_rows("main") if len(r) > 1 and r[1] in
                                                      ("LEADER", "FOLLOWER")]) == 3)
        assert c.find("#answered-by").text == str(follower.id)
        assert c.find("#leader-id").text == str(leader)
        c.shot("cluster")
        c.find(f"button[data-action=transfer-{target}]").click()
        c.until("the page to follow the new leader", lambda: c.find("#leader-id").text == str(target), limit=30)
        def roles():
            rows = {r[0]: r[1] for r in c.table_rows("main") if len(r) > 1}
            return rows.get(str(target)) == "LEADER" and rows.get(str(leader)) == "FOLLOWER"
        c.until("the table to show the new leader and the old one as a follower", roles, limit=30)
        assert ok(follower.url, admin, "GET", "/v1/cluster/status")["leader_id"] == target
        print(f"3 nodes: the console on node {follower.id} moved the leadership from {leader} to {target}")
    finally:
        for n in nodes:
            n.stop()


def main():
    started = time.time()
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="raftq-console-", dir=OUT)
    d = browser()
    try:
        single_node(tmp, d)
        without_auth(tmp, d)
        three_nodes(tmp, d)
    finally:
        d.quit()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"tests/browser: passed in {time.time() - started:.0f} s; screenshots in {SHOTS}")


if __name__ == "__main__":
    main()
