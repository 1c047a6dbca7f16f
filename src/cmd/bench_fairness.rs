//! `raftq bench --workload fairness`: weighted fair dispatch measured on a real node, in nine runs of
//! `--duration` each, every run on a queue of its own:
//!
//! 1. quiet: key `b` alone enqueues at `--rate` (default 20/s) into a queue whose workers are idle;
//! 2. flood: key `a` enqueues at 100 times that rate, more than the workers can take (each of the `--workers` x
//!    `--slots` slots works `--work-ms` on one task at a time), while `b` goes on at its rate: `b`'s
//!    enqueue->claim against the quiet run, and how much of the capacity `a` still gets;
//! 3. flood with varied work: the same, but each task's work time drawn uniformly from `--work-ms` x (1 -
//!    `--work-jitter` ..= 1 + `--work-jitter`): with one fixed work time, slots that start together end together,
//!    so slots come free in waves and `b` waits for the next wave; varied work spreads them out, as real tasks do;
//! 4. flood with a reserve: the varied flood again, but `a`'s tasks carry a concurrency limit `--reserve` below
//!    the workers' slots, so that many slots stay free for other keys: a Ready parked in a free slot takes `b`'s
//!    task as it arrives, at the price of the capacity the reserve holds back from `a`. Fair dispatch alone is
//!    work-conserving (every slot `b` leaves goes to `a`), so under a flood `b` waits for a slot to come free;
//!    this is what a user who wants `b`'s latency as it is alone sets;
//! 5. weighted: `a` (weight `--weight`) and `b` (weight 1) both flood: the ratio served;
//! 6. to 9. full cycles as fast as they go (`--producers`, `--batch`, `--workers`, `--slots`,
//!    `--worker-batch`, no work time), unkeyed, then every task under one of 16 keys, twice, in the order
//!    unkeyed, keyed, keyed, unkeyed: throughput per kind over its two runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use raftq_proto::v1 as pb;
use raftq_proto::v1::jobs_client::JobsClient;
use serde_json::{json, Value};

use super::bench::{
    authorized, channel, stream_producer, stream_worker, BenchArgs, Counters, ProducerSpec, Target, WorkerSpec,
};

/// The keys of the flood with a reserve, standing for `a` and `b`.
const RESERVED_A: &str = "a-capped";
const RESERVED_B: &str = "b-reserved";

/// `b`'s rate when `--rate` is not given (tasks/s).
const DEFAULT_B_RATE: u64 = 20;
/// How much faster the flooding key enqueues than `b`: the scenario.
const FLOOD_FACTOR: u64 = 100;
/// Keys of the keyed full-cycle run: enough that the fair pick rotates among many.
const CYCLE_KEYS: usize = 16;

pub async fn run(a: BenchArgs) -> Result<()> {
    let target = Target::start(&a).await?;
    let result = measure(&a, &target.addrs).await;
    target.stop().await;
    let report = result?;
    if a.output == super::client::Output::Json {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

async fn measure(a: &BenchArgs, addrs: &[String]) -> Result<Value> {
    let tag = format!("{:08x}", rand::random::<u32>());
    let b_rate = if a.rate == 0 { DEFAULT_B_RATE } else { a.rate };
    let a_rate = b_rate * FLOOD_FACTOR;
    let slow =
        |queue: &str| WorkerSpec { queue: queue.into(), slots: a.slots.max(1), count: 1, work: work(a), jitter: 0.0 };
    let varied = |queue: &str| WorkerSpec { jitter: a.work_jitter.clamp(0.0, 1.0), ..slow(queue) };
    let paced = |queue: &str, key: &str, rate: u64| ProducerSpec {
        queue: queue.into(),
        batch: (rate / 100).max(1) as usize,
        inflight: 4,
        rate,
        payload_len: a.payload_bytes.max(8),
        keys: vec![key.into()],
        limit: 0,
    };
    let slots_total = a.workers * a.slots.max(1);
    let capacity = slots_total as f64 * 1000.0 / a.work_ms.max(1) as f64;

    let q = format!("fair-quiet-{tag}");
    let quiet = phase(a, addrs, "quiet", vec![paced(&q, "b", b_rate)], slow(&q)).await?;
    let q = format!("fair-flood-{tag}");
    let flood = phase(a, addrs, "flood", vec![paced(&q, "a", a_rate), paced(&q, "b", b_rate)], slow(&q)).await?;
    let q = format!("fair-flood-varied-{tag}");
    let flood_varied =
        phase(a, addrs, "flood-varied", vec![paced(&q, "a", a_rate), paced(&q, "b", b_rate)], varied(&q)).await?;
    let q = format!("fair-flood-reserved-{tag}");
    let reserve = a.reserve.clamp(1, slots_total.saturating_sub(1).max(1));
    let a_limit = slots_total.saturating_sub(reserve).max(1);
    // Keys of their own: a concurrency key spans the tenant's queues, and the earlier floods' tasks still leased
    // to their stopped workers (until the leases run out) would count against `a`'s limit.
    let capped = ProducerSpec { limit: a_limit as u32, ..paced(&q, RESERVED_A, a_rate) };
    let producers = vec![capped, paced(&q, RESERVED_B, b_rate)];
    let flood_reserved = phase(a, addrs, "flood-reserved", producers, varied(&q)).await?;
    let q = format!("fair-weighted-{tag}");
    set_weight(&addrs[0], &q, "a", a.weight).await?;
    let weighted = phase(a, addrs, "weighted", vec![paced(&q, "a", a_rate), paced(&q, "b", a_rate)], slow(&q)).await?;
    let (ka, kb) = (served(&weighted, "a"), served(&weighted, "b"));

    let fast = |queue: &str| WorkerSpec {
        queue: queue.into(),
        slots: a.slots.max(1),
        count: a.worker_batch.max(1),
        work: Duration::ZERO,
        jitter: 0.0,
    };
    let cycle = |queue: &str, keys: Vec<String>| ProducerSpec {
        queue: queue.into(),
        batch: a.batch.max(1),
        inflight: a.inflight.max(1),
        rate: 0,
        payload_len: a.payload_bytes.max(8),
        keys,
        limit: 0,
    };
    // Keyed and unkeyed alternate (unkeyed, keyed, keyed, unkeyed), so what the earlier runs left in the node
    // (their backlogs) weighs on both alike.
    let keys: Vec<String> = (0..CYCLE_KEYS).map(|i| format!("k{i}")).collect();
    let (mut unkeyed, mut keyed) = (0u64, 0u64);
    for (i, keyed_run) in [false, true, true, false].into_iter().enumerate() {
        let name = if keyed_run { "cycle-keyed" } else { "cycle-unkeyed" };
        let q = format!("fair-{name}-{i}-{tag}");
        let spec = cycle(&q, if keyed_run { keys.clone() } else { vec![] });
        let c = phase(a, addrs, name, vec![spec; a.producers], fast(&q)).await?;
        *(if keyed_run { &mut keyed } else { &mut unkeyed }) += c.completed.load(Ordering::Relaxed);
    }
    let per_s = |n: u64| n as f64 / (2.0 * a.duration.as_secs_f64());

    Ok(json!({
        "workload": "fairness",
        "nodes": addrs,
        "seconds_per_run": a.duration.as_secs_f64(),
        "workers": a.workers, "slots": a.slots, "work_ms": a.work_ms, "worker_capacity_per_s": capacity,
        "b_rate": b_rate, "a_rate": a_rate,
        "quiet": {"b": key_report(&quiet, "b", a)},
        "flood": {"a": key_report(&flood, "a", a), "b": key_report(&flood, "b", a)},
        "flood_varied": {"work_jitter": a.work_jitter.clamp(0.0, 1.0),
            "a": key_report(&flood_varied, "a", a), "b": key_report(&flood_varied, "b", a)},
        "flood_reserved": {"work_jitter": a.work_jitter.clamp(0.0, 1.0), "reserve": reserve,
            "a_limit": a_limit,
            "a": key_report(&flood_reserved, RESERVED_A, a), "b": key_report(&flood_reserved, RESERVED_B, a)},
        "weighted": {"weight": a.weight, "a_served": ka, "b_served": kb,
            "ratio": if kb > 0 { ka as f64 / kb as f64 } else { 0.0 }},
        "cycle": {"unkeyed_per_s": per_s(unkeyed), "keyed_per_s": per_s(keyed), "keys": CYCLE_KEYS,
            "keyed_vs_unkeyed": per_s(keyed) / per_s(unkeyed).max(1e-9)},
    }))
}

fn work(a: &BenchArgs) -> Duration {
    Duration::from_millis(a.work_ms.max(1))
}

/// Runs producers and `--workers` worker streams for `--duration`, then stops them all.
async fn phase(
    a: &BenchArgs,
    addrs: &[String],
    name: &str,
    producers: Vec<ProducerSpec>,
    worker: WorkerSpec,
) -> Result<Arc<Counters>> {
    let stats = Arc::new(Counters::per_key());
    let stop = Arc::new(AtomicBool::new(false));
    let mut jobs = tokio::task::JoinSet::new();
    for (w, n) in (0..a.workers).zip(0..) {
        let ch = channel(&addrs[w % addrs.len()]).await?;
        jobs.spawn(stream_worker(ch, worker.clone(), n, stats.clone(), stop.clone()));
    }
    for (p, spec) in producers.into_iter().enumerate() {
        let ch = channel(&addrs[p % addrs.len()]).await?;
        jobs.spawn(stream_producer(ch, spec, stats.clone(), stop.clone()));
    }
    let start = Instant::now();
    tokio::time::sleep(a.duration).await;
    stop.store(true, Ordering::Relaxed);
    jobs.abort_all();
    while jobs.join_next().await.is_some() {}
    eprintln!(
        "[{name}] {:.1}s: enqueued {}, claimed {}, completed {}",
        start.elapsed().as_secs_f64(),
        stats.enqueued.load(Ordering::Relaxed),
        stats.claimed.load(Ordering::Relaxed),
        stats.completed.load(Ordering::Relaxed)
    );
    Ok(stats)
}

/// Sets a key's weight, waiting (up to 15 s) for the cluster to run the version that has weights.
async fn set_weight(addr: &str, queue: &str, key: &str, weight: u32) -> Result<()> {
    let mut jobs = JobsClient::new(channel(addr).await?);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let req = pb::SetFairnessWeightRequest { queue: queue.into(), key: key.into(), weight };
        match jobs.set_fairness_weight(authorized(req)).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline && e.message().contains("cluster version") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("setting the weight of {key:?} in {queue}: {e}"),
        }
    }
}

fn served(c: &Counters, key: &str) -> u64 {
    let len = |m: &std::sync::Mutex<super::bench::PerKey>| {
        m.lock().unwrap_or_else(|p| p.into_inner()).get(key).map(|k| k.to_claim.len())
    };
    c.per_key.as_ref().and_then(len).unwrap_or(0) as u64
}

/// Tasks of a key claimed, per second, its enqueue->claim p50/p99 in ms, and its claims' stages.
fn key_report(c: &Counters, key: &str, a: &BenchArgs) -> Value {
    let Some(m) = &c.per_key else { return Value::Null };
    let g = m.lock().unwrap_or_else(|p| p.into_inner());
    let Some(claims) = g.get(key) else { return json!({"claimed": 0}) };
    let n = claims.to_claim.len();
    let p = claims.to_claim.percentiles().unwrap_or_default();
    json!({"claimed": n, "claimed_per_s": n as f64 / a.duration.as_secs_f64(),
        "enqueue_to_claim_ms": {"p50": p[0], "p90": p[1], "p99": p[2]}, "stages_ms": stage_report(&claims.stages)})
}

/// Where a key's claims spent their time, by the node's stamps (ms, so each stage is within a millisecond):
/// send→enqueue stamp, enqueue stamp→claim stamp, claim stamp→worker, as p50 and p99 of each, and the medians of
/// each over the slowest 2 % of the claims (by their sum), which is what the tail is made of.
fn stage_report(v: &[[i64; 3]]) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    let ms = |us: i64| us as f64 / 1000.0;
    let at = |mut xs: Vec<i64>, q: f64| {
        xs.sort_unstable();
        ms(xs[((xs.len() as f64 * q) as usize).min(xs.len() - 1)])
    };
    let col = |rows: &[[i64; 3]], i: usize| rows.iter().map(|r| r[i]).collect::<Vec<_>>();
    let mut slow = v.to_vec();
    slow.sort_unstable_by_key(|r| std::cmp::Reverse(r.iter().sum::<i64>()));
    slow.truncate((v.len() / 50).max(1));
    let names = ["send_to_stamp", "stamp_to_claim", "claim_to_worker"];
    let mut out = serde_json::Map::new();
    for (i, name) in names.into_iter().enumerate() {
        out.insert(
            name.into(),
            json!({"p50": at(col(v, i), 0.5), "p99": at(col(v, i), 0.99), "slowest_2pct_p50": at(col(&slow, i), 0.5)}),
        );
    }
    Value::Object(out)
}

fn print_table(r: &Value) {
    let ms = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.1} ms"));
    let line = |name: &str, k: &Value| {
        let l = &k["enqueue_to_claim_ms"];
        println!(
            "{name:<24} claimed {:>7} ({:>7.0}/s)  enqueue->claim p50 {:>9}  p99 {:>9}",
            k["claimed"],
            k["claimed_per_s"].as_f64().unwrap_or(0.0),
            ms(&l["p50"]),
            ms(&l["p99"])
        );
    };
    println!(
        "workers {} x {} slots, {} ms per task: capacity {:.0} tasks/s; b at {}/s, a at {}/s; {} s per run",
        r["workers"],
        r["slots"],
        r["work_ms"],
        r["worker_capacity_per_s"].as_f64().unwrap_or(0.0),
        r["b_rate"],
        r["a_rate"],
        r["seconds_per_run"]
    );
    line("quiet: b", &r["quiet"]["b"]);
    line("flood: b", &r["flood"]["b"]);
    line("flood: a", &r["flood"]["a"]);
    line("flood, varied work: b", &r["flood_varied"]["b"]);
    line("flood, varied work: a", &r["flood_varied"]["a"]);
    let reserved = &r["flood_reserved"];
    line(&format!("reserve {}, varied: b", reserved["reserve"]), &reserved["b"]);
    line(&format!("reserve {}, varied: a", reserved["reserve"]), &reserved["a"]);
    let w = &r["weighted"];
    println!(
        "weighted {}:1           served a {} b {}: ratio {:.3}",
        w["weight"],
        w["a_served"],
        w["b_served"],
        w["ratio"].as_f64().unwrap_or(0.0)
    );
    let c = &r["cycle"];
    println!(
        "full cycles            unkeyed {:.0}/s, keyed ({} keys) {:.0}/s: keyed/unkeyed {:.3}",
        c["unkeyed_per_s"].as_f64().unwrap_or(0.0),
        c["keys"],
        c["keyed_per_s"].as_f64().unwrap_or(0.0),
        c["keyed_vs_unkeyed"].as_f64().unwrap_or(0.0)
    );
}

#[cfg(test)]
mod tests {
    use super::stage_report;

    /// The slowest 2 % are picked by their whole time and show the stage that made them slow.
    #[test]
    fn the_stage_split_names_the_stage_of_the_slowest_claims() {
        let mut rows = vec![[-400, 0, 1_400]; 98];
        rows.push([3_200, 0, 1_000]);
        rows.push([2_900, 0, 1_100]);
        rows.push([0, 0, 900]);
        rows.push([0, 0, 1_100]);
        let r = stage_report(&rows);
        assert_eq!(r["send_to_stamp"]["p50"], -0.4);
        assert_eq!(r["send_to_stamp"]["slowest_2pct_p50"], 3.2);
        assert_eq!(r["claim_to_worker"]["slowest_2pct_p50"], 1.1);
        assert_eq!(r["claim_to_worker"]["p99"], 1.4);
        assert_eq!(r["stamp_to_claim"]["p99"], 0.0);
        assert!(stage_report(&[]).is_null());
    }
}
