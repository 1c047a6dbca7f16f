//! The `raftq` binary as a user runs it, against real nodes: the client commands drive the SDK and print a task
//! in REST's JSON shape, every client command takes the same flags, `token issue` mints from the secret file the
//! environment names, the README's worker example runs, and logs redirected to a pipe carry no colour codes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq::config::AuthMode;
use raftq_client::{NewTask, Producer, ProducerConfig, TaskState};
use serde_json::Value;

use crate::procs::*;
use crate::rest::http;
use crate::support::*;

/// What a `raftq` run printed.
#[derive(Debug)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        assert!(self.ok, "the command failed: {self:?}");
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// `raftq` with none of the caller's client settings: no token, no address, and a local data directory with no
/// secret in it (so no token is minted unless a test asks for one).
fn raftq_cmd(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_raftq"));
    cmd.args(args);
    for v in ["RAFTQ_ADDR", "RAFTQ_TOKEN", "RAFTQ_CA_FILE", "RAFTQ_AUTH_HS256_SECRET_FILE", "RAFTQ_LOG", "NO_COLOR"] {
        cmd.env_remove(v);
    }
    cmd.env("RAFTQ_DATA_DIR", "/nonexistent/raftq-cli-test");
    cmd
}

/// A `raftq` process that is killed if the test ends without stopping it.
struct Proc(std::process::Child);

impl Proc {
    fn spawn(mut cmd: std::process::Command) -> Proc {
        Proc(cmd.spawn().expect("spawn raftq"))
    }

    /// SIGTERM, then its exit status (within 20 s).
    async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.0.id().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 20 s of SIGTERM");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn raftq(args: &[&str]) -> Run {
    raftq_env(args, &[]).await
}

async fn raftq_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::from(raftq_cmd(args));
    cmd.envs(env.iter().copied()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("raftq {args:?} did not end within 60 s"))
        .expect("run raftq");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn addr(n: &TestNode) -> String {
    format!("http://{}", n.node().grpc_addr)
}

/// Lines a child writes to a pipe, collected by a thread.
fn collect_lines(pipe: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            sink.lock().expect("lock").push(line);
        }
    });
    lines
}

async fn wait_lines(lines: &Mutex<Vec<String>>, limit: Duration, what: &str, f: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + limit;
    while !f(&lines.lock().expect("lock")) {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}; lines: {:?}", lines.lock().expect("lock"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_a_task_in_the_rest_shape_and_works_it_by_hand() {
    let n = TestNode::start().await;
    let a = addr(&n);
    let http_addr = n.node().http_addr;
    let enq =
        raftq(&["task", "enqueue", "--addr", &a, "--queue", "cli-q", "--payload", "hello", "--output", "json"]).await;
    let id = enq.json()["task_id"].as_str().expect("task_id").to_string();

    // `task get` prints exactly what REST answers for the task.
    let got = raftq(&["task", "get", &id, "--addr", &a, "--output", "json"]).await.json();
    let (code, _, rest) = http(http_addr, "GET", &format!("/v1/tasks/{id}"), None).await;
    assert_eq!(code, 200);
    assert_eq!(got, rest, "the CLI and REST render a task alike");
    assert_eq!((got["state"].as_str(), got["payload"].as_str()), (Some("PENDING"), Some("hello")));

    let claimed = raftq(&[
        "task", "claim", "--addr", &a, "--queue", "cli-q", "--worker", "w", "--lease", "30s", "--output", "json",
    ])
    .await
    .json();
    let t = &claimed.as_array().expect("an array")[0];
    assert_eq!(t["id"].as_str(), Some(id.as_str()));
    let token = t["lease"]["token"].as_str().expect("the token, a decimal string as in REST").to_string();
    let rest_keys: Vec<&String> = rest.as_object().expect("object").keys().collect();
    assert_eq!(t.as_object().expect("object").keys().collect::<Vec<_>>(), rest_keys, "the same shape when claimed");

    let beat =
        raftq(&["task", "heartbeat", &id, "--addr", &a, "--token", &token, "--percent", "50", "--output", "json"])
            .await
            .json();
    assert_eq!(beat["state"].as_str(), Some("IN_PROGRESS"));
    let done = raftq(&[
        "task",
        "complete",
        &id,
        "--addr",
        &a,
        "--token",
        &token,
        "--result",
        "done",
        "--then",
        "cli-next:p",
        "--output",
        "json",
    ])
    .await
    .json();
    assert_eq!(done["state"].as_str(), Some("COMPLETED"));
    assert_eq!(done["follow_up_ids"].as_array().map(Vec::len), Some(1), "{done}");
    let again = raftq(&["task", "complete", &id, "--addr", &a, "--token", &token]).await;
    assert!(!again.ok && again.stderr.contains("NOT_IN_PROGRESS"), "a second completion is refused: {again:?}");

    let result = raftq(&["task", "result", &id, "--addr", &a, "--wait", "1s", "--output", "json"]).await.json();
    assert_eq!((result["done"].as_bool(), result["result"].as_str()), (Some(true), Some("done")), "{result}");
    assert_eq!(result["result_base64"].as_str(), Some("ZG9uZQ=="));
    let queues = raftq(&["queues", "--addr", &a, "--queue", "cli-q", "--output", "json"]).await.json();
    assert_eq!((queues[0]["queue"].as_str(), queues[0]["completed"].as_u64()), (Some("cli-q"), Some(1)), "{queues}");
    assert_eq!(queues[0]["paused"].as_bool(), Some(false));

    // `jobs list` (with the old `--json` spelling) answers as REST's GET /v1/tasks.
    let listed = raftq(&["jobs", "list", "--addr", &a, "--queue", "cli-q", "--json"]).await.json();
    let (_, _, rest_list) = http(http_addr, "GET", "/v1/tasks?queue=cli-q", None).await;
    assert_eq!(listed, rest_list);
    assert_eq!(listed["tasks"][0]["state"].as_str(), Some("COMPLETED"));

    // A dead letter: listed as REST lists it, then redriven.
    let dead = raftq(&["task", "enqueue", "--addr", &a, "--queue", "cli-dlq", "--max-attempts", "1"]).await;
    let dead = dead.stdout.trim().to_string();
    let claimed = raftq(&["task", "claim", "--addr", &a, "--queue", "cli-dlq", "--output", "json"]).await.json();
    let token = claimed[0]["lease"]["token"].as_str().expect("token").to_string();
    let failed = raftq(&["task", "fail", &dead, "--addr", &a, "--token", &token, "--retryable"]).await;
    assert_eq!(failed.stdout.trim(), "DEAD_LETTERED", "{failed:?}");
    let listed = raftq(&["dlq", "list", "--addr", &a, "--queue", "cli-dlq", "--output", "json"]).await.json();
    let (_, _, rest_dead) = http(http_addr, "GET", "/v1/queues/cli-dlq/dead-letters", None).await;
    assert_eq!(listed, rest_dead["tasks"]);
    let redriven = raftq(&["dlq", "redrive", "--addr", &a, "--queue", "cli-dlq", "--all", "--output", "json"]).await;
    assert_eq!(redriven.json(), serde_json::json!({ "redriven": [dead] }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_command_sends_the_auth_token_and_token_issue_mints_from_the_environments_secret_file() {
    let dir = tempfile::tempdir().expect("dir");
    let secret = dir.path().join("cluster.hs256");
    std::fs::write(&secret, format!("{}\n", "7e".repeat(32))).expect("write secret");
    let s = secret.clone();
    let n = TestNode::start_with(move |c| {
        c.auth = AuthMode::Jwt;
        c.auth_hs256_secret_file = Some(s);
    })
    .await;
    let a = addr(&n);
    let secret_env = [("RAFTQ_AUTH_HS256_SECRET_FILE", secret.to_str().expect("utf-8"))];
    let issue = ["token", "issue", "--tenant", "cli-t", "--scopes", "enqueue,work,read,admin"];
    let without = raftq(&issue).await;
    assert!(!without.ok, "no secret without the variable (no local node here): {without:?}");
    let minted = raftq_env(&issue, &secret_env).await;
    assert!(minted.ok, "{minted:?}");
    let token = minted.stdout.trim().to_string();

    let id = raftq(&["task", "enqueue", "--addr", &a, "--auth-token", &token, "--queue", "cli-auth", "--payload", "p"])
        .await
        .stdout
        .trim()
        .to_string();
    let got = raftq(&["task", "get", &id, "--addr", &a, "--auth-token", &token, "--output", "json"]).await.json();
    assert_eq!(got["tenant"].as_str(), Some("cli-t"), "the minted token's tenant");
    // Without a token, the other client commands also mint one from the variable's secret (tenant default).
    let local = raftq_env(&["queues", "--addr", &a, "--output", "json"], &secret_env).await;
    assert_eq!(local.json(), serde_json::json!([]), "tenant default has no queues");

    let commands: &[&[&str]] = &[
        &["task", "get", &id],
        &["queues"],
        &["dlq", "list", "--queue", "cli-auth"],
        &["jobs", "paused"],
        &["jobs", "capacity"],
        &["cluster", "status"],
        &["cluster", "digest"],
    ];
    for c in commands {
        for tok in [token.as_str(), "not-a-jwt"] {
            let mut args = c.to_vec();
            args.extend(["--addr", a.as_str(), "--output", "json", "--auth-token", tok]);
            let run = raftq(&args).await;
            if tok == token {
                assert!(run.ok, "{c:?} with the token: {run:?}");
            } else {
                assert!(!run.ok && run.stderr.contains("TOKEN_INVALID"), "{c:?} with a bad token: {run:?}");
            }
        }
    }
    // The worker takes the same flags (and the old --token): a refused token ends it with the reason.
    let bad = raftq(&["worker", "--addr", &a, "--auth-token", "not-a-jwt", "--queue", "cli-auth", "--", "cat"]).await;
    assert!(!bad.ok && bad.stderr.contains("TOKEN_INVALID"), "{bad:?}");
    let mut cmd = raftq_cmd(&["worker", "--addr", &a, "--token", &token, "--output", "json", "--queue", "cli-auth"]);
    cmd.args(["--", "cat"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut worker = Proc::spawn(cmd);
    let lines = collect_lines(worker.0.stdout.take().expect("piped"));
    wait_lines(&lines, Duration::from_secs(30), "the task completed", |l| l.iter().any(|l| l.contains(&id))).await;
    let status = worker.terminate().await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_worker_example_runs_and_reports_each_outcome_as_json_without_colour_codes() {
    let n = TestNode::start().await;
    let a = addr(&n);
    let p = Producer::connect(ProducerConfig { addrs: vec![a.clone()], ..Default::default() }).await.expect("connect");
    let good = p.enqueue(NewTask::new("emails", "To: ada@example.com\nHello").max_attempts(2)).await.expect("enqueue");
    let bad = p.enqueue(NewTask::new("emails", "Hello, nobody").max_attempts(1)).await.expect("enqueue");
    let outbox = tempfile::tempdir().expect("outbox");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/send-email.sh");
    let mut cmd = raftq_cmd(&["worker", "--addr", &a, "--queue", "emails", "--concurrency", "2", "--output", "json"]);
    cmd.arg("--").arg(&script).env("OUTBOX", outbox.path()).env("RAFTQ_LOG", "info");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut worker = Proc::spawn(cmd);
    let stdout = collect_lines(worker.0.stdout.take().expect("piped"));
    let stderr = collect_lines(worker.0.stderr.take().expect("piped"));
    let events = |lines: &[String]| -> Vec<Value> {
        lines.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
    };
    wait_lines(&stdout, Duration::from_secs(30), "both outcomes applied", |l| {
        events(l).iter().filter(|e| e["event"] == "applied").count() == 2
    })
    .await;
    let applied: Vec<(String, String, String)> = events(&stdout.lock().expect("lock"))
        .iter()
        .map(|e| (e["task_id"].as_str().unwrap_or("").into(), e["outcome"].to_string(), e["state"].to_string()))
        .collect();
    assert!(applied.contains(&(good.task_id.clone(), "\"complete\"".into(), "\"COMPLETED\"".into())), "{applied:?}");
    assert!(applied.contains(&(bad.task_id.clone(), "\"fail\"".into(), "\"DEAD_LETTERED\"".into())), "{applied:?}");

    let r = p.result(&good.task_id, Duration::ZERO).await.expect("result");
    assert_eq!(String::from_utf8_lossy(&r.result), "sent to ada@example.com (attempt 1 of 2)\n");
    let sent = std::fs::read_to_string(outbox.path().join(format!("{}.eml", good.task_id))).expect("the outbox file");
    assert!(sent.starts_with("To: ada@example.com"), "{sent}");
    let t = p.get(&bad.task_id).await.expect("get");
    assert_eq!((t.state, t.last_error.as_str()), (TaskState::DeadLettered, "no To: line in the payload"));

    assert!(worker.terminate().await.success());
    wait_lines(&stdout, Duration::from_secs(5), "the stopped event", |l| l.iter().any(|l| l.contains("\"stopped\"")))
        .await;
    let stopped = events(&stdout.lock().expect("lock")).into_iter().find(|e| e["event"] == "stopped").expect("stopped");
    assert_eq!((stopped["completed"].as_u64(), stopped["failed"].as_u64()), (Some(1), Some(1)), "{stopped}");
    let log = stderr.lock().expect("lock").clone();
    assert!(log.iter().any(|l| l.contains("worker started")), "the SDK logged to stderr: {log:?}");
    assert!(log.iter().all(|l| !l.contains('\x1b')), "no colour codes in a redirected log: {log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let root = tempfile::tempdir().expect("dir");
    let (g, r, h) = (free_port(), free_port(), free_port());
    let (g, r, h) = (format!("127.0.0.1:{g}"), format!("127.0.0.1:{r}"), format!("127.0.0.1:{h}"));
    let config: PathBuf = write_config(root.path(), 1, &g, &r, &h, "");
    let mut cmd = raftq_cmd(&["serve", "--config"]);
    cmd.arg(&config).env("RAFTQ_LOG", "info").stdout(Stdio::null()).stderr(Stdio::piped());
    let mut server = Proc::spawn(cmd);
    let lines = collect_lines(server.0.stderr.take().expect("piped"));
    wait_lines(&lines, Duration::from_secs(30), "the startup log", |l| {
        l.iter().any(|l| l.contains("effective configuration"))
    })
    .await;
    server.terminate().await;
    let log = lines.lock().expect("lock").clone();
    assert!(log.iter().all(|l| !l.contains('\x1b')), "no colour codes in a redirected log: {log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_commands_and_the_sdk_admin_see_every_node_and_move_the_leadership() {
    let c = ProcCluster::start(3, FAST).await;
    let leader = c.wait_leader(Duration::from_secs(30)).await;
    let follower = c.nodes.iter().find(|n| n.id != leader).expect("a follower");
    let at = format!("http://{}", follower.grpc);
    let p = Producer::connect(ProducerConfig { addrs: vec![at.clone()], ..Default::default() }).await.expect("connect");
    let all = p.admin().cluster_status().await.expect("cluster status");
    assert_eq!(all.len(), 3);
    let roles: Vec<&str> = all.iter().map(|m| m.status.as_ref().expect("reachable").role.as_str()).collect();
    assert_eq!(roles.iter().filter(|r| **r == "LEADER").count(), 1, "{roles:?}");

    let status = raftq(&["cluster", "status", "--addr", &at, "--output", "json"]).await.json();
    assert_eq!(status["leader"].as_u64(), Some(leader), "{status}");
    let nodes = status["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| n["reachable"] == true), "{status}");

    // A follower serves the CLI's writes and reads, forwarding them to the leader.
    let id = raftq(&["task", "enqueue", "--addr", &at, "--queue", "cli-cluster", "--payload", "p"]).await;
    assert!(id.ok, "{id:?}");
    let got = raftq(&["task", "get", id.stdout.trim(), "--addr", &at, "--output", "json"]).await.json();
    assert_eq!(got["state"].as_str(), Some("PENDING"));

    // Asked at a follower, the transfer reaches the leader.
    let to = follower.id;
    let moved =
        raftq(&["cluster", "transfer-leader", "--addr", &at, "--to", &to.to_string(), "--output", "json"]).await;
    assert_eq!(moved.json()["leader"].as_u64(), Some(to), "{moved:?}");
    assert_eq!(p.admin().status().await.expect("status").leader_id, Some(to));

    // Every node answers with its applied index. On a loaded machine a node may miss one round (the line says
    // `"reachable": false`), so the command is run again, within a limit; each miss is printed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let digests = raftq(&["cluster", "digest", "--addr", &at, "--output", "json"]).await;
        assert!(digests.ok, "{digests:?}");
        let lines: Vec<Value> = digests.stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        assert_eq!(lines.len(), 3, "one line per member: {digests:?}");
        if lines.iter().all(|d| d["applied_index"].as_u64().unwrap_or(0) > 0) {
            break;
        }
        eprintln!("not every node answered: {digests:?}");
        assert!(Instant::now() < deadline, "not every node answered within 20 s: {digests:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_fairness_set_and_list_weights() {
    let n = TestNode::start().await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 2).await;
    let a = addr(&n);
    let set = raftq(&["queues", "fairness", "set", "--addr", &a, "--queue", "cf", "--key", "k", "--weight", "3"]).await;
    assert!(set.ok && set.stdout.contains('3'), "{set:?}");
    let unkeyed = ["queues", "fairness", "set", "--addr", &a, "--queue", "cf", "--weight", "2", "--output", "json"];
    let set = raftq(&unkeyed).await.json();
    assert_eq!(set[0]["key"].as_str(), Some(""), "no --key: the tasks without a concurrency key");
    let list = raftq(&["queues", "fairness", "list", "--addr", &a, "--queue", "cf", "--output", "json"]).await.json();
    let got: Vec<(&str, u64)> = list
        .as_array()
        .expect("an array")
        .iter()
        .map(|k| (k["key"].as_str().unwrap_or("?"), k["weight"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(got, vec![("", 2), ("k", 3)]);
    let bad = raftq(&["queues", "fairness", "set", "--addr", &a, "--queue", "cf", "--key", "k", "--weight", "0"]).await;
    assert!(!bad.ok && bad.stderr.contains("INVALID_ARGUMENT"), "{bad:?}");
    // The counts view is still `raftq queues`.
    assert!(raftq(&["queues", "--addr", &a, "--output", "json"]).await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_rate_limit_set_and_list_buckets() {
    let n = TestNode::start().await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 2).await;
    let a = addr(&n);
    let set = ["queues", "rate-limit", "set", "--addr", &a, "--queue", "cr", "--rate", "30/min", "--output", "json"];
    let set = raftq(&set).await.json();
    assert_eq!((set[0]["key"].is_null(), set[0]["per_second"].as_f64()), (true, Some(0.5)), "no --key: the queue");
    assert_eq!(set[0]["burst"].as_u64(), Some(1), "the default burst is at least 1");
    let keyed =
        ["queues", "rate-limit", "set", "--addr", &a, "--queue", "cr", "--key", "k", "--rate", "20", "--burst", "5"];
    let keyed = raftq(&keyed).await;
    assert!(keyed.ok && keyed.stdout.contains("20"), "{keyed:?}");
    let list = raftq(&["queues", "rate-limit", "list", "--addr", &a, "--queue", "cr", "--output", "json"]).await.json();
    let got: Vec<(Option<&str>, u64)> = list
        .as_array()
        .expect("an array")
        .iter()
        .map(|l| (l["key"].as_str(), l["burst"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(got, vec![(None, 1), (Some("k"), 5)]);
    let bad = raftq(&["queues", "rate-limit", "set", "--addr", &a, "--queue", "cr", "--rate", "3/day"]).await;
    assert!(!bad.ok, "{bad:?}");
    let off = raftq(&["queues", "rate-limit", "set", "--addr", &a, "--queue", "cr", "--rate", "0"]).await;
    assert!(off.ok, "{off:?}");
    let list = raftq(&["queues", "rate-limit", "list", "--addr", &a, "--output", "json"]).await.json();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "rate 0 removed the queue's bucket: {list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_enqueue_takes_debounce_and_singleton_keys() {
    let n = TestNode::start().await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
    let a = addr(&n);
    let deb = |p: &str| {
        let args = ["task", "enqueue", "--addr", &a, "--queue", "ck", "--payload", p, "--output", "json"];
        let keyed = ["--debounce-key", "d", "--debounce-delay", "1m", "--debounce-max-wait", "5m"];
        [&args[..], &keyed[..]].concat().into_iter().map(String::from).collect::<Vec<String>>()
    };
    let run = |args: Vec<String>| async move { raftq(&args.iter().map(String::as_str).collect::<Vec<_>>()).await };
    let first = run(deb("one")).await.json();
    let second = run(deb("two")).await.json();
    assert_eq!((&second["task_id"], &second["debounced"]), (&first["task_id"], &serde_json::json!(true)), "{second}");
    let single = ["task", "enqueue", "--addr", &a, "--queue", "ck", "--singleton-key", "s", "--output", "json"];
    let s = raftq(&single).await.json();
    let refused = raftq(&single).await;
    assert!(!refused.ok && refused.stderr.contains("SINGLETON_ACTIVE"), "{refused:?}");
    let id = s["task_id"].as_str().expect("id");
    assert!(refused.stderr.contains(id), "names the active task: {refused:?}");
    let skip = [&single[..], &["--singleton-skip"]].concat();
    let skipped = raftq(&skip).await.json();
    assert_eq!((&skipped["task_id"], &skipped["duplicate"]), (&s["task_id"], &serde_json::json!(true)));
    let both = ["task", "enqueue", "--addr", &a, "--queue", "ck", "--debounce-key", "d", "--delay", "5s"];
    assert!(!raftq(&both).await.ok, "--debounce-key conflicts with --delay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_concurrency_override_set_list_and_clear() {
    let n = TestNode::start().await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
    let a = addr(&n);
    let ov = |args: &[&str]| {
        let mut v = vec!["queues", "concurrency-override"];
        v.extend_from_slice(args);
        v.extend_from_slice(&["--addr", a.as_str()]);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move { raftq(&args.iter().map(String::as_str).collect::<Vec<_>>()).await };
    let set = run(ov(&["set", "--key", "k", "--limit", "5", "--ttl", "1h", "--output", "json"])).await.json();
    assert_eq!((set[0]["key"].as_str(), set[0]["limit"].as_u64()), (Some("k"), Some(5)), "{set}");
    assert!(set[0]["expires_at"].as_str().is_some_and(|t| t.contains('T')), "an RFC 3339 expiry: {set}");
    let lasting = run(ov(&["set", "--key", "j", "--limit", "2"])).await;
    assert!(lasting.ok && lasting.stdout.contains("never"), "{lasting:?}");
    let list = run(ov(&["list", "--output", "json"])).await.json();
    let keys: Vec<&str> = list.as_array().expect("an array").iter().filter_map(|o| o["key"].as_str()).collect();
    assert_eq!(keys, vec!["j", "k"]);
    let bad = run(ov(&["set", "--key", "k", "--limit", "0"])).await;
    assert!(!bad.ok && bad.stderr.contains("INVALID_ARGUMENT"), "{bad:?}");
    let cleared = run(ov(&["clear", "--key", "k", "--output", "json"])).await.json();
    assert_eq!(cleared["cleared"].as_bool(), Some(true));
    let list = run(ov(&["list", "--output", "json"])).await.json();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
}

/// `raftq bench --keys N` spreads its tasks over N concurrency keys: with no workers they stay pending, and the
/// override view counts them per key; `--keys` outside the cycle workload is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_keys_put_the_tasks_under_concurrency_keys() {
    let n = TestNode::start().await;
    let shared = n.node().shared.clone();
    wait_until(Duration::from_secs(10), || shared.cluster_version() >= 3).await;
    let a = addr(&n);
    for key in ["key-0", "key-2", "key-3"] {
        let set = raftq(&["queues", "concurrency-override", "set", "--key", key, "--limit", "5", "--addr", &a]).await;
        assert!(set.ok, "{set:?}");
    }
    let bench = ["bench", "--addr", &a, "--keys", "3", "--workers", "0", "--producers", "1", "--batch", "10"];
    let run = raftq(&[&bench[..], &["--rate", "300", "--duration", "1s", "--output", "json"]].concat()).await.json();
    let enqueued = run["enqueued"].as_u64().expect("enqueued");
    assert!(enqueued > 0 && run["completed"].as_u64() == Some(0), "{run}");
    let list = raftq(&["queues", "concurrency-override", "list", "--addr", &a, "--output", "json"]).await.json();
    let pending: Vec<(&str, u64)> = list
        .as_array()
        .expect("an array")
        .iter()
        .map(|o| (o["key"].as_str().unwrap_or("?"), o["pending"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(pending.len(), 3, "{list}");
    let (key0, key2, key3) = (pending[0].1, pending[1].1, pending[2].1);
    // Round robin over key-0..key-2: a third of the tasks each (the override of key-1 is not listed), none under
    // key-3.
    assert!(key0 > 0 && key0.abs_diff(enqueued / 3) <= 10, "{list} of {enqueued}");
    assert!(key2 > 0 && key2.abs_diff(enqueued / 3) <= 10, "{list} of {enqueued}");
    assert_eq!(key3, 0, "{list}");
    let bad = raftq(&["bench", "--addr", &a, "--keys", "2", "--workload", "enqueue", "--duration", "1s"]).await;
    assert!(!bad.ok && bad.stderr.contains("--keys applies to --workload cycle"), "{bad:?}");
}
