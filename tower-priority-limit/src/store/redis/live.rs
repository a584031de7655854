//! Which gateways are alive, as the others see them: each process's stores say so in Redis
//! every [`LIVE_EVERY`] (`live.lua`), and an entry not said again lapses after [`LIVE_LAPSE`].
//! A caller's parallel slot (and the budget reservation it records) is named after the store
//! that took it, so when a caller's slots or reservations would refuse a request, `admit.lua`
//! frees those of gateways no longer alive: a gateway killed with requests in flight holds a
//! key's `max_parallel_requests` for [`LIVE_LAPSE`], not for the slots' own lapse
//! ([`PARALLEL_SLOT_MS`](super::PARALLEL_SLOT_MS)).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::connection::{bounded, RedisConnection};
use super::script::LuaScript;

/// How often a gateway says it is alive.
pub const LIVE_EVERY: Duration = Duration::from_secs(5);

/// How long a gateway counts as alive after it last said so: three of [`LIVE_EVERY`], so one
/// or two missed (a slow Redis) do not free a live gateway's slots.
pub const LIVE_LAPSE: Duration = Duration::from_secs(15);

/// How long one saying may take before it is given up (the next one comes anyway).
const LIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The ids of one process's stores on one Redis (a store and the stores made from it share
/// one), and how they say they are alive.
pub(super) struct Liveness {
    /// The registry of gateways alive (`PREFIX{c}:gateways`: in the callers' slot on a cluster,
    /// where `admit.lua` reads it).
    registry: String,
    connection: RedisConnection,
    script: LuaScript,
    /// Each store's id (its slots' names start with it). Changed only when a store is made.
    ids: Mutex<Vec<u64>>,
    /// Whether an id is alive in the registry (`ALIVE_LUA`).
    alive: LuaScript,
}

/// Whether `ARGV[1]` is in the registry `KEYS[1]` and not lapsed, on Redis's clock: 1 or 0.
const ALIVE_LUA: &str = "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapses = redis.call('ZSCORE', KEYS[1], ARGV[1])
if lapses and tonumber(lapses) > now then return 1 end
return 0";

impl Liveness {
    /// The liveness of the stores under `key_prefix` on `connection`, none registered yet.
    pub(super) fn new(key_prefix: &str, connection: RedisConnection) -> Arc<Self> {
        Arc::new(Self {
            registry: registry_key(key_prefix),
            connection,
            script: LuaScript::new(include_str!("live.lua")),
            ids: Mutex::new(Vec::new()),
            alive: LuaScript::new(ALIVE_LUA),
        })
    }

    /// Whether the store `id` (16 hex digits) said it is alive here within [`LIVE_LAPSE`].
    pub(super) async fn is_alive(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<bool, crate::store::StoreError> {
        let mut connection = self.connection.clone();
        let keys = [self.registry.as_str()];
        let alive = self.alive.call::<i64>(&mut connection, &keys, |cmd| {
            cmd.arg(id);
        });
        Ok(bounded(timeout, alive).await? == 1)
    }

    /// The registry's key, which `admit.lua` is given with a request's callers.
    pub(super) fn registry(&self) -> &str {
        &self.registry
    }

    /// Adds the store `id`, and says so at once (in the background) so that its first slots
    /// are never taken for a dead gateway's.
    pub(super) fn add(self: &Arc<Self>, id: u64) {
        self.ids.lock().unwrap_or_else(|e| e.into_inner()).push(id);
        let live = Arc::clone(self);
        tokio::spawn(async move { live.say().await });
    }

    /// Says every store of this process is alive, once; a failure is left to the next time
    /// (Redis down: admissions are on the local fallback meanwhile).
    async fn say(&self) {
        let ids: Vec<String> = self
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|id| format!("{id:016x}"))
            .collect();
        if ids.is_empty() {
            return;
        }
        let mut connection = self.connection.clone();
        let lapse = u64::try_from(LIVE_LAPSE.as_millis()).unwrap_or(u64::MAX);
        let keys = [self.registry.as_str()];
        let said = self.script.call::<i64>(&mut connection, &keys, |cmd| {
            cmd.arg(lapse).arg(&ids);
        });
        if let Err(e) = bounded(LIVE_TIMEOUT, said).await {
            tracing::debug!(%e, "rate-limit Redis: this gateway's liveness not renewed");
        }
    }
}

/// Says `live`'s stores are alive every [`LIVE_EVERY`] while any of them is in use (the first
/// time is [`Liveness::add`]'s).
pub(super) async fn keep_saying(live: Weak<Liveness>) {
    let mut every = tokio::time::interval(LIVE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // An interval's first tick is at once: `add` has just said it.
    every.tick().await;
    loop {
        every.tick().await;
        let Some(live) = live.upgrade() else {
            return;
        };
        live.say().await;
    }
}

/// The registry of gateways alive for stores under `key_prefix`.
pub(super) fn registry_key(key_prefix: &str) -> String {
    format!("{key_prefix}{{c}}:gateways")
}
