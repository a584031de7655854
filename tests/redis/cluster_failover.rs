//! A Redis Cluster of 3 masters and 3 replicas losing a master to `kill -9` while two stores (two
//! gateways' worth) admit: only the models whose keys live on that master notice, the others go
//! on at their usual latency on the shared counters, and a failover of a model's own master
//! over-admits it by no more than the policy in docs/gateway.md says.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::redis::RedisCluster;
use tower_priority_limit::config::{FailureMode, LimiterConfig};
use tower_priority_limit::store::{RedisStore, RedisTarget};
use tower_priority_limit::{Acquired, Limiter, ModelLimits};

const PREFIX: &str = "fo:";

/// What one admission did.
#[derive(Debug, Clone, Copy)]
struct Sample {
    model: usize,
    latency: Duration,
    admitted: bool,
}

/// Two stores on the cluster (two gateways), each with its own connection, as two processes.
async fn gateways(config: &LimiterConfig, cluster: &RedisCluster) -> Vec<Arc<Limiter<RedisStore>>> {
    let mut out = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder(RedisTarget::Cluster(cluster.urls()))
            .key_prefix(PREFIX)
            .connect(config)
            .await
            .expect("redis store");
        out.push(Arc::new(Limiter::with_store(store)));
    }
    out
}

/// Every `period`, one admission of each model in `models`, on the gateways in turn, until
/// `stop` says so (checked each tick with the time since the start); the samples, in order.
async fn drive(
    gateways: &[Arc<Limiter<RedisStore>>],
    names: &[String],
    models: &[usize],
    period: Duration,
    mut stop: impl FnMut(Duration) -> bool,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = Vec::new();
    let mut turn = 0usize;
    loop {
        tick.tick().await;
        if stop(start.elapsed()) {
            break;
        }
        for &model in models {
            let limiter = Arc::clone(&gateways[turn % gateways.len()]);
            turn += 1;
            let name = names[model].clone();
            tasks.push(tokio::spawn(async move {
                let began = Instant::now();
                let acquired = limiter.acquire(&name, None, 0).await;
                let latency = began.elapsed();
                let admitted = match acquired {
                    Ok(Acquired::Admitted { lease, .. }) => {
                        lease.settle(1);
                        true
                    }
                    // Refused, or (failure mode `closed`) not asked: not admitted either way.
                    _ => false,
                };
                Sample {
                    model,
                    latency,
                    admitted,
                }
            }));
        }
    }
    let mut samples = Vec::with_capacity(tasks.len());
    for t in tasks {
        samples.push(t.await.expect("admission task"));
    }
    samples
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    assert!(!latencies.is_empty(), "no samples");
    latencies.sort();
    latencies[(latencies.len() * 99).div_ceil(100).saturating_sub(1)]
}

/// Models named so that some live on each master: `(names, master index of each)`.
fn models_on_every_master(cluster: &RedisCluster, per_master: usize) -> (Vec<String>, Vec<usize>) {
    let mut names = Vec::new();
    let mut masters = Vec::new();
    let mut count = std::collections::HashMap::<usize, usize>::new();
    for i in 0.. {
        let name = format!("model-{i}");
        let slot = cluster.slot_of(&format!("{PREFIX}{{{name}}}"));
        let master = cluster.master_of(slot).expect("a master per slot");
        let seen = count.entry(master).or_default();
        if *seen < per_master {
            *seen += 1;
            names.push(name);
            masters.push(master);
        }
        if count.len() == 3 && count.values().all(|&c| c == per_master) {
            break;
        }
        assert!(
            i < 10_000,
            "three masters should serve some of 10,000 names"
        );
    }
    (names, masters)
}

/// Issue 36: `kill -9` of a master that holds none of a model's keys. Admissions of the models on
/// the two healthy masters go on on the shared counters, none decided locally, with their p99 as
/// before (the figures are printed; the bound in the issue is 10 ms added); the models on the lost
/// master go local until its replica is promoted, then come back to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_master_stalls_only_the_models_on_it() {
    let Some(mut cluster) = RedisCluster::start_with_replicas(
        "losing_a_master_stalls_only_the_models_on_it",
        3,
        1,
        2000,
        false,
    ) else {
        return;
    };
    let (names, masters) = models_on_every_master(&cluster, 2);
    // A timeout well above what a loaded 2-core CI machine makes a healthy call wait (the 50 ms
    // default was passed there by a call or two), far below the seconds a stall of the whole
    // client lasted: the test still catches that, and not the machine's load.
    let mut builder = LimiterConfig::builder()
        .expected_nodes(2)
        .store_timeout(Duration::from_millis(500));
    for name in &names {
        builder = builder.model(ModelLimits::new(name.as_str()).rpm(1_000_000));
    }
    let config = builder.build().unwrap();
    let gateways = gateways(&config, &cluster).await;
    let victim = masters[0];
    let on_victim: Vec<usize> = (0..names.len()).filter(|&m| masters[m] == victim).collect();
    let elsewhere: Vec<usize> = (0..names.len()).filter(|&m| masters[m] != victim).collect();
    let all: Vec<usize> = (0..names.len()).collect();
    let period = Duration::from_millis(20);

    // Warm up, then the baseline.
    drive(&gateways, &names, &all, period, |t| {
        t > Duration::from_millis(500)
    })
    .await;
    let local_before: Vec<u64> = local_counts(&gateways, &names);
    let baseline = drive(&gateways, &names, &all, period, |t| {
        t > Duration::from_secs(3)
    })
    .await;

    // The failover: the victim killed, admissions go on until its models are back on Redis for a
    // second (at most 20 s).
    let victim_slot = cluster.slot_of(&format!("{PREFIX}{{{}}}", names[on_victim[0]]));
    cluster.kill(victim);
    let killed = Instant::now();
    let mut promoted_at = None;
    let during = drive(&gateways, &names, &all, period, |t| {
        if promoted_at.is_none() && cluster.master_of(victim_slot).is_some_and(|m| m != victim) {
            promoted_at = Some(killed.elapsed());
        }
        match promoted_at {
            Some(p) => t > p + Duration::from_secs(2),
            None => t > Duration::from_secs(20),
        }
    })
    .await;
    let promoted_at = promoted_at.expect("the replica was promoted within 20 s");
    let local_after: Vec<u64> = local_counts(&gateways, &names);

    let lat = |samples: &[Sample], models: &[usize]| {
        p99(samples
            .iter()
            .filter(|s| models.contains(&s.model))
            .map(|s| s.latency)
            .collect())
    };
    let local_of = |models: &[usize]| -> u64 {
        models
            .iter()
            .map(|&m| local_after[m] - local_before[m])
            .sum()
    };
    let max_during = during
        .iter()
        .filter(|s| elsewhere.contains(&s.model))
        .map(|s| s.latency)
        .max()
        .unwrap();
    println!(
        "promoted {promoted_at:?} after the kill; healthy models p99 \
         {:?} before, {:?} during (max {max_during:?}), {} local; victim's models p99 {:?} before, \
         {:?} during, {} local; admitted {} / {}",
        lat(&baseline, &elsewhere),
        lat(&during, &elsewhere),
        local_of(&elsewhere),
        lat(&baseline, &on_victim),
        lat(&during, &on_victim),
        local_of(&on_victim),
        during.iter().filter(|s| s.admitted).count(),
        during.len(),
    );
    assert_eq!(
        local_of(&elsewhere),
        0,
        "no admission of a model on a healthy master was decided locally"
    );
    assert!(
        local_of(&on_victim) > 0,
        "the victim's models noticed the kill"
    );
}

/// Admissions decided by each gateway's local fallback, per model, summed over the gateways.
fn local_counts(gateways: &[Arc<Limiter<RedisStore>>], names: &[String]) -> Vec<u64> {
    names
        .iter()
        .map(|name| {
            gateways
                .iter()
                .map(|g| {
                    let id = g.config().model_id(name).expect("a configured model");
                    g.store().local_admissions_of(id)
                })
                .sum()
        })
        .collect()
}

/// Issue 36: `kill -9` of the master holding a model's keys, in the middle of a window that
/// demand fills (limit 120 a window, 2 gateways, 20 admissions a second offered). What is admitted
/// beyond the limit in that window comes from two places only: admissions the fallback decided
/// while Redis could not answer for the model (`local` mode: each gateway keeps `limit / 2`;
/// none in `closed` mode), and admissions the master acknowledged but had not yet sent to its
/// replica when it died (asynchronous replication). The figures are printed; the test holds the
/// second to at most 2 % of the window, and the whole to the first plus that; in `local` mode
/// each gateway's fallback starts from its half of what the window held, so the whole stays
/// within 2 % of the window too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_of_the_models_master_over_admits_only_what_the_policy_allows() {
    for mode in [FailureMode::Closed, FailureMode::Local] {
        let Some(mut cluster) = RedisCluster::start_with_replicas(
            "a_failover_of_the_models_master_over_admits_only_what_the_policy_allows",
            3,
            1,
            2000,
            false,
        ) else {
            return;
        };
        const LIMIT: u64 = 120;
        let names = vec!["m".to_owned()];
        let config = LimiterConfig::builder()
            .expected_nodes(2)
            .failure_mode(mode)
            .window(Duration::from_secs(20))
            .model(ModelLimits::new("m").rpm(LIMIT))
            .build()
            .unwrap();
        let gateways = gateways(&config, &cluster).await;
        let slot = cluster.slot_of(&format!("{PREFIX}{{m}}"));
        let victim = cluster.master_of(slot).expect("a master for m");
        // One window: the first admission opens it, everything below happens within 16 s of it.
        let period = Duration::from_millis(100); // one per gateway each time: 20 a second
        let both = [0usize, 0];
        let mut samples = drive(&gateways, &names, &both, period, |t| {
            t > Duration::from_secs(3)
        })
        .await;
        let before_kill = samples.iter().filter(|s| s.admitted).count() as u64;
        cluster.kill(victim);
        let local_before = local_counts(&gateways, &names)[0];
        samples.extend(
            drive(&gateways, &names, &both, period, |t| {
                t > Duration::from_secs(12)
            })
            .await,
        );
        let promoted = cluster.master_of(slot).is_some_and(|m| m != victim);
        let local = local_counts(&gateways, &names)[0] - local_before;
        let stat = |read: fn(&tower_priority_limit::store::RedisStats) -> u64| -> u64 {
            gateways.iter().map(|g| read(g.store().stats())).sum()
        };
        let repaid = stat(|s| s.local_repaid.load(Ordering::Relaxed));
        // This test's only model: the fallback's admissions (its refusals left out).
        let local_admitted = stat(|s| s.local_admitted.load(Ordering::Relaxed));
        let admitted = samples.iter().filter(|s| s.admitted).count() as u64;
        let over = admitted.saturating_sub(LIMIT);
        // Demand fills the window: Redis stops at the limit, counting its own admissions and the
        // repaid local ones, less what the replica never received.
        let lost = (over + repaid).saturating_sub(local_admitted);
        println!(
            "{}: {before_kill} admitted before the kill, {admitted} in the window of {LIMIT} \
             ({over} over: {local} decided locally, {local_admitted} admitted, {repaid} of them \
             told to Redis after, so {lost} lost by replication), {} offered, replica promoted: \
             {promoted}",
            mode.as_str(),
            samples.len(),
        );
        assert!(promoted, "the replica was promoted within 12 s");
        assert!(
            lost * 50 <= LIMIT,
            "{mode:?}: at most 2 % of the window lost by replication: {lost}"
        );
        if mode == FailureMode::Closed {
            assert_eq!(local, 0);
        } else {
            // Each gateway's fallback started from its half of what the window held, so the
            // two together admit what the window had left, not a fresh half window each.
            let seeds = stat(|s| s.fallback_seeds.load(Ordering::Relaxed));
            assert!(seeds >= 1, "the fallback started from the fleet's usage");
            assert!(
                over * 50 <= LIMIT,
                "local: at most 2 % of the window over the limit: {over}"
            );
        }
    }
}
