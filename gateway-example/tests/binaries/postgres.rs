//! The binary with keys and teams in Postgres (`general_settings.database_url`): three gateway
//! processes on one real Postgres and one real `redis-server` share every key, a `FLUSHALL` loses
//! none; Postgres down at start stops the start with a clear message; `import-litellm` brings
//! LiteLLM's keys over and a gateway process serves them. Skipped loudly without Postgres (or
//! Redis) unless `REQUIRE_POSTGRES=1` (`REQUIRE_REDIS=1`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use super::gateway::kill;
use super::keys::{call, client, command, generate_key, new_key_of, start, MASTER};
use super::postgres_server::PostgresServer;
use super::redis_server::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_gateway-example");

/// A fresh dir with `gw.yaml` (one mock model, priced at $1 and $2 per million, [`MASTER`], keys in `database_url`, Redis if
/// given); its `data/` is the (unused) data dir.
fn setup(name: &str, database_url: &str, redis: Option<&RedisServer>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gw-bin-pg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let router = redis.map_or(String::new(), |r| {
        format!("router_settings: {{redis_url: \"{}\"}}\n", r.url())
    });
    std::fs::write(
        dir.join("gw.yaml"),
        format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi, rpm: 100000}}, \
             model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}}}]\n\
             litellm_settings: {{callbacks: [\"dynamic_rate_limiter_v3\"]}}\n\
             general_settings: {{master_key: {MASTER}, database_url: \"{database_url}\"}}\n{router}"
        ),
    )
    .unwrap();
    dir
}

/// A chat as `key`: its status, or `None` when the connection failed.
async fn chat(client: &Client<HttpConnector, Full<Bytes>>, addr: &str, key: &str) -> Option<u16> {
    super::key_limits::chat(client, addr, key)
        .await
        .map(|(status, _)| status)
}

/// Three processes on one Redis and one Postgres: a key made on any one is served by all three
/// within a second; `FLUSHALL` mid-run loses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateway_processes_share_keys_through_postgres_and_flushall_loses_none() {
    let Some(postgres) = PostgresServer::start("three_gateway_processes_share_keys") else {
        return;
    };
    let Some(redis) = RedisServer::start("three_gateway_processes_share_keys") else {
        return;
    };
    let dir = setup("fleet", &postgres.url(), Some(&redis));
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(start(command(&dir, None)).expect("a gateway process starts"));
    }
    let client = client();
    let mut keys = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..12 {
        let (_, maker) = &fleet[i % 3];
        let started = Instant::now();
        let (status, body) = call(&client, maker, "/key/generate", Some("{}"))
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let key = new_key_of(&body);
        for (_, addr) in &fleet {
            loop {
                if chat(&client, addr, &key).await == Some(200) {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "key {i} not served by {addr} within 1 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        slowest = slowest.max(started.elapsed());
        keys.push(key);
        if i == 5 {
            assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
        }
    }
    println!("slowest key served by all 3 processes after {slowest:?} (from its request)");
    for key in &keys {
        for (_, addr) in &fleet {
            assert_eq!(chat(&client, addr, key).await, Some(200), "after FLUSHALL");
        }
    }
    for (mut child, _) in fleet {
        kill(&mut child, "-TERM");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Keys in Postgres and no Redis: each gateway would count limits and budgets in its own process,
/// so a fleet would serve each key's limit once per gateway. A second such process on the same
/// database refuses to start, naming the first (its process id); once the first is killed
/// (`kill -9`: Postgres ends its session), the second starts. Gateways with a Redis for their
/// counters start beside each other, not beside one that counts alone, and it not beside them. Before the lock, the second started and a key's
/// `rpm_limit: 50` served 150 on three gateways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_with_counters_of_its_own_on_one_database_does_not_start() {
    let Some(postgres) = PostgresServer::start("a_second_gateway_with_counters_of_its_own") else {
        return;
    };
    let url = postgres.url();
    let (one, two) = (
        setup("own-counters-1", &url, None),
        setup("own-counters-2", &url, None),
    );
    let (mut first, addr) = start(command(&one, None)).expect("the first starts");
    let e = start(command(&two, None)).expect_err("the second must not start");
    assert!(!e.0.success());
    assert!(
        e.1.contains("other gateways use this database's keys (gateway-example pid ")
            && e.1.contains(&format!("pid {} on", first.id()))
            && e.1.contains("router_settings.redis_url"),
        "{}",
        e.1
    );
    let http = client();
    let key = generate_key(&http, &addr, "{}").await;
    assert_eq!(
        chat(&http, &addr, &key).await,
        Some(200),
        "the first serves"
    );
    kill(&mut first, "-KILL");
    let until = Instant::now() + Duration::from_secs(10);
    let (mut second, addr) = loop {
        match start(command(&two, None)) {
            Ok(started) => break started,
            Err(e) => {
                assert!(Instant::now() < until, "never started: {}", e.1);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(
        chat(&http, &addr, &key).await,
        Some(200),
        "the second serves the key"
    );

    // Gateways with their counters in Redis share the database with each other, never with one
    // that counts on its own: either way round the later one does not start. (Before, a gateway
    // with Redis and one without both started and each served a key's rpm_limit of 50 in full.)
    if let Some(redis) = RedisServer::start("a_second_gateway_with_counters_of_its_own") {
        let (three, four) = (
            setup("shared-counters-1", &url, Some(&redis)),
            setup("shared-counters-2", &url, Some(&redis)),
        );
        let e = start(command(&three, None)).expect_err("not beside a gateway counting alone");
        assert!(
            e.1.contains("another gateway (gateway-example pid ")
                && e.1.contains(&format!("pid {} on", second.id()))
                && e.1
                    .contains("keeps its limiter's counters in its own process"),
            "{}",
            e.1
        );
        kill(&mut second, "-TERM");
        let (mut a, _) = start(command(&three, None)).expect("starts once it is gone");
        let (mut b, _) = start(command(&four, None)).expect("starts beside it: counters in Redis");
        let e = start(command(&one, None)).expect_err("one counting alone, beside them");
        assert!(
            e.1.contains("other gateways use this database's keys") && e.1.contains("and 1 more"),
            "{}",
            e.1
        );
        // Nor beside them with counters in another Redis, or under another prefix in theirs:
        // each Redis would enforce every limit once. (Before, a gateway on a second Redis
        // started and served a key's rpm_limit and budget in full again; a black-box trial.)
        let other_redis = RedisServer::start("a_second_gateway_on_another_redis");
        let elsewhere = [
            other_redis
                .as_ref()
                .map(|r| setup("other-redis", &url, Some(r))),
            Some(setup("other-prefix", &url, Some(&redis))),
        ];
        let yaml = elsewhere[1].as_ref().unwrap().join("gw.yaml");
        let with_prefix = std::fs::read_to_string(&yaml)
            .unwrap()
            .replace("redis_url:", "redis_key_prefix: \"other:\", redis_url:");
        std::fs::write(&yaml, with_prefix).unwrap();
        for dir in elsewhere.iter().flatten() {
            let e = start(command(dir, None)).expect_err("not beside a fleet on another Redis");
            assert!(
                e.1.contains("not in this gateway's Redis under its redis_key_prefix")
                    && e.1.contains(&format!("pid {} on", a.id()))
                    && e.1.contains(&format!("pid {} on", b.id())),
                "{}",
                e.1
            );
        }
        kill(&mut a, "-TERM");
        kill(&mut b, "-TERM");
        for dir in [Some(three), Some(four)]
            .into_iter()
            .chain(elsewhere)
            .flatten()
        {
            let _ = std::fs::remove_dir_all(&dir);
        }
    } else {
        kill(&mut second, "-TERM");
    }
    for dir in [one, two] {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Postgres down: the binary exits non-zero at once, saying why, the password hidden.
#[test]
fn the_binary_does_not_start_without_its_postgres() {
    let Some(mut postgres) = PostgresServer::start("the_binary_does_not_start") else {
        return;
    };
    postgres.kill();
    let url = format!(
        "postgres://gw:secret-pw@127.0.0.1:{}/postgres",
        postgres.port()
    );
    let dir = setup("down", &url, None);
    let started = Instant::now();
    let e = start(command(&dir, None)).expect_err("must not start");
    assert!(!e.0.success());
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(e.1.contains("so the gateway does not start"), "{}", e.1);
    assert!(e.1.contains("gw:***@127.0.0.1"), "{}", e.1);
    assert!(!e.1.contains("secret-pw"), "{}", e.1);
    let _ = std::fs::remove_dir_all(&dir);
}

fn import(database_url: &str) -> std::process::Output {
    Command::new(BIN)
        .args(["import-litellm", "--database-url", database_url])
        .output()
        .unwrap()
}

/// `import-litellm` on a LiteLLM database (its tables from its schema, a key as LiteLLM writes
/// it): the report names what it cannot honour, and a gateway process on the same database
/// serves the LiteLLM key unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_litellm_brings_litellm_keys_to_a_gateway_process() {
    let Some(postgres) = PostgresServer::start("import_litellm_brings_litellm_keys") else {
        return;
    };
    let (db, connection) = tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.batch_execute(include_str!("../../../tests/src/litellm_tables.sql"))
        .await
        .unwrap();
    let litellm_key = "sk-issuedByLiteLLM000000000001";
    let token = gateway_example::keys::hash_key(litellm_key);
    db.batch_execute(&format!(
        "INSERT INTO \"LiteLLM_VerificationToken\" (token, key_name, key_alias, models, metadata, max_budget) \
         VALUES ('{token}', 'sk-...0001', 'from-litellm', '{{m}}', '{{\"team\": \"x\"}}', 5.0)"
    ))
    .await
    .unwrap();

    let out = import(&postgres.url());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("imported 1 new keys and 0 new teams"),
        "{stdout}"
    );
    // Budgets come over; the metadata's other members are kept in the record.
    assert!(!stdout.contains("max_budget"), "{stdout}");

    let dir = setup("import", &postgres.url(), None);
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let client = client();
    assert_eq!(chat(&client, &addr, litellm_key).await, Some(200));
    assert_eq!(chat(&client, &addr, "sk-notIssued").await, Some(401));
    kill(&mut child, "-TERM");

    // Not a Postgres URL: a clear refusal, nothing done.
    let out = import("mysql://db/litellm");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--database-url") && stderr.contains("Postgres URL"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

/// One answer (10 prompt, 20 completion tokens) at $1 and $2 per million.
const COST: f64 = 0.00005;

/// A key's spend as `/key/info` shows it, in answers (`None` while the gateway does not answer).
async fn spent_answers(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: &str,
    key: &str,
) -> Option<usize> {
    let (status, body) = call(client, addr, &format!("/key/info?key={key}"), None).await?;
    if status != 200 {
        return None;
    }
    let info: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some((info["info"]["spend"].as_f64()? / COST).round() as usize)
}

/// Two gateway processes on one Redis and one Postgres, four clients spending on one key as fast
/// as they are answered. One gateway is killed with SIGKILL under its clients; then Redis is
/// emptied (`FLUSHALL`). The spend that comes back from Postgres is every answer's, less at most
/// those the killed gateway answered in its last moments (its settlements not yet sent to
/// Redis), and never more than was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_flushall_on_a_fleet_lose_at_most_the_spend_in_flight() {
    let Some(postgres) = PostgresServer::start("kill_9_and_flushall_on_a_fleet") else {
        return;
    };
    let Some(redis) = RedisServer::start("kill_9_and_flushall_on_a_fleet") else {
        return;
    };
    let dir = setup("spend", &postgres.url(), Some(&redis));
    let (mut doomed, doomed_addr) = start(command(&dir, None)).expect("a gateway process starts");
    let (mut survivor, survivor_addr) = start(command(&dir, None)).expect("a second one starts");
    let http = client();
    let key = generate_key(&http, &doomed_addr, r#"{"max_budget": 1000}"#).await;
    let learnt = Instant::now();
    while chat(&http, &survivor_addr, &key).await != Some(200) {
        assert!(
            learnt.elapsed() < Duration::from_secs(5),
            "the second gateway serves the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Four clients, two per gateway; each answer's time is kept, by gateway.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let addr = if i % 2 == 0 {
                doomed_addr.clone()
            } else {
                survivor_addr.clone()
            };
            let (key, stop, http) = (key.clone(), stop.clone(), client());
            tokio::spawn(async move {
                let mut answered = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match chat(&http, &addr, &key).await {
                        Some(200) => answered.push(Instant::now()),
                        Some(other) => panic!("status {other}"),
                        // The killed gateway: its client stops.
                        None => break,
                    }
                }
                (i % 2 == 0, answered)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    kill(&mut doomed, "-KILL");
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut total, mut doomed_recent) = (1, 0); // the survivor's first answer
    for c in clients {
        let (on_doomed, answered) = c.await.unwrap();
        total += answered.len();
        if on_doomed {
            doomed_recent += answered
                .iter()
                .filter(|&&t| killed.duration_since(t) < Duration::from_millis(400))
                .count();
        }
    }
    // The survivor's spend writer has run after its last settlement (every 200 ms) once Redis's
    // spend and Postgres's copy agree.
    let hash = gateway_example::keys::hash_key(&key);
    let copied = || async {
        let (db, connection) = tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        db.query(
            // Under the key's counter id, which its record holds.
            "SELECT spent FROM tpl_spend WHERE kind = 'key' AND model = '' AND id = \
             (SELECT COALESCE(record::json->>'counter_id', token) FROM tpl_keys WHERE token = $1)",
            &[&hash],
        )
        .await
        .unwrap()
        .first()
        .map_or(0, |r| {
            (r.get::<_, i64>(0) as f64 / 1e9 / COST).round() as usize
        })
    };
    // Both read afresh each time: the survivor may still be sending its last settlements.
    let agreed = Instant::now();
    let in_redis = loop {
        let in_redis = spent_answers(&http, &survivor_addr, &key).await;
        if in_redis.is_some_and(|n| n > 0) && in_redis == Some(copied().await) {
            break in_redis.unwrap_or(0);
        }
        assert!(
            agreed.elapsed() < Duration::from_secs(10),
            "the copy catches up with Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    let flushed = Instant::now();
    let kept = loop {
        match spent_answers(&http, &survivor_addr, &key).await {
            Some(n) if n == in_redis => break n,
            _ => {}
        }
        assert!(
            flushed.elapsed() < Duration::from_secs(10),
            "the spend comes back after FLUSHALL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "{total} answered on 2 gateways, {kept} kept after kill -9 of one and FLUSHALL, {} lost \
         ({doomed_recent} answered by the killed one in its last 400 ms); back {:?} after FLUSHALL",
        total - kept.min(total),
        flushed.elapsed()
    );
    assert!(kept <= total, "counted twice: {kept} of {total}");
    assert!(
        total - kept <= doomed_recent,
        "lost {} of {total}, more than the killed gateway's last {doomed_recent}",
        total - kept
    );
    kill(&mut survivor, "-TERM");
    std::fs::remove_dir_all(&dir).unwrap();
}
