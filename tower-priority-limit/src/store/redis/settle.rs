//! Settlement: leases queue their tokens in a bounded channel that a background task sends to
//! Redis, many calls in flight on the one connection; settlements Redis could not take are sent
//! again, and while Redis is down they also go to the local counters.
//!
//! A settlement whose call timed out here may still run in Redis (a paused Redis runs what was
//! buffered when it resumes), and then its retry would count it again. So each settlement gets an
//! id when its lease settles, kept across retries: this process's random 64-bit prefix and a
//! counter. `settle.lua` records the id (`PREFIX{model}:settled:ID`, the model's hash tag, so the
//! same cluster slot) for the window plus a margin and skips an id it has already recorded. A copy
//! can only arrive later than that if Redis (or the way to it) fails for a whole window right
//! after running the first.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::connection::bounded;
use super::{caller_hash_ttl, Inner, MAX_EXACT, RETRY_INTERVAL};
use super::{caller_keys, caller_model_prefix, holds_slot};
use crate::caller::{CallerMarks, Callers, NanoUsd, DAY_MS};
use crate::config::{ModelId, TokenAccounting};
use crate::decision::{slot_ms, Millis, NOT_COUNTED};
use crate::store::{Settlement, Settler, SpendRow, StoreError};
use crate::throttle::LogThrottle;

/// Settlements sent to Redis at once by the flusher.
const SETTLE_BATCH: usize = 256;

/// A settlement is not on any request's path, so it may wait longer than an admission.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);

/// A settlement with the id it keeps across retries, and its callers (their counters settle
/// too, each in its own hash, by the same id).
#[derive(Debug, Clone)]
pub(super) struct Pending {
    id: u64,
    settlement: Settlement,
    callers: Option<Arc<Callers>>,
    /// The hashes that took it already: a retry sends only the others.
    taken: Taken,
    /// The callers' counts of an admission their model refused on a Redis Cluster, taken back
    /// with the marks that admission wrote (`CallersCounted`; the request's own marks may
    /// be written again by its fallback or its next try): the model's hash is not touched, no
    /// spend is logged, and the model's `settling` count is not moved.
    undo: Option<CallerMarks>,
    /// Counted in the store's settlements with callers not yet recorded whole until it is
    /// dropped: recorded, or given up.
    _callers: Option<CallersSettling>,
}

/// One settlement with callers not yet recorded whole: counted while it lives (a copy counts
/// again). A pending settlement is dropped once every part of it is recorded, or when it is
/// given up.
#[derive(Debug)]
pub(super) struct CallersSettling(Arc<AtomicU64>);

impl Clone for CallersSettling {
    fn clone(&self) -> Self {
        Self::count(&self.0)
    }
}

impl CallersSettling {
    pub(super) fn count(counter: &Arc<AtomicU64>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(counter))
    }
}

impl Drop for CallersSettling {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which hashes of a settlement Redis has taken. On a Redis Cluster the model's hash and its
/// callers' may be on two masters, one of them down: the model's part, once taken, is not sent
/// again (it would only count as a duplicate) and its `settling` count is released as soon as
/// it is taken, so the model's waiters do not wait on its callers' master.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Taken {
    model: bool,
    /// By caller place (key, team).
    callers: [bool; 2],
}

impl Pending {
    /// Takes back what the callers' call of a split admission counted (`callers`' marks).
    pub(super) fn undo(
        id: u64,
        model: ModelId,
        pool: crate::config::PoolRef,
        callers: Arc<Callers>,
        marks: CallerMarks,
    ) -> Self {
        Pending {
            id,
            settlement: Settlement {
                model,
                pool,
                tokens: 0,
                reserved: 0,
                model_window: NOT_COUNTED,
                pool_window: NOT_COUNTED,
                cancel: true,
                on_fallback: false,
            },
            callers: Some(callers),
            // Nothing of it goes to the model's hash, nor moves its `settling` count.
            taken: Taken {
                model: true,
                callers: [false; 2],
            },
            undo: Some(marks),
            _callers: None,
        }
    }
}

/// This process's random prefix of settlement ids: std's `RandomState` is seeded from the OS's
/// randomness (no new dependency), mixed with the pid and the time for good measure.
pub(super) fn process_id() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(t.as_nanos());
    }
    hasher.finish()
}

/// The key recording that settlement `id` of process `prefix` was applied to `model_key`'s hash.
fn settled_key(model_key: &str, prefix: u64, id: u64) -> String {
    format!("{model_key}:settled:{prefix:016x}-{id:x}")
}

impl Inner {
    /// `pending`'s model part is recorded: its `settling` count released at once, before its
    /// callers' part is sent (their master may be away) and before the settled hook runs.
    fn model_part_taken(&self, pending: &mut Pending) {
        if !pending.taken.model {
            pending.taken.model = true;
            self.settled(pending.settlement.model);
        }
    }

    /// A settlement of `model` handed to the settler is now recorded (or dropped).
    fn settled(&self, model: ModelId) {
        if let Some(n) = self.settling.get(model.index()) {
            n.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn settle_locally(&self, settlement: Settlement) {
        self.stats.settlements_local.fetch_add(1, Ordering::Relaxed);
        if let Some(settler) = self.local_settlers.get(settlement.model.index()) {
            settler.settle(settlement);
        }
    }

    /// Sends what of `pending` Redis has not taken yet, marking each part as it is taken.
    async fn settle(&self, pending: &mut Pending) -> Result<(), StoreError> {
        let s = pending.settlement;
        let Some(key) = self.keys.get(s.model.index()) else {
            // No such model here: nothing to record, and nothing left settling.
            self.model_part_taken(pending);
            return Ok(());
        };
        let window_ms = self.config.settings().window_ms;
        let slot = slot_ms(window_ms);
        let pool_prefix = self.pool_prefix(s.model, s.pool);
        let mut pairs = vec![("m", s.model_window, window_ms, slot)];
        if !pool_prefix.is_empty() {
            pairs.push((pool_prefix, s.pool_window, window_ms, slot));
        }
        let (tokens, reserved) = (s.tokens.min(MAX_EXACT), s.reserved.min(MAX_EXACT));
        let ttl = i64::try_from(self.ttl_ms).unwrap_or(i64::MAX);
        // A model's settlement wakes the fleet's waiters when it frees room (settle.lua).
        let wake = self
            .flow_keys
            .get(s.model.index())
            .map(|k| k.channel.as_str());
        if !pending.taken.model {
            self.settle_hash(
                key,
                pending.id,
                (tokens, reserved),
                ttl,
                &pairs,
                &[],
                None,
                s.cancel,
                wake,
            )
            .await?;
            self.model_part_taken(pending);
        }
        let Some(callers) = pending.callers.as_ref() else {
            return Ok(());
        };
        let marks = pending.undo.unwrap_or_else(|| callers.marks());
        // A caller admitted on the local fallback was counted there ([`RedisSettler`]): Redis
        // gets only what it spent, so a budget holds across an outage (no pair, no slot, no
        // reservation to take back).
        let on_fallback = marks.slot == 0;
        if on_fallback && (s.cancel || pending.undo.is_some()) {
            return Ok(());
        }
        let model_prefix = caller_model_prefix(self.config.model(s.model).name());
        let member = self.slot_member(marks.slot);
        let reserved = marks.reserved.min(MAX_EXACT);
        let (cost_reserved, cost) = match on_fallback {
            true => (0, callers.cost().nanos()),
            false => (marks.cost_reserved, callers.cost().nanos()),
        };
        let model_budget = format!("{model_prefix}$");
        for place in 0..2 {
            let Some(caller) = callers.get(place).filter(|_| !pending.taken.callers[place]) else {
                continue;
            };
            let [hash, slots] = caller_keys(&self.key_prefix, self.caller_layout(), caller);
            let at = marks.marks[place];
            // Only the pairs the admission counted.
            let pairs: Vec<_> = [
                ("win:", at[0], window_ms, slot),
                ("day:", at[1], DAY_MS, slot_ms(DAY_MS)),
                (model_prefix.as_str(), at[2], window_ms, slot),
            ]
            .into_iter()
            .filter(|pair| pair.1 != NOT_COUNTED && !on_fallback)
            .collect();
            // A slot only where the caller has a limit of them or a budget (admit.lua keeps
            // none otherwise: `holds_slot`); nothing to send for a caller with neither.
            let slot_set = (holds_slot(caller.limits()) && !on_fallback)
                .then_some((slots.as_str(), member.as_str()));
            // The budgets the admission reserved on: (prefix, period, reserved, cost).
            let budgets: Vec<_> = [
                ("$", marks.budgets[place][0]),
                (model_budget.as_str(), marks.budgets[place][1]),
            ]
            .into_iter()
            .filter(|b| b.1 != NOT_COUNTED && !(on_fallback && cost == 0))
            .map(|(prefix, period)| (prefix, period, cost_reserved, cost))
            .collect();
            if pairs.is_empty() && slot_set.is_none() && budgets.is_empty() {
                continue;
            }
            let ttl = caller_hash_ttl(self.config.settings().window_kind, caller.limits());
            let spent = self
                .settle_hash(
                    &hash,
                    pending.id,
                    (tokens, reserved),
                    ttl,
                    &pairs,
                    &budgets,
                    slot_set,
                    s.cancel,
                    None,
                )
                .await?;
            pending.taken.callers[place] = true;
            // What the budgets hold now, for a durable copy (`RedisStoreBuilder::spend_log`).
            if let Some(log) = self.spend_log.as_ref().filter(|_| pending.undo.is_none()) {
                let model_name = self.model_names[s.model.index()].clone();
                for ((prefix, period, _, _), after) in budgets.iter().zip(spent) {
                    let Ok(after) = u64::try_from(after) else {
                        continue;
                    };
                    log.record(SpendRow {
                        kind: caller.kind(),
                        id: Arc::clone(caller.identity().shared_id()),
                        model: (*prefix != "$").then(|| model_name.clone()),
                        period: *period,
                        spent: NanoUsd::from_nanos(after),
                    });
                }
            }
        }
        Ok(())
    }

    /// One `settle.lua` call: settlement `id` of `(tokens, reserved)` on `pairs` (prefix, mark,
    /// window, slot length) and `budgets` (prefix, period, cost reserved, cost) of `hash`,
    /// freeing a parallel slot (its set and member) if given, publishing on `wake` (a model's
    /// channel) if it frees room while someone may wait; `ttl_ms` -1 keeps the hash. Returns
    /// each budget's spend after it (-1 where its period has ended; none when the settlement had
    /// been applied before).
    #[allow(clippy::too_many_arguments)]
    async fn settle_hash(
        &self,
        hash: &str,
        id: u64,
        (tokens, reserved): (u64, u64),
        ttl_ms: i64,
        pairs: &[(&str, Millis, Millis, Millis)],
        budgets: &[(&str, u64, u64, u64)],
        slot_set: Option<(&str, &str)>,
        cancel: bool,
        wake: Option<&str>,
    ) -> Result<Vec<i64>, StoreError> {
        let id_key = settled_key(hash, self.settlement_ids, id);
        let mut keys = vec![hash, id_key.as_str()];
        keys.extend(slot_set.map(|(set, _)| set));
        let mut connection = self.connection.clone();
        let call = self
            .settle_script
            .call::<Vec<i64>>(&mut connection, &keys, |cmd| {
                cmd.arg(tokens)
                    .arg(reserved)
                    .arg(ttl_ms)
                    .arg(u8::from(cancel))
                    .arg(self.window_kind_arg())
                    .arg(match self.config.settings().token_accounting {
                        TokenAccounting::PostHoc => "p",
                        TokenAccounting::Reserve => "r",
                    })
                    .arg(slot_set.map_or("", |(_, member)| member))
                    .arg(self.ttl_ms)
                    .arg(pairs.len());
                for (prefix, mark, window, slot) in pairs {
                    cmd.arg(*prefix).arg(*mark).arg(*window).arg(*slot);
                }
                // The wake-up channel ("" for none), then the budgets.
                cmd.arg(wake.unwrap_or(""));
                cmd.arg(budgets.len());
                for (prefix, period, reserved, cost) in budgets {
                    cmd.arg(*prefix).arg(*period).arg(*reserved).arg(*cost);
                }
            });
        let mut result = self
            .timed(bounded(SETTLE_TIMEOUT.max(self.timeout), call))
            .await?;
        if result.first() != Some(&1) {
            self.stats
                .settlements_duplicate
                .fetch_add(1, Ordering::Relaxed);
            return Ok(Vec::new());
        }
        result.remove(0);
        Ok(result)
    }
}

pub(super) enum Queued {
    Settle(Pending),
    /// Answered once everything queued before it has been sent.
    Flush(oneshot::Sender<()>),
}

/// Drains the settlement queue: up to [`SETTLE_BATCH`] settlements in flight at once, pipelined on
/// the one multiplexed connection. Settlements Redis could not take are kept (up to the queue's
/// capacity, the oldest dropped and counted beyond it) and sent again every [`RETRY_INTERVAL`], so
/// tokens recorded during an outage reach the shared counters when Redis is back.
///
/// It holds the store's state to the end: settlements queued by the last leases of a store that is
/// otherwise gone (replaced by a config reload) are still sent. It ends when every sender has.
pub(super) async fn flush_settlements(
    inner: Arc<Inner>,
    mut receiver: mpsc::Receiver<Queued>,
    capacity: usize,
) {
    let mut batch = Vec::with_capacity(SETTLE_BATCH);
    let mut retry: Vec<Pending> = Vec::new();
    let mut next_retry = tokio::time::Instant::now();
    let mut open = true;
    // The last retry failed entirely: Redis is taken for down, and the next retry sends one
    // settlement to find out before the rest (a backlog is not a call per settlement every
    // retry, each counted a failure, nor all at once on a Redis coming back).
    let mut down = false;
    loop {
        // New settlements (and flush requests) are handled as they come; the ones Redis refused
        // wait for their retry time.
        let mut retry_due = false;
        if retry.is_empty() {
            if !open || receiver.recv_many(&mut batch, SETTLE_BATCH).await == 0 {
                return;
            }
        } else {
            tokio::select! {
                n = receiver.recv_many(&mut batch, SETTLE_BATCH), if open => open = n > 0,
                () = tokio::time::sleep_until(next_retry) => retry_due = true,
            }
        }
        let retried = match (retry_due, down) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => retry.len().min(SETTLE_BATCH),
        };
        let mut settlements: Vec<Pending> = retry.drain(..retried).collect();
        let mut flushed = Vec::new();
        for queued in batch.drain(..) {
            match queued {
                Queued::Settle(s) => settlements.push(s),
                Queued::Flush(done) => flushed.push(done),
            }
        }
        let model_taken: Vec<bool> = settlements.iter().map(|s| s.taken.model).collect();
        let results =
            futures_util::future::join_all(settlements.iter_mut().map(|s| inner.settle(s))).await;
        let (mut failed, mut retried_failed) = (0, 0);
        let mut settled_models: Vec<ModelId> = Vec::new();
        let each = settlements.into_iter().zip(results).zip(model_taken);
        for (i, ((s, result), taken_before)) in each.enumerate() {
            if s.taken.model && !taken_before {
                // The model's part recorded (its callers' may still be retried), its count
                // released already: the hook's waiters see it.
                if !settled_models.contains(&s.settlement.model) {
                    settled_models.push(s.settlement.model);
                }
            }
            if let Err(e) = result {
                if failed == 0 && retry.is_empty() {
                    // Once per outage and store; at most a line a second over all stores.
                    static UNRECORDED: LogThrottle = LogThrottle::new();
                    if let Some(suppressed) = UNRECORDED.slot() {
                        tracing::warn!(
                            %e,
                            suppressed,
                            prefix = %inner.key_prefix,
                            "rate-limit settlements not recorded in Redis; retrying"
                        );
                    }
                }
                failed += 1;
                // The retried ones come first.
                retried_failed += usize::from(i < retried);
                retry.push(s);
            }
        }
        if retried > 0 {
            down = retried_failed == retried;
        }
        if failed > 0 {
            next_retry = tokio::time::Instant::now() + RETRY_INTERVAL;
        } else if retried > 0 {
            // The probe went through: the rest of the backlog at once.
            next_retry = tokio::time::Instant::now();
        }
        if retry.len() > capacity {
            let excess = retry.len() - capacity;
            for dropped in retry.drain(..excess) {
                if !dropped.taken.model {
                    inner.settled(dropped.settlement.model);
                }
            }
            inner
                .stats
                .settlements_dropped
                .fetch_add(excess as u64, Ordering::Relaxed);
        }
        inner
            .stats
            .settlements_retried
            .fetch_add(failed, Ordering::Relaxed);
        // Now that Redis counts them, refunds may let waiters in (`Store::on_settled`).
        if !settled_models.is_empty() {
            let hook = inner.settled_hook.read().unwrap_or_else(|e| e.into_inner());
            if let Some(hook) = hook.as_ref() {
                settled_models.iter().for_each(|&model| hook(model));
            }
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// Settles into Redis through the background queue, or locally while Redis is down.
pub(super) struct RedisSettler {
    pub(super) inner: Arc<Inner>,
    pub(super) queue: mpsc::Sender<Queued>,
}

impl fmt::Debug for RedisSettler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettler").finish_non_exhaustive()
    }
}

impl Settler for RedisSettler {
    fn settle(&self, settlement: Settlement) {
        match settlement.on_fallback {
            true => self.settle_fallback(settlement, None),
            false => self.send(settlement, None),
        }
    }

    fn settle_callers(&self, settlement: Settlement, callers: &Arc<Callers>) {
        // Admitted on the local fallback (no slot in Redis): its callers' counters, slots
        // included, are the local store's alone.
        if callers.marks().slot == 0 {
            self.inner.local.settle_callers_only(settlement, callers);
            // Redis gets what its budgets spent (`Inner::settle`), if any.
            let spent = callers
                .iter()
                .any(|c| c.limits().has_budget())
                .then(|| Arc::clone(callers));
            if settlement.on_fallback {
                return self.settle_fallback(settlement, spent);
            }
            // Its model's local counters too, also while its model answers (a cluster whose
            // callers' slot was away).
            self.inner.settle_locally(settlement);
            return self.queue(settlement, spent);
        }
        // (A request the fallback admitted has its callers there too: slot 0, above.)
        self.send(settlement, Some(Arc::clone(callers)));
    }
}

impl RedisSettler {
    /// Settles a request the local fallback admitted: on the fallback's counters, which counted
    /// it, whether or not Redis is back. Redis knows of it only as an admission that reserved
    /// nothing, once told (`repay`): its tokens go there with no reservation to replace, and a
    /// cancel takes back what is still owed instead, or, once told, the admission Redis got.
    /// `spent`: its callers, when a budget of theirs is to get what it cost.
    fn settle_fallback(&self, settlement: Settlement, spent: Option<Arc<Callers>>) {
        self.inner.settle_locally(settlement);
        if settlement.cancel && self.inner.forgive_owed(settlement.model, settlement.pool) {
            return;
        }
        self.queue(
            Settlement {
                reserved: 0,
                ..settlement
            },
            spent,
        );
    }

    fn send(&self, settlement: Settlement, callers: Option<Arc<Callers>>) {
        // While admissions run on the local fallback, its counters need the tokens too, to keep
        // the local share honest; Redis still gets them (queued) when it answers again.
        if self.inner.is_down(settlement.model) {
            self.inner.settle_locally(settlement);
        }
        self.queue(settlement, callers);
    }

    /// Queues `settlement` for Redis.
    fn queue(&self, settlement: Settlement, callers: Option<Arc<Callers>>) {
        // The id is fixed here, once per lease, and travels with every retry.
        let id = self.inner.next_settlement.fetch_add(1, Ordering::Relaxed);
        let model = settlement.model;
        // Counted before it is queued, so a waiter that sees the lease over sees it pending.
        if let Some(n) = self.inner.settling.get(model.index()) {
            n.fetch_add(1, Ordering::SeqCst);
        }
        let counted = callers
            .as_ref()
            .map(|_| CallersSettling::count(&self.inner.callers_settling));
        match self.queue.try_send(Queued::Settle(Pending {
            id,
            settlement,
            callers,
            taken: Taken::default(),
            undo: None,
            _callers: counted,
        })) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => self.inner.settled(model),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.inner.settled(model);
                let dropped = self
                    .inner
                    .stats
                    .settlements_dropped
                    .fetch_add(1, Ordering::Relaxed);
                // Logged at 1, 2, 4, 8, … so a flood does not flood the log too.
                if (dropped + 1).is_power_of_two() {
                    tracing::warn!(
                        dropped = dropped + 1,
                        "rate-limit settlement queue full; tokens not recorded"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_keys_share_the_model_hash_tag_and_differ_by_process_and_id() {
        let key = settled_key("tpl:{gpt-5}", 0xab, 0x1f);
        assert_eq!(key, "tpl:{gpt-5}:settled:00000000000000ab-1f");
        // Redis Cluster hashes only what is inside the first {...}: the model's slot.
        let tag = |k: &str| {
            let open = k.find('{').unwrap();
            let close = open + k[open..].find('}').unwrap();
            k[open + 1..close].to_owned()
        };
        assert_eq!(tag(&key), tag("tpl:{gpt-5}"));
        assert_ne!(settled_key("tpl:{m}", 1, 2), settled_key("tpl:{m}", 2, 2));
        assert_ne!(settled_key("tpl:{m}", 1, 2), settled_key("tpl:{m}", 1, 3));
    }

    #[test]
    fn process_ids_are_random() {
        // Two stores in one process (or two processes) must not share a prefix.
        assert_ne!(process_id(), process_id());
    }
}
