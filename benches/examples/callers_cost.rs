//! What a key's and its team's own limits cost an admission on the embedded store, robust to a
//! busy machine: batches of admit + lease + settle through `admit_request`, without callers and
//! with a key and a team that each have limits, interleaved, the fastest batch of each kept (a
//! preempted batch only gets slower).
//!
//! `cargo run --release -p benches --example callers_cost`
//!
//! `ONLY=none|rpm_only|callers N=…` runs one kind only, N requests, for counting instructions with
//! `valgrind --tool=callgrind` (the difference of two runs over the difference of their N).

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tower_priority_limit::caller::{Caller, CallerKind, CallerLimits, Callers};
use tower_priority_limit::clock::CoarseClock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef, Reservation};
use tower_priority_limit::{AdmissionOutcome, Lease, Limiter, ModelLimits, RequestAdmission};

// The gateway's allocator (its default feature, `jemalloc`): the per-request `Callers` is one
// allocation.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

struct Rig {
    limiter: Arc<Limiter>,
    id: ModelId,
    key: Caller,
    team: Caller,
    /// A key with `rpm_limit` alone, no team: the common case.
    rpm_only: Caller,
}

/// Which callers a request carries.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    None,
    RpmOnly,
    KeyAndTeam,
}

impl Rig {
    fn new() -> Self {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(u64::MAX / 2).tpm(u64::MAX / 2))
            .reserve("prod", Reservation::Percent(0.9))
            .reserve("dev", Reservation::Percent(0.1))
            .build()
            .unwrap();
        let limiter = Arc::new(Limiter::with_clock(config, CoarseClock::new()));
        let id = limiter.config().model_id("m").unwrap();
        let many = u64::MAX / 4;
        let limits = CallerLimits::new()
            .rpm(many)
            .tpm(many)
            .tpd(many)
            .max_parallel(many);
        Self {
            limiter,
            id,
            // As the gateway holds them for a key it resolved: the ids shared.
            key: Caller::new(CallerKind::Key, "9f".repeat(32), limits),
            team: Caller::new(CallerKind::Team, "team-a", limits.model_rpm(many)),
            rpm_only: Caller::new(
                CallerKind::Key,
                "8e".repeat(32),
                CallerLimits::new().rpm(many),
            ),
        }
    }

    /// One request the whole way, as the gateway's router admits it.
    #[inline(never)]
    fn request(&self, kind: Kind) {
        self.admit(kind).settle_with_output(black_box(30), Some(20))
    }

    /// The admission alone: what a request waits for before it is sent upstream.
    #[inline(never)]
    fn admit(&self, kind: Kind) -> Lease {
        let callers = match kind {
            Kind::None => None,
            Kind::RpmOnly => Callers::new(Some(self.rpm_only.clone()), None),
            Kind::KeyAndTeam => Callers::new(Some(self.key.clone()), Some(self.team.clone())),
        };
        let request = RequestAdmission {
            model: self.id,
            pool: PoolRef::Named(0),
            flow: 0,
            prompt_tokens: 50,
            max_output_tokens: Some(20),
            max_wait: None,
            callers,
        };
        // The embedded store answers in place: one poll.
        let mut future = std::pin::pin!(self.limiter.admit_request(request));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(AdmissionOutcome::Admitted { lease, .. })) => lease,
            other => panic!("expected an admission, got {other:?}"),
        }
    }

    fn batch(&self, kind: Kind, n: u32) -> f64 {
        let start = Instant::now();
        for _ in 0..n {
            self.request(kind);
        }
        start.elapsed().as_nanos() as f64 / f64::from(n)
    }

    /// `n` admissions timed, their leases held, then their `n` settlements timed apart: the
    /// request's own wait (admission) and what its end costs after the response (settlement).
    fn split_batch(&self, kind: Kind, n: u32, leases: &mut Vec<Lease>) -> (f64, f64) {
        let start = Instant::now();
        for _ in 0..n {
            leases.push(self.admit(kind));
        }
        let admitted = start.elapsed();
        let start = Instant::now();
        for lease in leases.drain(..) {
            lease.settle_with_output(black_box(30), Some(20));
        }
        let settled = start.elapsed();
        let per = |d: std::time::Duration| d.as_nanos() as f64 / f64::from(n);
        (per(admitted), per(settled))
    }
}

fn main() {
    let rig = Rig::new();
    if let Ok(only) = std::env::var("ONLY") {
        let n: u32 = std::env::var("N")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(100_000);
        let kind = match only.as_str() {
            "rpm_only" => Kind::RpmOnly,
            "callers" => Kind::KeyAndTeam,
            _ => Kind::None,
        };
        for _ in 0..n {
            rig.request(kind);
        }
        return;
    }
    let mut best = [f64::MAX; 3];
    for _ in 0..300 {
        for (i, kind) in [Kind::None, Kind::RpmOnly, Kind::KeyAndTeam]
            .into_iter()
            .enumerate()
        {
            best[i] = best[i].min(rig.batch(kind, 10_000));
        }
    }
    println!(
        "admit_request + settle, fastest of 300 interleaved batches of 10,000: without callers \
         {:.1} ns; a key with rpm_limit {:.1} ns (ratio {:.2}); a key and a team with every \
         limit {:.1} ns (ratio {:.2})",
        best[0],
        best[1],
        best[1] / best[0],
        best[2],
        best[2] / best[0]
    );
    // The same requests with their admissions and settlements timed apart.
    let (mut admit, mut settle) = ([f64::MAX; 3], [f64::MAX; 3]);
    let mut leases = Vec::with_capacity(10_000);
    for _ in 0..300 {
        for (i, kind) in [Kind::None, Kind::RpmOnly, Kind::KeyAndTeam]
            .into_iter()
            .enumerate()
        {
            let (a, s) = rig.split_batch(kind, 10_000, &mut leases);
            admit[i] = admit[i].min(a);
            settle[i] = settle[i].min(s);
        }
    }
    println!(
        "admission alone: without callers {:.1} ns; a key with rpm_limit {:.1} ns (ratio {:.2}); \
         a key and a team {:.1} ns (ratio {:.2}). Settlement alone: {:.1} / {:.1} ({:.2}) / \
         {:.1} ns ({:.2})",
        admit[0],
        admit[1],
        admit[1] / admit[0],
        admit[2],
        admit[2] / admit[0],
        settle[0],
        settle[1],
        settle[1] / settle[0],
        settle[2],
        settle[2] / settle[0]
    );
}
