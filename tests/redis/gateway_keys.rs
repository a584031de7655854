//! Keys and teams shared through Redis by several gateways: two gateway instances on
//! one real `redis-server` (separate data dirs), over real HTTP. A key or team made on one works
//! on the other at once; a delete reaches the other within the cache TTL; Redis down means 503
//! for keys nobody can check, never 401, while the master key keeps working; a Redis Cluster
//! serves the same.

use std::future::Future;
use std::time::{Duration, Instant};

use gateway_example::keys::{hash_key, KEY_CACHE_TTL};
use integration_tests::gateway::{with_master, Gw, Reply, TempDir, MASTER};
use integration_tests::redis::{RedisCluster, RedisServer};
use serde_json::{json, Value};

/// The quick-start mock model (30 tokens per answer), with room for every call a test makes.
const M: &str = "my-fake-model";

fn config(router_settings: &str) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: my-fake-model
    litellm_params: {{model: openai/my-fake-model, mock_response: "hello-world", tpm: 60000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.9, "dev": 0.1}}
router_settings:
{router_settings}
"#
    ))
}

fn single(redis: &RedisServer) -> String {
    config(&format!("  redis_url: \"{}\"", redis.url()))
}

/// Gateways A and B on the same config, each with its own data dir (which must stay unused).
struct Pair {
    a: Gw,
    b: Gw,
    _dirs: (TempDir, TempDir),
}

async fn pair(yaml: &str) -> Pair {
    let dirs = (TempDir::new(), TempDir::new());
    let a = Gw::start(yaml, Some(&dirs.0 .0)).await;
    let b = Gw::start(yaml, Some(&dirs.1 .0)).await;
    Pair { a, b, _dirs: dirs }
}

/// Calls `check` every 20 ms until it holds; returns how long that took, or panics after `limit`.
pub(super) async fn within<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `gw` answers `key`'s chats with `status`: a change made on another gateway, which
/// must reach this one within the key cache's TTL (and a margin for a loaded machine).
async fn answers_within_the_ttl(gw: &Gw, key: &str, status: u16, what: &str) {
    let took = within(KEY_CACHE_TTL * 3, what, || async {
        gw.chat(key, M, false).await.status == status
    })
    .await;
    assert!(
        took <= KEY_CACHE_TTL + Duration::from_millis(500),
        "{what}: {took:?}"
    );
}

/// The exact 503 of an unreachable key store, in the OpenAI error shape.
fn assert_store_unavailable(r: &Reply) {
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("key store unavailable: ")),
        "{v}"
    );
    assert_eq!(e["type"], "service_unavailable", "{v}");
    assert_eq!(e["param"], Value::Null, "{v}");
    assert_eq!(e["code"], "503", "{v}");
}

#[tokio::test]
async fn a_key_made_on_one_gateway_works_on_the_other_at_once() {
    let Some(redis) = RedisServer::start("a_key_made_on_one_gateway_works_on_the_other_at_once")
    else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let key = gw.a.new_key(json!({"key_alias": "shared"})).await;

    // No waiting: B has never seen the key and misses are not cached.
    let r = gw.b.chat(&key, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["total_tokens"], 30);
    let info =
        gw.b.get(&format!("/key/info?key={key}"), Some(MASTER))
            .await;
    assert_eq!(info.json()["info"]["key_alias"], "shared");
    assert_eq!(gw.b.chat("sk-not-a-key", M, false).await.status, 401);
    let ready = gw.b.get("/health/readiness", None).await;
    assert_eq!(ready.json()["key_store"], "redis");

    // Redis holds the hash, never the key; the data dirs hold nothing.
    let stored = redis.cli(&["HGETALL", "tpl:keys"]);
    assert!(stored.contains(&hash_key(&key)), "{stored}");
    assert!(
        !stored.contains(&key),
        "the raw key reached Redis: {stored}"
    );
    assert!(!stored.contains(&key["sk-".len()..]), "{stored}");
    for file in ["keys.json", "keys.db"] {
        assert!(!gw._dirs.0 .0.join(file).exists(), "{file}");
    }
}

#[tokio::test]
async fn team_priority_set_on_one_gateway_applies_on_the_other() {
    let Some(redis) = RedisServer::start("team_priority_set_on_one_gateway_applies_on_the_other")
    else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let team =
        gw.a.new_team(json!({"team_alias": "search", "metadata": {"priority": "prod"}}))
            .await;
    let in_team =
        gw.a.new_key(json!({"metadata": {"priority": "dev"}, "team_id": team}))
            .await;
    let alone = gw.a.new_key(json!({"metadata": {"priority": "dev"}})).await;

    let r = gw.b.chat(&in_team, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.headers["x-litellm-priority"], "prod",
        "the team's priority"
    );
    let r = gw.b.chat(&alone, M, false).await;
    assert_eq!(r.headers["x-litellm-priority"], "dev", "the key's own");
    let info =
        gw.b.get(&format!("/team/info?team_id={team}"), Some(MASTER))
            .await;
    assert_eq!(info.json()["team_info"]["team_alias"], "search");
    let r =
        gw.b.post(
            "/key/generate",
            Some(MASTER),
            json!({"team_id": "no-such-team"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());

    // The team's priority changes in Redis (as an admin tool would): B follows within the TTL.
    let changed = json!({"team_id": team, "team_alias": "search",
                         "metadata": {"priority": "dev"}, "created_at": 0});
    redis.cli(&["HSET", "tpl:teams", &team, &changed.to_string()]);
    let took = within(
        KEY_CACHE_TTL * 3,
        "B sees the new team priority",
        || async { gw.b.chat(&in_team, M, false).await.headers["x-litellm-priority"] == "dev" },
    )
    .await;
    assert!(
        took <= KEY_CACHE_TTL + Duration::from_millis(500),
        "{took:?}"
    );
}

/// A chosen key and an expiry made on A hold on B: the key works there, is taken there too, and
/// a key past its `expires` gets B's 401.
#[tokio::test]
async fn chosen_keys_and_expiry_hold_on_every_gateway() {
    let Some(redis) = RedisServer::start("chosen_keys_and_expiry_hold_on_every_gateway") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let chosen = "sk-fleet-chosen-0123456789";
    let r =
        gw.a.post("/key/generate", Some(MASTER), json!({"key": chosen}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.b.chat(chosen, M, false).await.status, 200);
    let r =
        gw.b.post("/key/generate", Some(MASTER), json!({"key": chosen}))
            .await;
    assert_eq!(
        r.status,
        400,
        "taken, on the other gateway too: {}",
        r.text()
    );
    let past =
        gw.a.new_key(json!({"expires": "2020-01-01T00:00:00Z"}))
            .await;
    let r = gw.b.chat(&past, M, false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        r.error_message().contains("Expired Key"),
        "{}",
        r.error_message()
    );
    let later = gw.a.new_key(json!({"duration": "1h"})).await;
    assert_eq!(gw.b.chat(&later, M, false).await.status, 200);
}

/// A key blocked or updated on A is refused, or changed, on B within the cache TTL.
#[tokio::test]
async fn a_key_blocked_or_updated_on_one_gateway_changes_on_the_other_within_a_second() {
    let Some(redis) = RedisServer::start("a_key_blocked_or_updated_on_one_gateway") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let key = gw.a.new_key(json!({})).await;
    assert_eq!(gw.b.chat(&key, M, false).await.status, 200, "cached on B");
    let r =
        gw.a.post("/key/block", Some(MASTER), json!({"key": key}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.a.chat(&key, M, false).await.status,
        401,
        "at once where it was blocked"
    );
    answers_within_the_ttl(&gw.b, &key, 401, "B refuses the blocked key").await;
    let r =
        gw.b.post("/key/unblock", Some(MASTER), json!({"key": key}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r =
        gw.b.post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "models": ["other"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    answers_within_the_ttl(&gw.a, &key, 403, "A holds the key to its new models").await;
}

/// Updates of one key racing from four gateways (each writes one at a time) all land: each
/// round of the compare-and-swap one writer wins and the others try again after a jittered
/// pause (five tries without one, a black-box trial got a 503 in half its rounds of nine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_of_one_key_from_the_fleet_all_land() {
    let Some(redis) = RedisServer::start("concurrent_updates_of_one_key") else {
        return;
    };
    let yaml = single(&redis);
    let dirs: Vec<TempDir> = (0..4).map(|_| TempDir::new()).collect();
    let mut fleet = Vec::new();
    for dir in &dirs {
        fleet.push(Gw::start(&yaml, Some(&dir.0)).await);
    }
    let key = fleet[0].new_key(json!({})).await;
    let updates = (0..32).map(|i| {
        let gw = &fleet[i % fleet.len()];
        let key = key.clone();
        async move {
            let body = json!({"key": key, "rpm_limit": 1000 + i});
            gw.post("/key/update", Some(MASTER), body).await
        }
    });
    let replies = futures_util::future::join_all(updates).await;
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let info = fleet[1]
        .get(&format!("/key/info?key={key}"), Some(MASTER))
        .await
        .json();
    let rpm = info["info"]["rpm_limit"].as_u64().unwrap();
    assert!((1000..1032).contains(&rpm), "{info}");
}

/// A team blocked on A refuses its keys on B within the cache TTL; unblocked on B, A serves them.
#[tokio::test]
async fn a_team_blocked_on_one_gateway_is_refused_on_the_other_within_a_second() {
    let Some(redis) = RedisServer::start("a_team_blocked_on_one_gateway") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let team = gw.a.new_team(json!({})).await;
    let key = gw.a.new_key(json!({"team_id": team})).await;
    assert_eq!(gw.b.chat(&key, M, false).await.status, 200, "cached on B");
    let r =
        gw.a.post("/team/block", Some(MASTER), json!({"team_id": team}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.a.chat(&key, M, false).await.status,
        401,
        "at once where it was blocked"
    );
    answers_within_the_ttl(&gw.b, &key, 401, "B refuses the blocked team's key").await;
    let r =
        gw.b.post("/team/unblock", Some(MASTER), json!({"team_id": team}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    answers_within_the_ttl(&gw.a, &key, 200, "A serves the key again").await;
}

/// A key regenerated on A: the new value works on B, the old one stops there within the TTL, and
/// its limit's window goes on where the old value left it (counted under the key's id, not its
/// value); B lists the keys A made.
#[tokio::test]
async fn a_key_regenerated_on_one_gateway_and_listed_on_the_other() {
    let Some(redis) = RedisServer::start("a_key_regenerated_on_one_gateway") else {
        return;
    };
    // Built as `main` builds them: the limiter's counters in Redis too.
    let yaml = single(&redis);
    let gw = Pair {
        a: Gw::connect(&yaml, None).await,
        b: Gw::connect(&yaml, None).await,
        _dirs: (TempDir::new(), TempDir::new()),
    };
    let old =
        gw.a.new_key(json!({"key_alias": "ci", "rpm_limit": 3}))
            .await;
    assert_eq!(gw.b.chat(&old, M, false).await.status, 200, "cached on B");
    assert_eq!(gw.a.chat(&old, M, false).await.status, 200);
    let r =
        gw.a.post("/key/regenerate", Some(MASTER), json!({"key": old}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let new = r.json()["key"].as_str().unwrap().to_owned();
    assert_eq!(gw.b.chat(&new, M, false).await.status, 200, "the third");
    let r = gw.a.chat(&new, M, false).await;
    assert_eq!(r.status, 429, "no fresh allowance: {}", r.text());
    assert_eq!(r.headers["x-priority-limit-refused-by"], "key_requests");
    assert_eq!(gw.a.chat(&old, M, false).await.status, 401);
    answers_within_the_ttl(&gw.b, &old, 401, "B refuses the old value").await;
    gw.a.new_key(json!({})).await;
    let v =
        gw.b.get("/key/list?size=10&return_full_object=true", Some(MASTER))
            .await
            .json();
    assert_eq!(v["total_count"], 2, "{v}");
    assert!(
        v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["key_alias"] == "ci"),
        "{v}"
    );
    // LiteLLM's filters, read from Redis by the other gateway: a team's keys, an alias's.
    let team = gw.a.new_team(json!({"team_id": "t"})).await;
    let in_team = gw.a.new_key(json!({"team_id": team})).await;
    let token =
        gw.a.get(&format!("/key/info?key={in_team}"), Some(MASTER))
            .await
            .json()["info"]["token"]
            .clone();
    let v = gw.b.get("/key/list?team_id=t", Some(MASTER)).await.json();
    assert_eq!(
        (v["total_count"].clone(), v["keys"].clone()),
        (json!(1), json!([token])),
        "{v}"
    );
    let v =
        gw.b.get("/key/list?key_alias=ci", Some(MASTER))
            .await
            .json();
    assert_eq!(v["total_count"], 1, "{v}");
    let v = gw.b.get("/team/info?team_id=t", Some(MASTER)).await.json();
    assert_eq!(v["keys"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["keys"][0]["token"], token, "{v}");

    // Moved on B to a team with one request a minute: A follows within the cache's TTL; a team
    // that does not exist is refused by name.
    let tight =
        gw.b.new_team(json!({"team_id": "tight", "rpm_limit": 1}))
            .await;
    let r =
        gw.b.post(
            "/key/update",
            Some(MASTER),
            json!({"key": in_team, "team_id": "gone"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error_message().contains("\"gone\""), "{}", r.text());
    let r =
        gw.b.post(
            "/key/update",
            Some(MASTER),
            json!({"key": in_team, "team_id": tight}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.b.chat(&in_team, M, false).await.status,
        200,
        "tight's one request"
    );
    answers_within_the_ttl(&gw.a, &in_team, 429, "A counts the key in its new team").await;
    let v =
        gw.a.get("/key/list?team_id=tight", Some(MASTER))
            .await
            .json();
    assert_eq!(v["total_count"], 1, "{v}");
}

/// A team's `models` made on A hold on B, through a fallback too: `cheap` (one request a minute,
/// shared in Redis) falls back to `dear`, which the team may not use.
#[tokio::test]
async fn a_teams_models_hold_through_fallbacks_on_every_gateway() {
    let Some(redis) = RedisServer::start("a_teams_models_hold_through_fallbacks") else {
        return;
    };
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: cheap
    litellm_params: {{model: openai/cheap, mock_response: "hello", rpm: 1}}
  - model_name: dear
    litellm_params: {{model: openai/dear, mock_response: "hello", rpm: 1000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
router_settings:
  redis_url: "{}"
  fallbacks: [{{"cheap": ["dear"]}}]
"#,
        redis.url()
    ));
    // As `main` builds them: the limiter's counters are in Redis too.
    let dirs = (TempDir::new(), TempDir::new());
    let gw = Pair {
        a: Gw::connect(&yaml, Some(&dirs.0 .0)).await,
        b: Gw::connect(&yaml, Some(&dirs.1 .0)).await,
        _dirs: dirs,
    };
    let team = gw.a.new_team(json!({"models": ["cheap"]})).await;
    let kept_off = gw.a.new_key(json!({"team_id": team})).await;
    let open = gw.a.new_key(json!({})).await;
    let r = gw.b.chat(&kept_off, "cheap", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for stream in [false, true] {
        for g in [&gw.a, &gw.b] {
            let r = g.chat(&kept_off, "cheap", stream).await;
            assert_eq!(r.status, 429, "not served by `dear`: {}", r.text());
            assert_eq!(r.headers["x-litellm-model-group"], "cheap");
            assert_eq!(g.chat(&kept_off, "dear", stream).await.status, 403);
            let r = g.chat(&open, "cheap", stream).await;
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.headers["x-litellm-model-group"], "dear");
        }
    }
}

#[tokio::test]
async fn a_deleted_key_is_refused_here_at_once_and_elsewhere_within_the_ttl() {
    let Some(redis) = RedisServer::start("a_deleted_key_is_refused_here_at_once") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let key = gw.a.new_key(json!({})).await;
    // Both gateways have it cached now.
    assert_eq!(gw.a.chat(&key, M, false).await.status, 200);
    assert_eq!(gw.b.chat(&key, M, false).await.status, 200);

    let r =
        gw.a.post("/key/delete", Some(MASTER), json!({"keys": [key]}))
            .await;
    assert_eq!(r.json()["deleted_keys"][0], key.as_str(), "{}", r.text());
    assert_eq!(gw.a.chat(&key, M, false).await.status, 401, "at once on A");
    let took = within(KEY_CACHE_TTL * 3, "B refuses the deleted key", || async {
        gw.b.chat(&key, M, false).await.status == 401
    })
    .await;
    assert!(
        took <= KEY_CACHE_TTL + Duration::from_millis(500),
        "{took:?}"
    );
    assert_eq!(redis.cli(&["HLEN", "tpl:keys"]).trim(), "0");
}

/// Readiness says whether the limiter's Redis answered its last call, and stays a 200 while the
/// gateway serves on its own counters.
#[tokio::test]
async fn readiness_says_when_the_limiters_redis_is_away() {
    let Some(mut redis) = RedisServer::start("readiness_says_when_the_limiters_redis") else {
        return;
    };
    let gw = Gw::connect(&single(&redis), None).await;
    assert_eq!(gw.chat(MASTER, M, false).await.status, 200);
    let ready = gw.get("/health/readiness", None).await.json();
    assert_eq!(ready["limiter_store"], "redis", "{ready}");
    assert_eq!(ready["limiter_store_reachable"], true, "{ready}");
    redis.kill();
    // Asked now, not at the last admission: no request has found Redis gone yet.
    let ready = gw.get("/health/readiness", None).await;
    assert_eq!(ready.status, 200);
    let v = ready.json();
    assert_eq!(
        (&v["status"], &v["limiter_store_reachable"]),
        (&json!("degraded"), &json!(false)),
        "{v}"
    );
    let r = gw.chat(MASTER, M, false).await;
    assert_eq!(r.status, 200, "served on its own counters: {}", r.text());
    // Back, and said so without a request to find it.
    redis.restart();
    within(
        Duration::from_secs(5),
        "readiness sees Redis back",
        || async { gw.get("/health/readiness", None).await.json()["status"] == "healthy" },
    )
    .await;
}

/// A stalled Redis costs key lookups one timeout per 250 ms, not one each: after a lookup fails,
/// the next ones answer from the cache (or 503) at once for a while. Counted as the lookups
/// Redis runs once it wakes (a stalled Redis still runs what it was sent): 20 requests of a key
/// whose cache entry had lapsed send far fewer than 20.
#[tokio::test]
async fn a_stalled_redis_costs_key_lookups_one_timeout_not_one_each() {
    let Some(redis) = RedisServer::start("a_stalled_redis_costs_key_lookups") else {
        return;
    };
    let gw = Gw::start(&single(&redis), None).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    // Past the cache's freshness: each request would ask Redis first.
    tokio::time::sleep(KEY_CACHE_TTL + Duration::from_millis(100)).await;
    redis.cli(&["config", "resetstat"]);
    redis.pause();
    for i in 0..20 {
        let r = gw.chat(&key, M, false).await;
        assert_eq!(r.status, 200, "request {i}, from the cache: {}", r.text());
    }
    redis.resume();
    let stats = redis.cli(&["info", "commandstats"]);
    let hget_calls = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_hget:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse::<u32>().unwrap());
    assert!(
        (1..=10).contains(&hget_calls),
        "{hget_calls} lookups sent: {stats}"
    );
}

/// After Redis restarts, no request is the one to find the broken connections: the gateway
/// checks them every second, so once Redis has been back that long the first admission
/// (`closed`: a failure would be a 503) and the first key written are answered by Redis.
#[tokio::test]
async fn after_a_redis_restart_no_request_finds_the_broken_connection() {
    let Some(mut redis) = RedisServer::start("after_a_redis_restart_no_request_finds") else {
        return;
    };
    let yaml = single(&redis).replace(
        "  priority_reservation: {\"prod\": 0.9, \"dev\": 0.1}\n",
        "  priority_reservation: {\"prod\": 0.9, \"dev\": 0.1}\n  \
         priority_reservation_settings: {redis_failure_mode: closed}\n",
    );
    assert!(yaml.contains("closed"), "{yaml}");
    let gw = Gw::connect(&yaml, None).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    for round in 0..2 {
        // Emptied too (no persistence): the first call to each store after it is a write.
        redis.kill();
        redis.restart();
        // Longer than the checks' period and a reconnect.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let r = gw.chat(MASTER, M, false).await;
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        let r = gw.post("/key/generate", Some(MASTER), json!({})).await;
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        let key = r.json()["key"].as_str().unwrap().to_owned();
        assert_eq!(gw.chat(&key, M, false).await.status, 200);
    }
}

#[tokio::test]
async fn redis_down_uncached_keys_get_503_the_master_key_still_works() {
    let Some(mut redis) = RedisServer::start("redis_down_uncached_keys_get_503") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let cached = gw.a.new_key(json!({})).await;
    assert_eq!(gw.b.chat(&cached, M, false).await.status, 200);
    let uncached = gw.a.new_key(json!({})).await;
    let ready = gw.b.get("/health/readiness", None).await.json();
    assert_eq!(
        (&ready["status"], &ready["key_store_reachable"]),
        (&json!("healthy"), &json!(true)),
        "{ready}"
    );

    redis.kill();
    // Still serving, so still ready (a 503 would take every gateway out at once), but said.
    let ready = gw.b.get("/health/readiness", None).await;
    assert_eq!(ready.status, 200);
    assert_eq!(
        (
            &ready.json()["status"],
            &ready.json()["key_store_reachable"]
        ),
        (&json!("degraded"), &json!(false)),
        "{}",
        ready.text()
    );
    // A key B cannot check is unknown, not invalid: 503, never 401.
    assert_store_unavailable(&gw.b.chat(&uncached, M, false).await);
    assert_store_unavailable(&gw.b.chat("sk-never-made", M, false).await);
    let r = gw.b.chat(MASTER, M, false).await;
    assert_eq!(
        r.status,
        200,
        "the master key is in the config: {}",
        r.text()
    );
    let r = gw.b.chat(&cached, M, false).await;
    assert_eq!(r.status, 200, "a key B looked up recently: {}", r.text());
    assert_store_unavailable(&gw.a.post("/key/generate", Some(MASTER), json!({})).await);
    assert_store_unavailable(
        &gw.a
            .post("/team/new", Some(MASTER), json!({"team_alias": "t"}))
            .await,
    );
    assert_eq!(
        gw.a.chat("", M, false).await.status,
        401,
        "no key is still 401"
    );

    // A restarted redis-server is empty (`--save ""`); the gateways reconnect on their own.
    redis.restart();
    within(
        Duration::from_secs(5),
        "key generation works again",
        || async {
            gw.a.post("/key/generate", Some(MASTER), json!({}))
                .await
                .status
                == 200
        },
    )
    .await;
    let fresh = gw.a.new_key(json!({})).await;
    let r = gw.b.chat(&fresh, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.b.chat(&uncached, M, false).await.status,
        401,
        "Redis answers again: the lost key is now simply unknown"
    );
}

#[tokio::test]
async fn a_hung_redis_costs_a_request_no_more_than_the_timeout() {
    let Some(redis) = RedisServer::start("a_hung_redis_costs_a_request_no_more_than_the_timeout")
    else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let key = gw.a.new_key(json!({})).await;
    redis.pause();
    let start = Instant::now();
    let r = gw.b.chat(&key, M, false).await;
    let took = start.elapsed();
    assert_store_unavailable(&r);
    assert!(
        r.error_message().contains("did not answer within 250 ms"),
        "{}",
        r.text()
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    redis.resume();
    within(Duration::from_secs(2), "B answers again", || async {
        gw.b.chat(&key, M, false).await.status == 200
    })
    .await;
}

/// The limiter's `redis_timeout_ms` bounds the key store's calls too: an operator who gives a
/// slow Redis 300 ms gives it to key lookups (a trial on a busy host saw a burst's key lookup
/// time out at the key store's own 50 ms, its `redis_timeout_ms` of 500 ignored: 24 × 503).
#[tokio::test]
async fn the_key_store_waits_as_long_as_redis_timeout_ms() {
    let Some(redis) = RedisServer::start("the_key_store_waits_as_long_as_redis_timeout_ms") else {
        return;
    };
    let yaml = single(&redis).replace(
        "  priority_reservation: {\"prod\": 0.9, \"dev\": 0.1}\n",
        "  priority_reservation: {\"prod\": 0.9, \"dev\": 0.1}\n  \
         priority_reservation_settings: {redis_timeout_ms: 300}\n",
    );
    assert!(yaml.contains("redis_timeout_ms: 300"), "{yaml}");
    let gw = pair(&yaml).await;
    let key = gw.a.new_key(json!({})).await;
    redis.pause();
    let r = gw.b.chat(&key, M, false).await;
    assert_store_unavailable(&r);
    assert!(
        r.error_message().contains("did not answer within 300 ms"),
        "{}",
        r.text()
    );
    redis.resume();
}

#[tokio::test]
async fn keys_and_teams_work_across_gateways_on_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("keys_and_teams_work_on_a_redis_cluster", 3) else {
        return;
    };
    let yaml = config(&format!(
        "{}\n  redis_key_prefix: \"gw-test:\"",
        cluster.startup_nodes_yaml()
    ));
    let gw = pair(&yaml).await;
    let team =
        gw.a.new_team(json!({"metadata": {"priority": "prod"}}))
            .await;
    let key = gw.a.new_key(json!({"team_id": team})).await;
    let r = gw.b.chat(&key, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-priority"], "prod");

    let r =
        gw.b.post("/key/delete", Some(MASTER), json!({"keys": [key]}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.b.chat(&key, M, false).await.status, 401);
    within(KEY_CACHE_TTL * 3, "A refuses the deleted key", || async {
        gw.a.chat(&key, M, false).await.status == 401
    })
    .await;
}

#[tokio::test]
async fn a_gateway_starts_and_serves_the_master_key_while_redis_is_down() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for router_settings in [
        format!("  redis_url: \"redis://127.0.0.1:{dead}/\""),
        format!("  redis_startup_nodes: [\"127.0.0.1:{dead}\"]"),
    ] {
        let yaml = config(&router_settings);
        let parsed = gateway_example::config::GatewayConfig::from_yaml_str(&yaml).unwrap();
        assert!(
            gateway_example::Gateway::connect(parsed, None)
                .await
                .is_ok(),
            "Redis down is not fatal at start"
        );
        let gw = Gw::start(&yaml, None).await;
        let r = gw.chat(MASTER, M, false).await;
        assert_eq!(r.status, 200, "{router_settings}: {}", r.text());
        assert_store_unavailable(&gw.chat("sk-some-key", M, false).await);
        assert_store_unavailable(&gw.post("/key/generate", Some(MASTER), json!({})).await);
        assert_store_unavailable(&gw.get("/team/info?team_id=t", Some(MASTER)).await);
    }
}

/// Two gateways racing to give one alias to 20 keys (10 each, all at once): exactly one gets it,
/// the 19 others LiteLLM's 400, because the check and the write are one Redis script. A rename
/// onto a taken alias is refused on the other gateway too; a deleted key's alias is free again,
/// and a regenerated key keeps its own. The alias fields do not count as keys.
#[tokio::test]
async fn a_key_alias_is_unique_across_gateways() {
    let Some(redis) = RedisServer::start("a_key_alias_is_unique_across_gateways") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let calls = (0..20).map(|i| {
        let side = if i % 2 == 0 { &gw.a } else { &gw.b };
        side.post("/key/generate", Some(MASTER), json!({"key_alias": "race"}))
    });
    let replies = futures_util::future::join_all(calls).await;
    let made: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
    assert_eq!(made.len(), 1, "one key has the alias");
    for r in replies.iter().filter(|r| r.status != 200) {
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(
            r.error_message(),
            "Key with alias 'race' already exists. Unique key aliases across all keys are \
             required."
        );
    }
    let winner = made[0].json()["key"].as_str().unwrap().to_owned();
    let other = gw.b.new_key(json!({})).await;
    let r =
        gw.b.post(
            "/key/update",
            Some(MASTER),
            json!({"key": other, "key_alias": "race"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let v = gw.b.get("/key/list?size=100", Some(MASTER)).await.json();
    assert_eq!(v["total_count"], 2, "the alias is not a key: {v}");
    // Regenerated on A: still held, by the new value.
    let r =
        gw.a.post("/key/regenerate", Some(MASTER), json!({"key": winner}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let winner = r.json()["key"].as_str().unwrap().to_owned();
    let r =
        gw.b.post("/key/generate", Some(MASTER), json!({"key_alias": "race"}))
            .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // Deleted on A: B may give it again.
    let r =
        gw.a.post("/key/delete", Some(MASTER), json!({"keys": [winner]}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r =
        gw.b.post(
            "/key/update",
            Some(MASTER),
            json!({"key": other, "key_alias": "race"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r =
        gw.a.post("/key/generate", Some(MASTER), json!({"key_alias": "race"}))
            .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

/// A team deleted on A takes its keys with it on B within the cache's TTL; B can make no key for
/// it; a team that does not exist is a 404 and deletes nothing. A key's `allowed_routes` made on
/// A hold on B.
#[tokio::test]
async fn a_team_deleted_on_one_gateway_takes_its_keys_on_the_other() {
    let Some(redis) = RedisServer::start("a_team_deleted_on_one_gateway") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let team = gw.a.new_team(json!({"team_alias": "doomed"})).await;
    let keys = [
        gw.a.new_key(json!({"team_id": team, "key_alias": "t1"}))
            .await,
        gw.b.new_key(json!({"team_id": team})).await,
    ];
    let kept =
        gw.b.new_key(json!({"allowed_routes": ["/v1/embeddings"]}))
            .await;
    for key in &keys {
        assert_eq!(gw.b.chat(key, M, false).await.status, 200, "cached on B");
    }
    let r =
        gw.b.post(
            "/team/delete",
            Some(MASTER),
            json!({"team_ids": [team, "no-such-team"]}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(gw.a.chat(&keys[0], M, false).await.status, 200);
    let r =
        gw.a.post("/team/delete", Some(MASTER), json!({"team_ids": [team]}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"deleted_teams": [team]}));
    for key in &keys {
        assert_eq!(gw.a.chat(key, M, false).await.status, 401);
        answers_within_the_ttl(&gw.b, key, 401, "B stops serving the team's keys").await;
    }
    let r =
        gw.b.post("/key/generate", Some(MASTER), json!({"team_id": team}))
            .await;
    assert_eq!(r.status, 400, "{}", r.text());
    gw.b.new_key(json!({"key_alias": "t1"})).await;

    // allowed_routes, made on B, hold on A.
    let r = gw.a.chat(&kept, M, false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        r.error_message().contains("not allowed to call this route"),
        "{}",
        r.error_message()
    );
    let r =
        gw.a.post(
            "/v1/embeddings",
            Some(&kept),
            json!({"model": M, "input": "hello"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A key moved to a team on one gateway while the team is deleted on the other, raced many
/// times: the answer always says what became of the key. A 200 (moved, then the team went):
/// the key went with its team; a 400 naming the team (refused): the key is there, as it was,
/// in no team; a 409: it was deleted with the team. Before, a 400 could leave the key deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_moved_to_a_team_being_deleted_is_answered_as_it_ends() {
    let Some(redis) = RedisServer::start("a_key_moved_to_a_team_being_deleted") else {
        return;
    };
    let gw = pair(&single(&redis)).await;
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..60 {
        let team = gw.a.new_team(json!({})).await;
        let key = gw.b.new_key(json!({})).await;
        let (moved, deleted) = tokio::join!(
            gw.b.post(
                "/key/update",
                Some(MASTER),
                json!({"key": key, "team_id": team})
            ),
            gw.a.post("/team/delete", Some(MASTER), json!({"team_ids": [team]})),
        );
        assert_eq!(deleted.status, 200, "{}", deleted.text());
        let info =
            gw.b.get(&format!("/key/info?key={key}"), Some(MASTER))
                .await;
        match moved.status.as_u16() {
            200 | 409 => assert_eq!(info.status, 404, "round {round}: {}", moved.text()),
            400 => {
                assert!(moved.text().contains("does not exist"), "{}", moved.text());
                assert_eq!(
                    info.status,
                    200,
                    "round {round}: refused, yet {}",
                    info.text()
                );
                assert_eq!(
                    info.json()["info"]["team_id"],
                    Value::Null,
                    "{}",
                    info.text()
                );
            }
            other => panic!("round {round}: {other} {}", moved.text()),
        }
        *seen.entry(moved.status.as_u16()).or_insert(0) += 1;
    }
    println!("answers to the move: {seen:?}");
}

/// Keys' limits and refusals through the official `openai` SDK with keys and counters on Redis
/// ([`integration_tests::sdk`]; expiry is on the clock, which a gateway on Redis does not take:
/// it is checked on the embedded store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_limits_on_redis_reach_the_openai_sdk_as_its_errors() {
    use integration_tests::sdk::{config, have_sdk, keys_through_the_openai_sdk};
    if !have_sdk("key_limits_on_redis_reach_the_openai_sdk_as_its_errors") {
        return;
    }
    let Some(redis) = RedisServer::start("key_limits_on_redis_reach_the_openai_sdk_as_its_errors")
    else {
        return;
    };
    let dir = TempDir::new();
    let gw = Gw::connect(&config(Some(&redis.url())), Some(&dir.0)).await;
    assert_eq!(
        gw.get("/health/readiness", None).await.json()["key_store"],
        "redis"
    );
    keys_through_the_openai_sdk(&gw, false).await;
}

/// Keys and teams on Redis made under one config and read by a gateway on another: the limits
/// that config cannot apply are named (the team read back from Redis's hash too), the rest not.
#[tokio::test]
async fn limits_another_config_cannot_apply_are_named_from_redis() {
    let Some(redis) = RedisServer::start("limits_another_config_cannot_apply_are_named_from_redis")
    else {
        return;
    };
    let a = Gw::start(&single(&redis), None).await;
    let team = a
        .new_team(json!({"team_id": "t", "model_rpm_limit": {M: 2}}))
        .await;
    a.new_key(json!({"key_alias": "stale", "team_id": team, "model_tpm_limit": {M: 90}}))
        .await;
    a.new_key(json!({"key_alias": "fine", "rpm_limit": 3}))
        .await;
    assert_eq!(
        a.gateway.unapplied_settings().await.unwrap(),
        Vec::<String>::new()
    );

    // Another gateway whose only model has another name.
    let renamed = single(&redis).replace("model_name: my-fake-model", "model_name: other");
    let b = Gw::start(&renamed, None).await;
    let mut named = b.gateway.unapplied_settings().await.unwrap();
    named.sort();
    assert_eq!(named.len(), 2, "{named:#?}");
    assert!(named[0].starts_with("key ") && named[0].contains(r#"(alias "stale"): model_tpm_limit names "my-fake-model", which is not a model_name"#), "{named:#?}");
    assert_eq!(
        named[1],
        r#"team "t": model_rpm_limit names "my-fake-model", which is not a model_name of the config: it limits nothing"#
    );
}
