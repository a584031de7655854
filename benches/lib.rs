//! Benchmarks live in `benches/`; see `RESULTS.md`. What several of them share is here.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_priority_limit::config::{ModelId, PoolRef};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::store::{AdmitRequest, Store};

/// Calls from `in_flight` tasks at once, each calling again as soon as its call returns, until
/// `secs` have passed: `call(task, n)` is task `task`'s `n`-th call (it panics on an answer
/// the bench does not expect). Calls per second over the run, and how many.
pub async fn closed_loop_rate<F, Fut>(in_flight: usize, secs: Duration, call: F) -> (f64, u64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let call = Arc::new(call);
    let deadline = Instant::now() + secs;
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|task| {
            let call = Arc::clone(&call);
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    call(task, n).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("a task of the loop");
    }
    (total as f64 / started.elapsed().as_secs_f64(), total)
}

/// One admission on `model`'s default pool that reserves nothing, straight on `store`; panics
/// unless it is admitted (the benches run far below every limit).
pub async fn admit_one<S: Store>(store: &S, model: ModelId) {
    let request = AdmitRequest {
        model,
        pool: PoolRef::Default,
        reserve: 0,
        callers: None,
        flow: None,
    };
    match store.admit(request).await {
        Ok(Decision::Admit(_)) => {}
        other => panic!("expected an admission, got {other:?}"),
    }
}
