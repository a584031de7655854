//! Keys and teams in Postgres (`general_settings.database_url`): gateways built as `main` builds
//! them (`Gateway::connect`, each with its own pool and listening connection) on one real
//! Postgres and, for the fleet, one real `redis-server` holding the limiter's counters. Each test
//! starts its own servers ([`integration_tests::postgres`]) and skips loudly where Postgres is not
//! installed, unless `REQUIRE_POSTGRES=1`.
//!
//! - every key and team operation made on one gateway reaches the others within a second (the
//!   same scenarios as the Redis key tests in `gateway_keys.rs`);
//! - a fleet of 3 on one Redis and one Postgres: keys made on any work on all (the propagation
//!   time is measured and printed), and `FLUSHALL` loses none;
//! - the failure policy: Postgres down at start stops the start; down later, known keys are
//!   served and writes get a 503; slow (a lock held), writes time out and lookups are unaffected;
//! - `import-litellm`: LiteLLM's tables made from its schema, filled as LiteLLM fills them,
//!   imported, and its keys served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_example::config::{DatabaseUrl, GatewayConfig};
use gateway_example::keys::{hash_key, DEFAULT_POSTGRES_TIMEOUT};
use gateway_example::Gateway;
use integration_tests::gateway::{Gw, Reply, TempDir, MASTER};
use integration_tests::postgres::PostgresServer;
use integration_tests::redis::RedisServer;
use integration_tests::relay::Relay;
use serde_json::{json, Value};

use super::gateway_keys::within;

/// The quick-start mock model (30 tokens per answer).
const M: &str = "my-fake-model";

/// How long a change may take to reach another gateway.
const PROPAGATION: Duration = Duration::from_secs(1);

fn config(postgres: &PostgresServer, redis: Option<&RedisServer>) -> String {
    let router = match redis {
        Some(r) => format!("router_settings:\n  redis_url: \"{}\"\n", r.url()),
        None => String::new(),
    };
    format!(
        r#"
model_list:
  - model_name: my-fake-model
    litellm_params: {{model: openai/my-fake-model, mock_response: "hello-world", tpm: 600000}}
  - model_name: other
    litellm_params: {{model: openai/other, mock_response: "hello-world"}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.9, "dev": 0.1}}
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
general_settings:
  master_key: {MASTER}
  database_url: "{}"
{router}"#,
        postgres.url()
    )
}

async fn gateways(yaml: &str, n: usize) -> (Vec<Arc<Gw>>, Vec<TempDir>) {
    let mut gateways = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..n {
        let dir = TempDir::new();
        gateways.push(Arc::new(Gw::connect(yaml, Some(&dir.0)).await));
        dirs.push(dir);
    }
    for gw in &gateways {
        let health = gw.get("/health/readiness", None).await.json();
        assert_eq!(health["key_store"], "postgres", "{health}");
    }
    (gateways, dirs)
}

/// Waits until `gw` answers `key`'s chats with `status`; returns how long that took, failing
/// past [`PROPAGATION`].
async fn answers_within_a_second(gw: &Gw, key: &str, status: u16, what: &str) -> Duration {
    replies_within_a_second(gw, key, what, |r| r.status == status).await
}

/// Waits until `gw`'s reply to a chat with `key` passes `check`; returns how long that took,
/// failing past [`PROPAGATION`].
async fn replies_within_a_second(
    gw: &Gw,
    key: &str,
    what: &str,
    check: impl Fn(&Reply) -> bool,
) -> Duration {
    let took = within(PROPAGATION * 3, what, || async {
        check(&gw.chat(key, M, false).await)
    })
    .await;
    assert!(took <= PROPAGATION, "{what}: {took:?}");
    took
}

fn assert_store_unavailable(r: &Reply) {
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("key store unavailable: Postgres at "),
        "{v}"
    );
    assert_eq!(v["error"]["type"], "service_unavailable", "{v}");
}

/// A client of the test's Postgres, its connection driven in the background.
async fn sql(postgres: &PostgresServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls)
        .await
        .expect("connect to the test's Postgres");
    tokio::spawn(connection);
    client
}

/// Every operation made on one gateway reaches the other within a second, with the semantics
/// of the embedded and Redis stores: keys (chosen, expiring, blocked, updated, regenerated,
/// listed, deleted) and teams (priority, models, blocked); the database holds hashes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_and_team_change_on_one_gateway_reaches_the_other_within_a_second() {
    let Some(postgres) = PostgresServer::start("every_key_and_team_change_on_one_gateway") else {
        return;
    };
    let (gw, _dirs) = gateways(&config(&postgres, None), 2).await;
    let (a, b) = (&gw[0], &gw[1]);

    // A key made on A works on B at once, not only once B is notified: B reads a key (and a
    // team) it does not hold from Postgres.
    for i in 0..20 {
        let team = a.new_team(json!({"metadata": {"priority": "prod"}})).await;
        let fresh = a.new_key(json!({"team_id": team})).await;
        let r = b.chat(&fresh, M, false).await;
        assert_eq!(r.status, 200, "try {i}: {}", r.text());
        assert_eq!(r.headers["x-litellm-priority"], "prod", "with its team");
    }

    // A key: on A at once, on B within a second.
    let key = a.new_key(json!({"key_alias": "shared"})).await;
    assert_eq!(a.chat(&key, M, false).await.status, 200, "at once on A");
    answers_within_a_second(b, &key, 200, "B serves a key made on A").await;
    let info = b.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(info.json()["info"]["key_alias"], "shared");
    assert_eq!(b.chat("sk-not-a-key", M, false).await.status, 401);

    // A chosen key is taken on B too; an expired one is refused there.
    let chosen = "sk-fleet-chosen-0123456789";
    let r = a
        .post("/key/generate", Some(MASTER), json!({"key": chosen}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    answers_within_a_second(b, chosen, 200, "B serves the chosen key").await;
    let r = b
        .post("/key/generate", Some(MASTER), json!({"key": chosen}))
        .await;
    assert_eq!(
        r.status,
        400,
        "taken, on the other gateway too: {}",
        r.text()
    );
    let past = a.new_key(json!({"expires": "2020-01-01T00:00:00Z"})).await;
    within(PROPAGATION, "B knows the expired key", || async {
        b.get(&format!("/key/info?key={past}"), Some(MASTER))
            .await
            .status
            == 200
    })
    .await;
    let r = b.chat(&past, M, false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        r.error_message().contains("Expired Key"),
        "{}",
        r.error_message()
    );

    // Blocked on A, refused on B; unblocked on B, then held to new models on A.
    let r = a
        .post("/key/block", Some(MASTER), json!({"key": key}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(a.chat(&key, M, false).await.status, 401, "at once on A");
    answers_within_a_second(b, &key, 401, "B refuses the blocked key").await;
    let r = b
        .post("/key/unblock", Some(MASTER), json!({"key": key}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = b
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "models": ["other"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    answers_within_a_second(a, &key, 403, "A holds the key to its new models").await;

    // Teams: the team's priority beats the key's; a change and a block follow on B.
    let team = a
        .new_team(json!({"team_alias": "search", "metadata": {"priority": "prod"}}))
        .await;
    let in_team = a
        .new_key(json!({"metadata": {"priority": "dev"}, "team_id": team}))
        .await;
    answers_within_a_second(b, &in_team, 200, "B serves the team's key").await;
    assert_eq!(
        b.chat(&in_team, M, false).await.headers["x-litellm-priority"],
        "prod"
    );
    let r = b
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"team_id": "no-such-team"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = a
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "metadata": {"priority": "dev"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    within(PROPAGATION, "B follows the team's new priority", || async {
        b.chat(&in_team, M, false).await.headers["x-litellm-priority"] == "dev"
    })
    .await;
    let r = a
        .post("/team/block", Some(MASTER), json!({"team_id": team}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    answers_within_a_second(b, &in_team, 401, "B refuses the blocked team's key").await;
    let r = b
        .post("/team/unblock", Some(MASTER), json!({"team_id": team}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    answers_within_a_second(a, &in_team, 200, "A serves the key again").await;
    let info = b
        .get(&format!("/team/info?team_id={team}"), Some(MASTER))
        .await;
    assert_eq!(info.json()["team_info"]["team_alias"], "search");

    // Moved to another team on B: A follows within a second; a team that does not exist is
    // refused by name (Postgres's foreign key) and nothing changes.
    let other = b
        .new_team(json!({"team_id": "other", "metadata": {"priority": "prod"}}))
        .await;
    let r = b
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": in_team, "team_id": "no-such-team"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error_message().contains("\"no-such-team\""),
        "{}",
        r.text()
    );
    let r = b
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": in_team, "team_id": other}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    replies_within_a_second(a, &in_team, "A follows the key to its new team", |r| {
        r.headers
            .get("x-litellm-priority")
            .is_some_and(|p| p == "prod")
    })
    .await;
    let v = a
        .get(&format!("/team/info?team_id={other}"), Some(MASTER))
        .await
        .json();
    assert_eq!(v["keys"].as_array().map(Vec::len), Some(1), "{v}");
    let r = a
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": in_team, "team_id": team}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // Regenerated on A: the new value works on B, the old one stops there; B lists A's keys.
    let r = a
        .post("/key/regenerate", Some(MASTER), json!({"key": in_team}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let new = r.json()["key"].as_str().unwrap().to_owned();
    assert_eq!(a.chat(&in_team, M, false).await.status, 401, "at once on A");
    answers_within_a_second(b, &new, 200, "B serves the new value").await;
    answers_within_a_second(b, &in_team, 401, "B refuses the old value").await;
    let v = b.get("/key/list?size=10", Some(MASTER)).await.json();
    assert_eq!(v["total_count"], 24, "the 20 read at once, and four: {v}");

    // Deleted on A: refused there at once, on B within a second.
    let r = a
        .post("/key/delete", Some(MASTER), json!({"keys": [key]}))
        .await;
    assert_eq!(r.json()["deleted_keys"][0], key.as_str(), "{}", r.text());
    assert_eq!(a.chat(&key, M, false).await.status, 401, "at once on A");
    answers_within_a_second(b, &key, 401, "B refuses the deleted key").await;

    // Postgres holds hashes, never a key.
    let db = sql(&postgres).await;
    let rows = db
        .query("SELECT token || record FROM tpl_keys", &[])
        .await
        .unwrap();
    let stored: String = rows.iter().map(|r| r.get::<_, String>(0)).collect();
    assert!(stored.contains(&hash_key(&new)), "{stored}");
    for k in [&new, chosen, &past] {
        assert!(
            !stored.contains(&k["sk-".len()..]),
            "a raw key reached Postgres"
        );
    }
}

/// Three gateways on one Redis (the limiter's counters) and one Postgres (keys and teams): a
/// key made on any one works on all within a second (each time measured, the figures printed);
/// `FLUSHALL` on Redis mid-run loses no key, and a gateway started after it has them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_keys_through_postgres_and_flushall_loses_none() {
    let Some(postgres) = PostgresServer::start("three_gateways_share_keys_through_postgres") else {
        return;
    };
    let Some(redis) = RedisServer::start("three_gateways_share_keys_through_postgres") else {
        return;
    };
    let yaml = config(&postgres, Some(&redis));
    let (fleet, _dirs) = gateways(&yaml, 3).await;
    for gw in &fleet {
        let health = gw.get("/health/readiness", None).await.json();
        assert_eq!(health["limiter_store"], "redis", "{health}");
    }
    let mut keys = Vec::new();
    let mut took = Vec::new();
    for i in 0..30 {
        let maker = &fleet[i % 3];
        // From the request: the write, its commit, and every gateway's reading it back.
        let made = Instant::now();
        let key = maker.new_key(json!({"key_alias": format!("k{i}")})).await;
        for gw in &fleet {
            within(PROPAGATION, "every gateway serves the new key", || async {
                gw.gateway.keys().resolve(&key).await.unwrap().is_some()
            })
            .await;
        }
        took.push(made.elapsed());
        keys.push(key);
        if i == 15 {
            assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
        }
    }
    took.sort();
    println!(
        "a key made on one gateway served by all 3, from the /key/generate request (n = {}): \
         p50 {:?}, max {:?}",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    assert!(took[took.len() - 1] <= PROPAGATION, "{took:?}");
    // After the FLUSHALL, every key still works on every gateway, over HTTP.
    for (i, key) in keys.iter().enumerate() {
        let r = fleet[(i + 1) % 3].chat(key, M, false).await;
        assert_eq!(r.status, 200, "key {i}: {}", r.text());
    }
    let fresh = TempDir::new();
    let late = Gw::connect(&yaml, Some(&fresh.0)).await;
    for key in &keys {
        assert_eq!(late.chat(key, M, false).await.status, 200);
    }
    let v = late.get("/key/list?size=100", Some(MASTER)).await.json();
    assert_eq!(v["total_count"], 30, "{v}");
}

/// Postgres unreachable at start: the gateway does not start, and says why, naming the database
/// without its password.
#[tokio::test]
async fn a_gateway_does_not_start_when_postgres_is_unreachable() {
    let Some(mut postgres) = PostgresServer::start("a_gateway_does_not_start_when_postgres") else {
        return;
    };
    postgres.kill();
    let url = format!(
        "postgres://gw:secret-pw@127.0.0.1:{}/postgres",
        postgres.port()
    );
    let yaml = format!(
        "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
         general_settings: {{master_key: {MASTER}, database_url: \"{url}\"}}\n"
    );
    let config = GatewayConfig::from_yaml_str(&yaml).unwrap();
    let started = Instant::now();
    let e = Gateway::connect(config, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(e.contains("the gateway does not start"), "{e}");
    assert!(
        e.contains("in Postgres (general_settings.database_url)"),
        "where the URL was read: {e}"
    );
    assert!(
        e.contains(&format!("gw:***@127.0.0.1:{}", postgres.port())),
        "{e}"
    );
    assert!(!e.contains("secret-pw"), "{e}");
    // Not a Postgres URL at all: the config names the setting.
    let bad = yaml.replace(&url, "mysql://db/keys");
    let e = GatewayConfig::from_yaml_str(&bad).unwrap_err().to_string();
    assert!(e.contains("general_settings.database_url"), "{e}");
}

/// Postgres down while the gateways run: known keys keep working, every write gets a 503 (never
/// a 401 or a lost change); back up, writes work and the other gateway follows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_known_keys_are_served_and_writes_get_503() {
    let Some(mut postgres) = PostgresServer::start("postgres_down_known_keys_are_served") else {
        return;
    };
    let (gw, _dirs) = gateways(&config(&postgres, None), 2).await;
    let (a, b) = (&gw[0], &gw[1]);
    let team = a.new_team(json!({})).await;
    let key = a.new_key(json!({"team_id": team})).await;
    answers_within_a_second(b, &key, 200, "B serves the key").await;

    let following = |g: &Gw| g.gateway.keys().as_postgres().unwrap().is_listening();
    assert!(following(a) && following(b));
    assert_eq!(readiness(a).await["status"], "healthy");
    // Hung: its connections stay open (still "following"), but nothing answers.
    postgres.pause();
    let v = readiness(a).await;
    assert_eq!(
        (&v["status"], &v["key_store_reachable"]),
        (&json!("degraded"), &json!(false)),
        "{v}"
    );
    postgres.resume();
    within(
        PROPAGATION,
        "readiness sees Postgres answer again",
        || async { readiness(a).await["status"] == "healthy" },
    )
    .await;
    postgres.kill();
    within(PROPAGATION, "the gateways see Postgres gone", || async {
        !following(a) && !following(b)
    })
    .await;
    for g in [a, b] {
        assert_eq!(
            g.chat(&key, M, false).await.status,
            200,
            "known keys are served"
        );
        assert_eq!(g.chat("sk-unknown", M, false).await.status, 401);
        assert_eq!(g.chat(MASTER, M, false).await.status, 200);
    }
    for (path, body) in [
        ("/key/generate", json!({})),
        ("/key/block", json!({"key": key})),
        ("/key/update", json!({"key": key, "models": ["other"]})),
        ("/key/regenerate", json!({"key": key})),
        ("/key/delete", json!({"keys": [key]})),
        ("/team/new", json!({})),
        ("/team/block", json!({"team_id": team})),
    ] {
        let r = a.post(path, Some(MASTER), body).await;
        assert_store_unavailable(&r);
    }
    assert_eq!(a.chat(&key, M, false).await.status, 200, "no write landed");
    // Reads are served from memory meanwhile.
    let info = a.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(info.status, 200, "{}", info.text());
    assert_eq!(readiness(a).await["key_store_reachable"], false);

    postgres.restart();
    let made = within(Duration::from_secs(10), "writes work again", || async {
        a.post("/key/generate", Some(MASTER), json!({}))
            .await
            .status
            == 200
    })
    .await;
    println!("first write served {made:?} after Postgres was back");
    within(
        Duration::from_secs(5),
        "the gateways follow Postgres again",
        || async { following(a) && following(b) },
    )
    .await;
    let after = a.new_key(json!({})).await;
    answers_within_a_second(b, &after, 200, "B follows again after the outage").await;
}

async fn readiness(g: &Gw) -> Value {
    let r = g.get("/health/readiness", None).await;
    assert_eq!(r.status, 200, "always a 200: {}", r.text());
    r.json()
}

/// A slow Postgres (a lock held on the keys table by another session, so writes wait): a write
/// gets its 503 at the timeout, and keys are served meanwhile without waiting; once the lock is
/// gone, writes work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_postgres_times_writes_out_and_lookups_do_not_wait() {
    let Some(postgres) = PostgresServer::start("a_slow_postgres_times_writes_out") else {
        return;
    };
    let (gw, _dirs) = gateways(&config(&postgres, None), 1).await;
    let gw = gw[0].clone();
    let key = gw.new_key(json!({})).await;
    let mut locker = sql(&postgres).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE tpl_keys IN EXCLUSIVE MODE")
        .await
        .unwrap();

    let write = {
        let gw = gw.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = gw.post("/key/generate", Some(MASTER), json!({})).await;
            (r, started.elapsed())
        })
    };
    // While the write waits, lookups answer: each within a fraction of the write's timeout.
    let mut served = 0;
    while !write.is_finished() {
        let started = Instant::now();
        assert_eq!(gw.chat(&key, M, false).await.status, 200);
        assert!(
            started.elapsed() < DEFAULT_POSTGRES_TIMEOUT / 4,
            "a lookup waited {:?}",
            started.elapsed()
        );
        served += 1;
    }
    let (r, took) = write.await.unwrap();
    assert_store_unavailable(&r);
    // The server's own `statement_timeout` (its clock, started when the statement arrives) can
    // end the write a few milliseconds before the client's bound: it waited, it did not fail fast.
    assert!(took >= DEFAULT_POSTGRES_TIMEOUT / 2, "{took:?}");
    assert!(took < DEFAULT_POSTGRES_TIMEOUT * 3, "{took:?}");
    assert!(served > 0);
    lock.rollback().await.unwrap();
    let r = gw.post("/key/generate", Some(MASTER), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The timed-out write left nothing: the one key and the new one.
    let v = gw.get("/key/list?size=10", Some(MASTER)).await.json();
    assert_eq!(v["total_count"], 2, "{v}");
}

/// LiteLLM's two tables, as its `schema.prisma` defines them (shared with the binary's test).
const LITELLM_TABLES: &str = include_str!("../src/litellm_tables.sql");

/// A key as LiteLLM's `/key/generate` writes it: the SHA-256 hex of the key as `token`, its
/// abbreviated form as `key_name`.
async fn litellm_key(db: &tokio_postgres::Client, key: &str, columns: &str, values: &str) {
    let token = hash_key(key);
    let name = format!("sk-...{}", &key[key.len() - 4..]);
    let sql = format!(
        "INSERT INTO \"LiteLLM_VerificationToken\" (token, key_name, created_by, updated_by{columns}) \
         VALUES ('{token}', '{name}', 'default_user_id', 'default_user_id'{values})"
    );
    db.batch_execute(&sql).await.expect(&sql);
}

/// LiteLLM's tables filled as LiteLLM fills them, imported with `import-litellm`'s function,
/// then served by a gateway on the same database: its keys authenticate unchanged, with their
/// team, priority, models, expiry and block; what the gateway does not honour is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_issued_by_litellm_are_imported_and_served_unchanged() {
    let Some(postgres) = PostgresServer::start("keys_issued_by_litellm_are_imported") else {
        return;
    };
    let db = sql(&postgres).await;
    db.batch_execute(LITELLM_TABLES).await.unwrap();
    db.batch_execute(
        r#"INSERT INTO "LiteLLM_TeamTable" (team_id, team_alias, admins, members, metadata, models, tpm_limit)
           VALUES ('team-search', 'search', '{}', '{}', '{"priority": "prod"}', '{my-fake-model}', 1000),
                  ('team-open', NULL, '{}', '{}', '{}', '{all-proxy-models}', NULL)"#,
    )
    .await
    .unwrap();
    let (in_team, plain, expired, blocked, limited) = (
        "sk-litellmInTeam0000000001",
        "sk-litellmPlain00000000002",
        "sk-litellmExpired000000003",
        "sk-litellmBlocked000000004",
        "sk-litellmLimited000000005",
    );
    litellm_key(
        &db,
        in_team,
        ", key_alias, team_id, models, metadata",
        ", 'in-team', 'team-search', '{}', '{\"priority\": \"dev\"}'",
    )
    .await;
    litellm_key(
        &db,
        plain,
        ", models, metadata, expires",
        // LiteLLM keeps per-model limits (and other settings) in `metadata`.
        ", '{other}', '{\"priority\": \"dev\", \"model_rpm_limit\": {\"other\": 1}, \
         \"tags\": [\"t\"]}', now() + interval '1 day'",
    )
    .await;
    litellm_key(
        &db,
        expired,
        ", models, expires",
        ", '{}', now() - interval '1 day'",
    )
    .await;
    litellm_key(&db, blocked, ", models, blocked", ", '{}', true").await;
    litellm_key(
        &db,
        limited,
        ", key_alias, models, rpm_limit, max_budget, spend, team_id",
        ", 'limited', '{all-team-models}', 10, 5.0, 1.25, 'team-open'",
    )
    .await;
    // Its whole budget spent in LiteLLM's current day (which ends in 6 hours).
    let spent = "sk-litellmSpent00000000007";
    litellm_key(
        &db,
        spent,
        ", models, max_budget, spend, budget_duration, budget_reset_at",
        ", '{}', 1.0, 1.0, '1d', now() at time zone 'utc' + interval '6 hours'",
    )
    .await;
    litellm_key(
        &db,
        "sk-litellmOrphan0000000006",
        ", team_id",
        ", 'team-gone'",
    )
    .await;

    // Limits LiteLLM keeps beside the key: its user's, its user's in a team, a shared budget.
    db.batch_execute(
        r#"INSERT INTO "LiteLLM_UserTable" (user_id, max_budget, rpm_limit) VALUES ('u-bob', 0.01, 1);
           INSERT INTO "LiteLLM_BudgetTable" (budget_id, rpm_limit, max_parallel_requests)
               VALUES ('bud-shared', 2, 1), ('bud-member', 3, NULL);
           INSERT INTO "LiteLLM_TeamMembership" (user_id, team_id, budget_id)
               VALUES ('u-bob', 'team-search', 'bud-member');
           UPDATE "LiteLLM_VerificationToken" SET user_id = 'u-bob' WHERE key_alias = 'in-team';
           UPDATE "LiteLLM_VerificationToken" SET budget_id = 'bud-shared' WHERE key_alias = 'limited';"#,
    )
    .await
    .unwrap();

    let url = DatabaseUrl::parse(&postgres.url(), "test").unwrap();
    let report = gateway_example::keys::litellm::import(&url, &url)
        .await
        .unwrap();
    let text = report.to_string();
    println!("{text}");
    assert_eq!((report.new_keys, report.new_teams), (6, 2), "{text}");
    // Each limit that reaches a key from outside its row is named with what it held.
    for said in [
        "LiteLLM_UserTable limits and budgets (users are not imported: their keys are served \
         without them) set on 1: u-bob (max_budget 0.01, rpm_limit 1; keys in-team)",
        "LiteLLM_TeamMembership.budget_id (a member's own budget in a team: not imported) set on \
         1: u-bob in \"team-search\" (budget \"bud-member\")",
        "LiteLLM_BudgetTable rows named by a key's budget_id (shared limits and budgets: not \
         imported) set on 1: bud-shared (rpm_limit 2, max_parallel_requests 1; keys limited)",
    ] {
        assert!(text.contains(said), "{said}\n{text}");
    }
    assert!(
        !text.contains("tables were in use"),
        "a first import: {text}"
    );
    assert!(
        text.starts_with("read 7 keys and 2 teams")
            && text.contains("or are not imported: 1 below"),
        "the orphan was read too: {text}"
    );
    // The key and team rows' limits are brought over and honoured (docs/gateway.md, "Key and
    // team limits"), and so are their budgets and what was spent: none of their columns named.
    for table in ["LiteLLM_VerificationToken.", "LiteLLM_TeamTable."] {
        for column in [
            "rpm_limit",
            "tpm_limit",
            "max_budget",
            "spend",
            "budget_duration",
            "budget_reset_at",
        ] {
            assert!(!text.contains(&format!("{table}{column}")), "{text}");
        }
    }
    assert!(
        text.contains("spend of 2 budgets written to tpl_spend"),
        "{text}"
    );
    assert!(
        text.contains("not imported: key ") && text.contains("team-gone"),
        "{text}"
    );
    // A setting LiteLLM reads in `metadata` and this gateway does not honour is named.
    assert!(
        text.contains("LiteLLM_VerificationToken.metadata.tags"),
        "{text}"
    );
    // Bookkeeping columns are not reported.
    assert!(
        !text.contains("key_name") && !text.contains("created_by"),
        "{text}"
    );
    // Again: nothing new, nothing changed.
    let again = gateway_example::keys::litellm::import(&url, &url)
        .await
        .unwrap();
    assert_eq!((again.new_keys, again.new_teams), (0, 0));
    assert!(again.differ.is_empty(), "{again}");

    // LiteLLM changed since: a key blocked, a team's limit lowered, a new key with spend and an
    // alias another key holds. Imported again: the changes are named, not taken over; the new
    // spend is said not to reach a fleet already running on Redis.
    db.batch_execute(
        r#"UPDATE "LiteLLM_VerificationToken" SET blocked = true WHERE key_alias = 'limited';
           UPDATE "LiteLLM_TeamTable" SET tpm_limit = 500 WHERE team_id = 'team-search';"#,
    )
    .await
    .unwrap();
    litellm_key(
        &db,
        "sk-litellmLate00000000008",
        ", key_alias, max_budget, spend",
        ", 'in-team', 2.0, 0.5",
    )
    .await;
    let later = gateway_example::keys::litellm::import(&url, &url)
        .await
        .unwrap();
    let text = later.to_string();
    assert_eq!((later.new_keys, later.new_teams), (1, 0), "{text}");
    assert_eq!(
        later.differ,
        ["limited: blocked", "team \"team-search\": tpm_limit"],
        "{text}"
    );
    assert_eq!(later.aliases_lost.len(), 1, "{text}");
    assert!(later.aliases_lost[0].ends_with("(\"in-team\")"), "{text}");
    assert!(
        text.contains(
            "gateways already running on them with Redis do not read the spend of the 1 new"
        ),
        "{text}"
    );
    assert_eq!(
        gateway_example::keys::litellm::import(&url, &url)
            .await
            .unwrap()
            .spend_not_seen,
        Vec::<String>::new(),
        "nothing new"
    );

    let (gw, _dirs) = gateways(&priced(&postgres, None), 1).await;
    let gw = &gw[0];
    let info = gw
        .get(&format!("/key/info?key={limited}"), Some(MASTER))
        .await
        .json();
    assert_eq!(info["info"]["max_budget"], 5.0, "{info}");
    assert!(same_dollars(key_spend(gw, limited).await, 1.25), "{info}");
    let r = gw.chat(spent, M, false).await;
    assert_eq!(r.status, 400, "the budget LiteLLM saw spent: {}", r.text());
    assert_eq!(r.headers["x-priority-limit-refused-by"], "key_budget");
    let info = gw
        .get(&format!("/key/info?key={spent}"), Some(MASTER))
        .await
        .json();
    // LiteLLM's period kept: it ends when LiteLLM would have reset it.
    let reset = info["info"]["budget_reset_at"].as_str().unwrap_or_default();
    let reset = gateway_example::keys::expiry::parse_iso(reset).expect("a reset time") as i64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((reset - now - 6 * 3_600).abs() < 120, "{info}");
    let r = gw.chat(in_team, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.headers["x-litellm-priority"], "prod",
        "the team's priority"
    );
    assert_eq!(
        gw.chat(in_team, "other", false).await.status,
        403,
        "the team's models"
    );
    let r = gw.chat(plain, "other", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-priority"], "dev");
    let r = gw.chat(plain, "other", false).await;
    assert_eq!(
        r.status,
        429,
        "its metadata's model_rpm_limit: {}",
        r.text()
    );
    assert_eq!(
        r.headers["x-priority-limit-refused-by"],
        "key_model_requests"
    );
    assert_eq!(
        gw.chat(plain, M, false).await.status,
        403,
        "the key's models"
    );
    let r = gw.chat(expired, M, false).await;
    assert_eq!(r.status, 401);
    assert!(
        r.error_message().contains("Expired Key"),
        "{}",
        r.error_message()
    );
    assert_eq!(gw.chat(blocked, M, false).await.status, 401);
    for model in [M, "other"] {
        assert_eq!(
            gw.chat(limited, model, false).await.status,
            200,
            "every model"
        );
    }
    assert_eq!(
        gw.chat("sk-litellmOrphan0000000006", M, false).await.status,
        401
    );
    let info: Value = gw
        .get(&format!("/key/info?key={in_team}"), Some(MASTER))
        .await
        .json();
    assert_eq!(info["info"]["key_alias"], "in-team", "{info}");
    assert_eq!(info["info"]["team_id"], "team-search", "{info}");

    // A value the gateway cannot hold stops the import, which names the row and writes nothing.
    litellm_key(
        &db,
        "sk-litellmHuge000000000009",
        ", key_alias, max_budget",
        ", 'huge', 10000000",
    )
    .await;
    let e = gateway_example::keys::litellm::import(&url, &url)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_budget 10000000")
            && e.contains("the LiteLLM_VerificationToken row of key_alias \"huge\""),
        "{e}"
    );
    let huge = gw.chat("sk-litellmHuge000000000009", M, false).await;
    assert_eq!(huge.status, 401, "nothing written");
}

/// An import while gateways run on the database: they serve the imported keys within a second,
/// a large one (more rows than are read back one by one) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_gateways_serve_imported_keys_within_a_second() {
    let Some(postgres) = PostgresServer::start("running_gateways_serve_imported_keys") else {
        return;
    };
    let db = sql(&postgres).await;
    db.batch_execute(LITELLM_TABLES).await.unwrap();
    let (gw, _dirs) = gateways(&config(&postgres, None), 2).await;
    let url = DatabaseUrl::parse(&postgres.url(), "test").unwrap();
    for (from, to) in [(0, 10), (10, 6_000)] {
        db.batch_execute(&format!(
            r#"INSERT INTO "LiteLLM_VerificationToken" (token, key_alias, models)
               SELECT encode(sha256(('sk-seeded-' || i)::bytea), 'hex'), 'seeded-' || i, '{{}}'
               FROM generate_series({from}, {} - 1) AS i"#,
            to
        ))
        .await
        .unwrap();
        let report = gateway_example::keys::litellm::import(&url, &url)
            .await
            .unwrap();
        assert_eq!(report.new_keys, to - from);
        for g in &gw {
            within(PROPAGATION, "the imported keys are served", || async {
                g.get("/key/list?size=1", Some(MASTER)).await.json()["total_count"] == to
            })
            .await;
            let last = format!("sk-seeded-{}", to - 1);
            assert_eq!(g.chat(&last, M, false).await.status, 200);
        }
    }
}

/// Many changes to one key notified together (each its own transaction, read back as one batch
/// that names the key many times): the key stays known on every gateway, with its last state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_changed_many_times_at_once_stays_known_everywhere() {
    let Some(postgres) = PostgresServer::start("a_key_changed_many_times_at_once") else {
        return;
    };
    let (gw, _dirs) = gateways(&config(&postgres, None), 2).await;
    let key = gw[0].new_key(json!({"key_alias": "busy"})).await;
    answers_within_a_second(&gw[1], &key, 200, "B serves the key").await;
    let db = sql(&postgres).await;
    let token = hash_key(&key);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&token];
    for round in 0..5 {
        // 50 transactions at once on one connection: their notifications arrive together.
        let updates = (0..50).map(|_| {
            db.execute(
                "UPDATE tpl_keys SET record = record WHERE token = $1",
                &params,
            )
        });
        for done in futures_util::future::join_all(updates).await {
            assert_eq!(done.unwrap(), 1);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for g in &gw {
            let r = g.chat(&key, M, false).await;
            assert_eq!(r.status, 200, "round {round}: {}", r.text());
        }
    }
}

/// On Postgres: 20 keys given one alias at once on two gateways, one gets it (a unique index);
/// a team deleted on A takes its keys on B within a second (a 404 for one that does not exist,
/// deleting nothing); a key's `allowed_routes` made on A hold on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_team_deletes_and_routes_hold_across_gateways() {
    let Some(postgres) = PostgresServer::start("aliases_team_deletes_and_routes") else {
        return;
    };
    let (gw, _dirs) = gateways(&config(&postgres, None), 2).await;
    let (a, b) = (&gw[0], &gw[1]);

    let calls = (0..20).map(|i| {
        let side = if i % 2 == 0 { a } else { b };
        side.post("/key/generate", Some(MASTER), json!({"key_alias": "race"}))
    });
    let replies = futures_util::future::join_all(calls).await;
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 1);
    for r in replies.iter().filter(|r| r.status != 200) {
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(
            r.error_message(),
            "Key with alias 'race' already exists. Unique key aliases across all keys are \
             required."
        );
    }
    let other = b.new_key(json!({})).await;
    let r = b
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": other, "key_alias": "race"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error_message().matches("'race'").count(), 1, "named");

    let team = a.new_team(json!({"team_alias": "doomed"})).await;
    let keys = [
        a.new_key(json!({"team_id": team, "key_alias": "t1"})).await,
        b.new_key(json!({"team_id": team})).await,
    ];
    for key in &keys {
        answers_within_a_second(b, key, 200, "B serves the team's keys").await;
    }
    let r = b
        .post(
            "/team/delete",
            Some(MASTER),
            json!({"team_ids": [team, "no-such-team"]}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(a.chat(&keys[0], M, false).await.status, 200);
    let r = a
        .post("/team/delete", Some(MASTER), json!({"team_ids": [team]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"deleted_teams": [team]}));
    for key in &keys {
        assert_eq!(a.chat(key, M, false).await.status, 401);
        answers_within_a_second(b, key, 401, "B stops serving the team's keys").await;
    }
    let r = b
        .post("/key/generate", Some(MASTER), json!({"team_id": team}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    b.new_key(json!({"key_alias": "t1"})).await;

    let routed = a
        .new_key(json!({"allowed_routes": ["/v1/embeddings"]}))
        .await;
    // B knows the key once it refuses chat for its routes: a 401, as for a key it does not know
    // yet, so the message tells them apart.
    replies_within_a_second(b, &routed, "B holds the key to its routes", |r| {
        r.status == 401 && r.error_message().contains("not allowed to call this route")
    })
    .await;
    let r = b
        .post(
            "/v1/embeddings",
            Some(&routed),
            json!({"model": M, "input": "hello"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Connections the server ended (`pg_terminate_backend`, as a restart or a pooler does) are
/// replaced before a write uses them: the write right after succeeds, every time.
#[tokio::test]
async fn a_write_after_the_server_ended_its_connections_succeeds() {
    let Some(postgres) = PostgresServer::start("a_write_after_the_server_ended") else {
        return;
    };
    let (gw, _dirs) = gateways(&config(&postgres, None), 1).await;
    let db = sql(&postgres).await;
    for round in 0..20 {
        db.batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND datname = current_database()",
        )
        .await
        .unwrap();
        let r = gw[0].post("/key/generate", Some(MASTER), json!({})).await;
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
    }
}

/// Key tables of a newer gateway: this one does not start, and says so plainly (not a corrupt
/// record), naming where the URL came from, once.
#[tokio::test]
async fn tables_of_a_newer_gateway_stop_the_start_and_say_why() {
    let Some(postgres) = PostgresServer::start("tables_of_a_newer_gateway") else {
        return;
    };
    let db = sql(&postgres).await;
    db.batch_execute(
        "CREATE TABLE tpl_migrations (version INTEGER PRIMARY KEY, \
         applied_at TIMESTAMPTZ NOT NULL DEFAULT now()); \
         INSERT INTO tpl_migrations (version) VALUES (99)",
    )
    .await
    .unwrap();
    let config = GatewayConfig::from_yaml_str(&config(&postgres, None)).unwrap();
    let e = Gateway::connect(config, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("schema version 99, newer than this gateway's"),
        "{e}"
    );
    assert!(!e.contains("corrupt"), "{e}");
    assert_eq!(e.matches("key store unavailable").count(), 1, "{e}");
    assert!(e.contains("(general_settings.database_url)"), "{e}");
}

/// Keys that shared an alias before aliases were unique (schema version 1) keep working after
/// the migration: the first holds the alias, the other can still be changed, and a new key with
/// it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_shared_an_alias_before_the_migration_keep_working() {
    let Some(postgres) = PostgresServer::start("keys_that_shared_an_alias") else {
        return;
    };
    let db = sql(&postgres).await;
    db.batch_execute(
        "CREATE TABLE tpl_migrations (version INTEGER PRIMARY KEY, \
         applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .await
    .unwrap();
    db.batch_execute(gateway_example::keys::postgres::MIGRATIONS[0])
        .await
        .unwrap();
    db.execute("INSERT INTO tpl_migrations (version) VALUES (1)", &[])
        .await
        .unwrap();
    let keys = [
        "sk-shared-alias-one-0123456789",
        "sk-shared-alias-two-0123456789",
    ];
    for key in keys {
        let record = json!({"token": hash_key(key), "key_alias": "old", "metadata": {},
            "team_id": null, "models": [], "created_at": 1});
        db.execute(
            "INSERT INTO tpl_keys (token, record) VALUES ($1, $2)",
            &[&hash_key(key), &record.to_string()],
        )
        .await
        .unwrap();
    }
    let (gw, _dirs) = gateways(&config(&postgres, None), 1).await;
    let gw = &gw[0];
    for key in keys {
        assert_eq!(gw.chat(key, M, false).await.status, 200);
        let r = gw
            .post("/key/block", Some(MASTER), json!({"key": key}))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"key_alias": "old"}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let held: i64 = db
        .query_one("SELECT count(*) FROM tpl_keys WHERE key_alias = 'old'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 1);
}

/// [`config`] with the quick-start model priced, so keys spend.
fn priced(postgres: &PostgresServer, redis: Option<&RedisServer>) -> String {
    config(postgres, redis).replace(
        "mock_response: \"hello-world\", tpm: 600000}",
        "mock_response: \"hello-world\", tpm: 600000}\n    model_info: \
         {input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}",
    )
}

async fn key_spend(gw: &Gw, key: &str) -> f64 {
    let r = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["info"]["spend"].as_f64().unwrap()
}

/// What `tpl_spend` holds for `key`'s budget of all models, in dollars (0 without a row).
async fn copied_spend(db: &tokio_postgres::Client, key: &str) -> f64 {
    let rows = db
        .query(
            // Under the key's counter id, which its record holds.
            "SELECT spent FROM tpl_spend WHERE kind = 'key' AND model = '' AND id = \
             (SELECT COALESCE(record::json->>'counter_id', token) FROM tpl_keys WHERE token = $1)",
            &[&hash_key(key)],
        )
        .await
        .unwrap();
    rows.first()
        .map_or(0.0, |r| r.get::<_, i64>(0) as f64 / 1e9)
}

/// `n` chats at once as `key`, spread over `fleet`; how many were served.
async fn served_at_once(fleet: &[Arc<Gw>], key: &str, n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (gw, key) = (fleet[i % fleet.len()].clone(), key.to_owned());
            tokio::spawn(async move { gw.chat(&key, M, false).await.status })
        })
        .collect();
    let mut served = 0;
    for t in tasks {
        match t.await.unwrap().as_u16() {
            200 => served += 1,
            400 | 429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    served
}

async fn flush_all(fleet: &[Arc<Gw>]) {
    for gw in fleet {
        gw.gateway.flush().await;
    }
}

fn same_dollars(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Three gateways on one Redis and one Postgres, keys spending at once on all of them: their
/// spend reaches `tpl_spend`, and a `FLUSHALL` loses none of it. Every gateway restores at
/// once and the spend comes back once (not three times); a key past its budget stays refused,
/// and one within it goes on from what it had spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_in_postgres_outlives_flushall_on_a_fleet_of_three() {
    let Some(postgres) = PostgresServer::start("spend_in_postgres_outlives_flushall") else {
        return;
    };
    let Some(redis) = RedisServer::start("spend_in_postgres_outlives_flushall") else {
        return;
    };
    let (fleet, _dirs) = gateways(&priced(&postgres, Some(&redis)), 3).await;
    let db = sql(&postgres).await;
    // One answer's cost, as the gateway prices it (spend is counted where a budget is set).
    let probe = fleet[0].new_key(json!({"max_budget": 1000.0})).await;
    assert_eq!(fleet[0].chat(&probe, M, false).await.status, 200);
    flush_all(&fleet).await;
    let cost = key_spend(&fleet[0], &probe).await;
    assert!(cost > 0.0, "the model is priced");

    // A budget of 9.5 answers, and one that is far away.
    let capped = fleet[0].new_key(json!({"max_budget": cost * 9.5})).await;
    let open = fleet[1].new_key(json!({"max_budget": 1000.0})).await;
    for gw in &fleet {
        answers_within_a_second(gw, &open, 200, "every gateway serves the key").await;
        within(
            PROPAGATION,
            "every gateway knows the capped key",
            || async { gw.gateway.keys().resolve(&capped).await.unwrap().is_some() },
        )
        .await;
    }
    let mut served_capped = 0;
    while key_spend(&fleet[0], &capped).await < cost * 9.5 {
        served_capped += served_at_once(&fleet, &capped, 12).await;
        flush_all(&fleet).await;
    }
    let served_open = 3 + served_at_once(&fleet, &open, 30).await;
    assert_eq!(served_open, 33, "the open key is not limited");
    flush_all(&fleet).await;
    let capped_before = key_spend(&fleet[0], &capped).await;
    let open_before = key_spend(&fleet[2], &open).await;
    assert!(same_dollars(capped_before, served_capped as f64 * cost));
    assert!(same_dollars(open_before, served_open as f64 * cost));
    // The copy holds the fleet's spend once the writers have run (flush wrote it).
    assert!(same_dollars(
        copied_spend(&db, &capped).await,
        capped_before
    ));
    assert!(same_dollars(copied_spend(&db, &open).await, open_before));

    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    let took = within(
        Duration::from_secs(5),
        "every gateway reads the spend again",
        || async {
            let mut all = true;
            for gw in &fleet {
                all &= same_dollars(key_spend(gw, &capped).await, capped_before)
                    && same_dollars(key_spend(gw, &open).await, open_before);
            }
            all
        },
    )
    .await;
    println!("spend back in Redis {took:?} after FLUSHALL (checked every second)");
    // Restored once, though all three gateways restore: still exactly what it was.
    assert!(same_dollars(key_spend(&fleet[1], &open).await, open_before));
    for gw in &fleet {
        let r = gw.chat(&capped, M, false).await;
        assert_eq!(r.status, 400, "{}", r.text());
    }
    let more = served_at_once(&fleet, &open, 9).await;
    assert_eq!(more, 9);
    flush_all(&fleet).await;
    let open_after = open_before + 9.0 * cost;
    for gw in &fleet {
        assert!(same_dollars(key_spend(gw, &open).await, open_after));
    }
    assert!(same_dollars(copied_spend(&db, &open).await, open_after));
    // A second FLUSHALL starts another epoch, restored as well.
    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    within(
        Duration::from_secs(5),
        "restored after a second FLUSHALL",
        || async { same_dollars(key_spend(&fleet[0], &open).await, open_after) },
    )
    .await;
}

/// Spend settled after Redis came back empty and before the restore is in Redis once restored,
/// and in `tpl_spend` too: a second `FLUSHALL` with nothing settled in between gives it back
/// whole. Before, the copy never heard of it (its rows change only with a newer value, and the
/// hash then held less than the copy), and a second emptying lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_settled_before_a_restore_outlives_the_next_flushall() {
    let Some(postgres) = PostgresServer::start("spend_settled_before_a_restore") else {
        return;
    };
    let Some(redis) = RedisServer::start("spend_settled_before_a_restore") else {
        return;
    };
    let db = sql(&postgres).await;
    let (gw, _dirs) = gateways(&priced(&postgres, Some(&redis)), 1).await;
    let key = gw[0].new_key(json!({"max_budget": 1000.0})).await;
    assert_eq!(served_at_once(&gw, &key, 5).await, 5);
    flush_all(&gw).await;
    let before = key_spend(&gw[0], &key).await;
    let cost = before / 5.0;
    assert!(same_dollars(copied_spend(&db, &key).await, before));

    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    // At once, before the gateway's next epoch check (every second) restores the spend.
    assert_eq!(served_at_once(&gw, &key, 3).await, 3);
    let total = before + 3.0 * cost;
    // Checked every second; a margin for a machine running the whole suite at once (two
    // fresh-clone runs beside black-box trials took longer than 5 s).
    within(Duration::from_secs(15), "the spend restored", || async {
        same_dollars(key_spend(&gw[0], &key).await, total)
    })
    .await;
    flush_all(&gw).await;
    assert!(
        same_dollars(copied_spend(&db, &key).await, total),
        "the copy has the spend settled before the restore: {} of {total}",
        copied_spend(&db, &key).await
    );

    // Nothing settled since: a second emptying gives it all back.
    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    within(Duration::from_secs(15), "restored again, whole", || async {
        same_dollars(key_spend(&gw[0], &key).await, total)
    })
    .await;
}

/// Embedded counters and keys in Postgres: spend is read back by a gateway started later (a
/// restart), and spend settled while Postgres is down is kept and written once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_in_postgres_outlives_a_restart_and_a_postgres_outage() {
    let Some(mut postgres) = PostgresServer::start("spend_in_postgres_outlives_a_restart") else {
        return;
    };
    let yaml = priced(&postgres, None);
    let db = sql(&postgres).await;
    let (first, _dirs) = gateways(&yaml, 1).await;
    let key = first[0].new_key(json!({"max_budget": 1000.0})).await;
    assert_eq!(served_at_once(&first, &key, 6).await, 6);
    flush_all(&first).await;
    let spent = key_spend(&first[0], &key).await;
    let cost = spent / 6.0;
    assert!(cost > 0.0);
    assert!(same_dollars(copied_spend(&db, &key).await, spent));
    drop(first);

    // A restart: a gateway on a fresh data directory starts from Postgres's spend.
    let (second, _dirs) = gateways(&yaml, 1).await;
    assert!(same_dollars(key_spend(&second[0], &key).await, spent));

    postgres.kill();
    assert_eq!(
        served_at_once(&second, &key, 4).await,
        4,
        "known keys are served"
    );
    second[0].gateway.flush().await;
    let during = key_spend(&second[0], &key).await;
    assert!(
        same_dollars(during, spent + 4.0 * cost),
        "enforced from memory"
    );
    postgres.restart();
    let took = within(
        Duration::from_secs(10),
        "the kept spend is written",
        || async {
            match tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    same_dollars(copied_spend(&client, &key).await, during)
                }
                Err(_) => false,
            }
        },
    )
    .await;
    println!("spend kept during the outage written {took:?} after Postgres was back");
    drop(second);
    let (third, _dirs) = gateways(&yaml, 1).await;
    assert!(same_dollars(key_spend(&third[0], &key).await, during));
}

/// Embedded counters and keys in Postgres: a key's day of tokens (`tpd_limit`) is copied to
/// `tpl_day_tokens` with spend and read back by a gateway started later, so a restart is not a
/// new day. Before the copy, the restarted gateway served the key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_day_of_tokens_in_postgres_outlives_a_restart() {
    let Some(postgres) = PostgresServer::start("a_keys_day_of_tokens_in_postgres") else {
        return;
    };
    let yaml = config(&postgres, None);
    let (first, _dirs) = gateways(&yaml, 1).await;
    let key = first[0].new_key(json!({"tpd_limit": 1})).await;
    assert_eq!(first[0].chat(&key, M, false).await.status, 200);
    let refused = first[0].chat(&key, M, false).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.headers["x-priority-limit-refused-by"],
        "key_daily_tokens"
    );
    flush_all(&first).await;
    drop(first);

    let (second, _dirs) = gateways(&yaml, 1).await;
    let refused = second[0].chat(&key, M, false).await;
    assert_eq!(refused.status, 429, "a restart is not a new day");
    assert_eq!(
        refused.headers["x-priority-limit-refused-by"],
        "key_daily_tokens"
    );
    // Another key's day is its own.
    let other = second[0].new_key(json!({"tpd_limit": 1})).await;
    assert_eq!(second[0].chat(&other, M, false).await.status, 200);
}

/// A day of tokens copied over many writes (one every 200 ms) follows every answer: the row in
/// `tpl_day_tokens` holds all of the day's tokens, and a restarted gateway refuses what they
/// used up. Before, a write was skipped whenever the day's end, worked out again at each write
/// from two clocks, came out a millisecond earlier than the row's (the row kept 30 of 90 tokens,
/// and a restart served the key a new day's worth; a black-box trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_day_of_tokens_in_postgres_follows_every_answer() {
    let Some(postgres) = PostgresServer::start("a_keys_day_of_tokens_follows_every_answer") else {
        return;
    };
    let yaml = config(&postgres, None);
    let (first, _dirs) = gateways(&yaml, 1).await;
    let key = first[0].new_key(json!({"tpd_limit": 1_000_000})).await;
    let db = sql(&postgres).await;
    let mut used = 0;
    for _ in 0..6 {
        let answer = first[0].chat(&key, M, false).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        used += answer.json()["usage"]["total_tokens"].as_i64().unwrap();
        // Past the next write of the copy.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let row = db
            // The only key with a day of tokens.
            .query_one("SELECT tokens FROM tpl_day_tokens WHERE kind = 'key'", &[])
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, i64>(0),
            used,
            "the copy holds every answer's tokens"
        );
    }
    drop(first);
    // A restart with a limit the day has used up.
    let (second, _dirs) = gateways(&yaml, 1).await;
    let r = second[0]
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "tpd_limit": used}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let refused = second[0].chat(&key, M, false).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(
        refused.headers["x-priority-limit-refused-by"],
        "key_daily_tokens"
    );
}

/// TLS to Postgres as the URL's `sslmode` says, against a server that refuses plain connections:
/// `verify-full` with the server's CA serves keys (made and used over TLS); without the CA the
/// certificate is refused and the start says so; `require` and the default `prefer` encrypt
/// without verifying, as libpq does; `disable` is rejected by the server, and the start names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_postgres_follows_sslmode() {
    let Some(pki) = integration_tests::pki::Pki::make("tls_to_postgres_follows_sslmode") else {
        return;
    };
    let Some(postgres) = PostgresServer::start_tls(
        "tls_to_postgres_follows_sslmode",
        &pki.server_cert,
        &pki.server_key,
    ) else {
        return;
    };
    let ca = pki.ca.clone();
    let with = |query: &str| {
        config(&postgres, None).replace(&postgres.url(), &format!("{}?{query}", postgres.url()))
    };
    let start = |yaml: String| async move {
        let config = GatewayConfig::from_yaml_str(&yaml).unwrap();
        Gateway::connect(config, None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let verified = with(&format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    let (gw, _dirs) = gateways(&verified, 1).await;
    let key = gw[0].new_key(json!({})).await;
    assert_eq!(gw[0].chat(&key, M, false).await.status, 200);
    // The server saw only encrypted sessions from the gateway.
    let (db, connection) = tokio_postgres::connect(
        &format!(
            "host={} port={} user=postgres dbname=postgres",
            postgres.socket_dir().display(),
            postgres.port()
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("the test's own session, over the Unix socket");
    tokio::spawn(connection);
    let plain: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.client_addr IS NOT NULL AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let encrypted: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.client_addr IS NOT NULL AND s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0);
    assert!(encrypted >= 1, "the listener at least");

    let e = start(with("sslmode=verify-full")).await.unwrap_err();
    assert!(
        e.contains("the gateway does not start") && e.to_lowercase().contains("certificate"),
        "{e}"
    );
    for encrypt_only in ["sslmode=require", "", "sslmode=prefer"] {
        let yaml = if encrypt_only.is_empty() {
            config(&postgres, None)
        } else {
            with(encrypt_only)
        };
        start(yaml)
            .await
            .unwrap_or_else(|e| panic!("{encrypt_only:?}: {e}"));
    }
    let e = start(with("sslmode=disable")).await.unwrap_err();
    assert!(
        e.contains("pg_hba.conf") || e.contains("no encryption"),
        "{e}"
    );
    let e = start(with(&format!(
        "sslmode=verify-ca&sslrootcert={}.missing",
        ca.display()
    )))
    .await
    .unwrap_err();
    assert!(e.contains("sslrootcert") && e.contains(".missing"), "{e}");
}

/// Keys in Postgres, the limiter's counters in Redis: while Redis is away, `/key/info` still
/// answers for a key without a budget (it has no spend to read: `0`), and a key with one is the
/// documented 503 (its spend cannot be read), never a record with a made-up spend.
#[tokio::test]
async fn key_info_needs_redis_only_for_a_budgets_spend() {
    let Some(postgres) = PostgresServer::start("key_info_needs_redis_only") else {
        return;
    };
    let Some(mut redis) = RedisServer::start("key_info_needs_redis_only") else {
        return;
    };
    let (gw, _dirs) = gateways(&priced(&postgres, Some(&redis)), 1).await;
    let gw = &gw[0];
    let plain = gw.new_key(json!({"rpm_limit": 100})).await;
    let budgeted = gw.new_key(json!({"max_budget": 1.0})).await;
    assert_eq!(gw.chat(&budgeted, M, false).await.status, 200);
    redis.kill();
    let r = gw
        .get(&format!("/key/info?key={plain}"), Some(MASTER))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["info"]["spend"], 0.0);
    assert_eq!(r.json()["info"]["rpm_limit"], 100);
    let r = gw
        .get(&format!("/key/info?key={budgeted}"), Some(MASTER))
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.error_message().starts_with("spend could not be read"),
        "{}",
        r.text()
    );
}

/// A gateway whose connections to Postgres were cut off without a word (a failover, a firewall
/// that forgot them: no FIN, no RST; new connections pass) finds its listening connection dead
/// and makes it again, reading everything: a key blocked, one deleted and one regenerated on
/// another gateway meanwhile are refused there within seconds. Before, it waited on the dead
/// connection for TCP's keepalive (two hours), serving them all, and said it was healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_cut_off_from_postgres_without_a_word_follows_again() {
    let Some(postgres) = PostgresServer::start("a_gateway_cut_off_from_postgres") else {
        return;
    };
    let relay = Relay::start(postgres.port()).await;
    let yaml = config(&postgres, None);
    let through_relay = yaml.replace(
        &format!("127.0.0.1:{}", postgres.port()),
        &format!("127.0.0.1:{}", relay.port()),
    );
    assert_ne!(yaml, through_relay);
    let (direct, _dirs) = gateways(&yaml, 1).await;
    let (cut, _cut_dirs) = gateways(&through_relay, 1).await;
    let (a, b) = (&direct[0], &cut[0]);
    let (blocked, deleted, regenerated) = (
        a.new_key(json!({})).await,
        a.new_key(json!({})).await,
        a.new_key(json!({})).await,
    );
    for key in [&blocked, &deleted, &regenerated] {
        answers_within_a_second(b, key, 200, "B serves the keys").await;
    }

    relay.cut_silently();
    for (path, body) in [
        ("/key/block", json!({"key": blocked})),
        ("/key/delete", json!({"keys": [deleted]})),
        ("/key/regenerate", json!({"key": regenerated})),
    ] {
        let r = a.post(path, Some(MASTER), body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let took = within(
        Duration::from_secs(15),
        "B refuses the keys changed while it was cut off",
        || async {
            let mut all = true;
            for key in [&blocked, &deleted, &regenerated] {
                all &= b.chat(key, M, false).await.status == 401;
            }
            all
        },
    )
    .await;
    println!("B followed again {took:?} after the cut");
    within(Duration::from_secs(10), "B is healthy again", || async {
        readiness(b).await["status"] == "healthy"
    })
    .await;
    let after = a.new_key(json!({})).await;
    answers_within_a_second(b, &after, 200, "B follows changes again").await;

    // Cut off again while idle (the cut above landed in the middle of reading a notified row):
    // the listening connection's heartbeat finds it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.cut_silently();
    let r = a
        .post("/key/block", Some(MASTER), json!({"key": after}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let took = within(
        Duration::from_secs(15),
        "B refuses the key blocked while it was cut off, idle",
        || async { b.chat(&after, M, false).await.status == 401 },
    )
    .await;
    println!("B followed again {took:?} after the idle cut");
}

/// The counters lock is one per database: a gateway on another database of the same Postgres
/// server (a staging one beside production), with its own Redis prefix, starts beside a fleet,
/// and one counting alone on a third database starts beside both. Before, the check that a
/// fleet's gateways count in one Redis read every database's holders and refused it (a
/// black-box trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_on_other_databases_of_one_server_start_beside_a_fleet() {
    let Some(postgres) = PostgresServer::start("gateways_on_other_databases") else {
        return;
    };
    let Some(redis) = RedisServer::start("gateways_on_other_databases") else {
        return;
    };
    let db = sql(&postgres).await;
    for name in ["staging", "alone"] {
        db.batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
    }
    let (fleet, _dirs) = gateways(&config(&postgres, Some(&redis)), 2).await;
    let on = |database: &str, yaml: String| {
        yaml.replace(
            &format!("127.0.0.1:{}/postgres", postgres.port()),
            &format!("127.0.0.1:{}/{database}", postgres.port()),
        )
    };
    let staging = on(
        "staging",
        config(&postgres, Some(&redis))
            .replace("redis_url:", "redis_key_prefix: \"staging:\"\n  redis_url:"),
    );
    assert!(staging.contains("/staging\"") && staging.contains("staging:"));
    let (staged, _staged_dirs) = gateways(&staging, 1).await;
    let alone = on("alone", config(&postgres, None));
    let (lone, _lone_dirs) = gateways(&alone, 1).await;
    for gw in fleet.iter().chain(&staged).chain(&lone) {
        let key = gw.new_key(json!({})).await;
        assert_eq!(gw.chat(&key, M, false).await.status, 200);
    }
}
