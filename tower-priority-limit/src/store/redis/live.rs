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
    /// Each id's label beside it (`PREFIX{c}:gateway-labels`).
    labels: String,
    /// This process's label ([`set_label`](Self::set_label)), said with its ids.
    label: Mutex<String>,
    /// The labels of the gateways alive as last said (sorted), to warn once when they differ.
    seen: Mutex<Vec<String>>,
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

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Liveness {
    /// The liveness of the stores under `key_prefix` on `connection`, none registered yet.
    pub(super) fn new(key_prefix: &str, connection: RedisConnection) -> Arc<Self> {
        Arc::new(Self {
            registry: registry_key(key_prefix),
            labels: format!("{key_prefix}{{c}}:gateway-labels"),
            label: Mutex::new(String::new()),
            seen: Mutex::new(Vec::new()),
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

    /// Sets the label this process's stores are said with from now on: its config, as the
    /// application names it (a fingerprint), so a fleet can tell that its gateways disagree.
    pub(super) fn set_label(&self, label: &str) {
        *self.label.lock().unwrap_or_else(|e| e.into_inner()) = label.to_owned();
    }

    /// Says every store of this process is alive, once; a failure is left to the next time
    /// (Redis down: admissions are on the local fallback meanwhile). Logs a warning when the
    /// labels of the gateways alive start to differ, and when they agree again.
    async fn say(&self) {
        match self.say_now(LIVE_TIMEOUT).await {
            Ok(labels) => {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                if *seen != labels {
                    if labels.len() > 1 {
                        tracing::warn!(
                            configs = %labels.join(", "),
                            "the gateways on this rate-limit Redis run {} different configs: \
                             each admits by its own limits on the shared counters, so none of \
                             them is exact until they agree",
                            labels.len()
                        );
                    } else if seen.len() > 1 {
                        tracing::info!(
                            "the gateways on this rate-limit Redis run one config again"
                        );
                    }
                    *seen = labels;
                }
            }
            Err(e) => tracing::debug!(%e, "rate-limit Redis: this gateway's liveness not renewed"),
        }
    }

    /// Says every store of this process is alive, within `timeout`; returns the labels of the
    /// gateways alive (sorted, each once; this one's included once it has one).
    pub(super) async fn say_now(
        &self,
        timeout: Duration,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        let ids: Vec<String> = self
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|id| format!("{id:016x}"))
            .collect();
        let label = self.label.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut connection = self.connection.clone();
        let lapse = u64::try_from(LIVE_LAPSE.as_millis()).unwrap_or(u64::MAX);
        let keys = [self.registry.as_str(), self.labels.as_str()];
        let said = self
            .script
            .call::<Vec<String>>(&mut connection, &keys, |cmd| {
                cmd.arg(lapse).arg(&label).arg(&ids);
            });
        let mut labels = bounded(timeout, said).await?;
        labels.sort_unstable();
        Ok(labels)
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
