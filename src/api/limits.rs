//! Per-tenant limits: token buckets on enqueue and claim, and a cap on open streams.
//!
//! Buckets are charged where a request is proposed (the leader), so a tenant's rate holds cluster-wide and a
//! request forwarded by a follower is charged once. A request that does not fit is refused whole with
//! `RESOURCE_EXHAUSTED` and a retry hint: nothing of it is applied. Streams are counted on the node that holds
//! them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::ApiError;
use crate::config::Config;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One token bucket per tenant.
struct Buckets {
    per_s: f64,
    burst: f64,
    what: &'static str,
    map: Mutex<HashMap<String, Bucket>>,
}

impl Buckets {
    fn new(per_s: f64, burst: u64, what: &'static str) -> Option<Buckets> {
        (per_s > 0.0).then(|| Buckets { per_s, burst: burst.max(1) as f64, what, map: Mutex::new(HashMap::new()) })
    }

    /// Takes between `min` and `max` tokens (as many as there are), or refuses with the wait until `min` fit.
    fn take(&self, tenant: &str, min: u64, max: u64) -> Result<u64, ApiError> {
        if min as f64 > self.burst {
            return Err(ApiError::InvalidArgument(format!(
                "{min} {} at once exceed the tenant's burst of {}",
                self.what, self.burst
            )));
        }
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let b = map.entry(tenant.to_string()).or_insert(Bucket { tokens: self.burst, at: now });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * self.per_s).min(self.burst);
        b.at = now;
        if b.tokens < min as f64 {
            let retry_after_ms = (((min as f64 - b.tokens) / self.per_s) * 1000.0).ceil().max(1.0) as u64;
            return Err(ApiError::RateLimited {
                message: format!(
                    "tenant '{tenant}' is over its rate of {} {} per second; retry in {retry_after_ms} ms",
                    self.per_s, self.what
                ),
                retry_after_ms,
            });
        }
        let n = (b.tokens.floor() as u64).clamp(min, max);
        b.tokens -= n as f64;
        Ok(n)
    }

    fn refund(&self, tenant: &str, n: u64) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = map.get_mut(tenant) {
            b.tokens = (b.tokens + n as f64).min(self.burst);
        }
    }
}

pub struct Limits {
    enqueue: Option<Buckets>,
    claim: Option<Buckets>,
    max_streams: usize,
    streams: Mutex<HashMap<String, usize>>,
}

/// An open stream of a tenant; dropping it frees the slot.
pub struct StreamSlot {
    limits: Arc<Limits>,
    tenant: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut m = self.limits.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.tenant);
            }
        }
    }
}

impl Limits {
    pub fn new(cfg: &Config) -> Limits {
        Limits {
            enqueue: Buckets::new(cfg.tenant_enqueue_per_s, cfg.tenant_enqueue_burst, "tasks enqueued"),
            claim: Buckets::new(cfg.tenant_claim_per_s, cfg.tenant_claim_burst, "tasks claimed"),
            max_streams: cfg.tenant_max_streams,
            streams: Mutex::new(HashMap::new()),
        }
    }

    /// Charges `n` enqueues, all or none.
    pub fn enqueue(&self, tenant: &str, n: usize) -> Result<(), ApiError> {
        match &self.enqueue {
            Some(b) if n > 0 => b.take(tenant, n as u64, n as u64).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Charges up to `want` claims: how many may be claimed now (at least 1), or `RESOURCE_EXHAUSTED`.
    pub fn claim(&self, tenant: &str, want: usize) -> Result<usize, ApiError> {
        match &self.claim {
            Some(b) => b.take(tenant, 1, want as u64).map(|n| n as usize),
            None => Ok(want),
        }
    }

    /// Gives back claims that were charged but not used (fewer tasks were ready).
    pub fn unclaimed(&self, tenant: &str, n: usize) {
        if let (Some(b), true) = (&self.claim, n > 0) {
            b.refund(tenant, n as u64);
        }
    }

    /// A slot for one more stream of `tenant`, or `RESOURCE_EXHAUSTED` when it holds the most it may.
    pub fn open_stream(self: &Arc<Self>, tenant: &str) -> Result<StreamSlot, ApiError> {
        let mut m = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(tenant.to_string()).or_insert(0);
        if *n >= self.max_streams {
            return Err(ApiError::TooManyStreams {
                message: format!("tenant '{tenant}' already holds {} streams on this node", self.max_streams),
                retry_after_ms: 1000,
            });
        }
        *n += 1;
        Ok(StreamSlot { limits: self.clone(), tenant: tenant.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use raftq_proto::reason::Reason;

    use super::*;

    fn cfg(rate: f64, burst: u64) -> Config {
        Config {
            tenant_enqueue_per_s: rate,
            tenant_enqueue_burst: burst,
            tenant_claim_per_s: rate,
            tenant_claim_burst: burst,
            tenant_max_streams: 2,
            ..Config::default()
        }
    }

    #[test]
    fn a_bucket_refuses_whole_requests_and_names_the_wait() {
        let l = Limits::new(&cfg(10.0, 20));
        l.enqueue("a", 15).unwrap();
        let e = l.enqueue("a", 10).unwrap_err();
        assert_eq!(e.reason(), Reason::RateLimited);
        match e {
            ApiError::RateLimited { retry_after_ms, .. } => assert!((400..=600).contains(&retry_after_ms)),
            other => panic!("{other:?}"),
        }
        // Another tenant has its own bucket; a request over the burst can never pass.
        l.enqueue("b", 20).unwrap();
        assert_eq!(l.enqueue("b", 21).unwrap_err().reason(), Reason::InvalidArgument);
    }

    #[test]
    fn claims_take_what_is_left_and_get_refunds() {
        let l = Limits::new(&cfg(1.0, 5));
        assert_eq!(l.claim("a", 3).unwrap(), 3);
        assert_eq!(l.claim("a", 3).unwrap(), 2);
        assert_eq!(l.claim("a", 1).unwrap_err().reason(), Reason::RateLimited);
        l.unclaimed("a", 2);
        assert_eq!(l.claim("a", 5).unwrap(), 2);
    }

    #[test]
    fn no_limit_when_the_rate_is_zero() {
        let l = Limits::new(&Config::default());
        l.enqueue("a", 1_000_000).unwrap();
        assert_eq!(l.claim("a", 1000).unwrap(), 1000);
    }

    #[test]
    fn streams_are_capped_per_tenant_and_freed_on_drop() {
        let l = Arc::new(Limits::new(&cfg(0.0, 1)));
        let a1 = l.open_stream("a").unwrap();
        let _a2 = l.open_stream("a").unwrap();
        assert_eq!(l.open_stream("a").err().unwrap().reason(), Reason::TooManyStreams);
        let _b = l.open_stream("b").unwrap();
        drop(a1);
        l.open_stream("a").unwrap();
    }
}
