//! Spend given back to Redis after Redis lost its data (`FLUSHALL`, a restart without
//! persistence), from a durable copy that a gateway keeps ([`super::RedisStoreBuilder::spend_log`]
//! feeds it).
//!
//! - **Epoch**: `PREFIX{spend}` holds an `epoch` that the first gateway to find it missing sets
//!   (one script: read, or set if absent). An empty Redis has none, so a new epoch starts exactly
//!   when the data is gone; `restored` holds the epoch whose restore has finished.
//! - **Restore**: one `restore.lua` per caller adds the copy's spend to its hash and marks the hash
//!   with the epoch, so gateways restoring at once (each finds the epoch unrestored) add it once.
//! - What a copy cannot hold is lost: settlements not yet written to it when Redis emptied.

use std::collections::HashMap;
use std::time::Duration;

use super::connection::bounded;
use super::settle::process_id;
use super::{caller_hash, caller_model_prefix, RedisStore};
use crate::caller::{CallerKind, NanoUsd};
use crate::store::{SpendRow, StoreError};

/// Reads the epoch, setting `ARGV[1]` if there is none; returns it and the restored one.
pub(super) const EPOCH: &str = "
local e = redis.call('HGET', KEYS[1], 'epoch')
if not e then
  e = ARGV[1]
  redis.call('HSET', KEYS[1], 'epoch', e)
end
return {e, redis.call('HGET', KEYS[1], 'restored') or ''}
";

/// Callers restored at once (calls in flight on the one connection).
const RESTORE_BATCH: usize = 256;

/// The TTL of a hash a restore creates for budgets that reset: longer than any budget period
/// people set (a month); the caller's next settlement sets its own.
const RESTORED_TTL: Duration = Duration::from_secs(40 * 24 * 3600);

/// Which Redis "life" the counters are in: a new epoch starts when Redis comes back empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendEpoch {
    /// The epoch's id.
    pub id: String,
    /// Whether spend has been restored in it (by any gateway).
    pub restored: bool,
}

impl RedisStore {
    /// The current epoch, starting one if Redis has none (it is empty, or never had one).
    pub async fn spend_epoch(&self) -> Result<SpendEpoch, StoreError> {
        let inner = &self.inner;
        let script = &inner.epoch_script;
        let key = epoch_key(&inner.key_prefix);
        let fresh = format!("{:016x}", process_id());
        let mut connection = inner.connection.clone();
        let keys = [key.as_str()];
        let call = script.call::<(String, String)>(&mut connection, &keys, |cmd| {
            cmd.arg(&fresh);
        });
        let (id, restored) = bounded(inner.timeout.max(Duration::from_secs(1)), call).await?;
        Ok(SpendEpoch {
            restored: restored == id,
            id,
        })
    }

    /// Adds `rows` (a durable copy's spend) to the callers' hashes, once per `epoch` for each
    /// caller, then marks the epoch restored. Returns how many callers this call restored (the
    /// others were restored for this epoch already). An error leaves the epoch unrestored: call
    /// again (each caller is still restored once).
    pub async fn restore_spend(
        &self,
        epoch: &SpendEpoch,
        rows: &[SpendRow],
    ) -> Result<usize, StoreError> {
        let inner = &self.inner;
        let script = &inner.restore_script;
        let mut by_caller: HashMap<(CallerKind, &str), Vec<&SpendRow>> = HashMap::new();
        for row in rows {
            by_caller.entry((row.kind, &row.id)).or_default().push(row);
        }
        let callers: Vec<_> = by_caller.into_iter().collect();
        let timeout = inner.timeout.max(Duration::from_secs(1));
        let mut restored = 0;
        for batch in callers.chunks(RESTORE_BATCH) {
            let calls = batch.iter().map(|((kind, id), rows)| {
                let hash = caller_hash(&inner.key_prefix, inner.caller_layout(), *kind, id);
                let ttl = match rows.iter().all(|r| r.period > 0) {
                    true => i64::try_from(RESTORED_TTL.as_millis()).unwrap_or(i64::MAX),
                    false => -1,
                };
                let fields: Vec<(String, u64, u64)> = rows
                    .iter()
                    .map(|r| {
                        let prefix = match &r.model {
                            None => "$".to_owned(),
                            Some(model) => format!("{}$", caller_model_prefix(model)),
                        };
                        (prefix, r.period, r.spent.nanos())
                    })
                    .collect();
                let mut connection = inner.connection.clone();
                async move {
                    let keys = [hash.as_str()];
                    let call = script.call::<Vec<i64>>(&mut connection, &keys, |cmd| {
                        cmd.arg(&epoch.id).arg(ttl);
                        for (prefix, period, spent) in &fields {
                            cmd.arg(prefix).arg(*period).arg(*spent);
                        }
                    });
                    bounded(timeout, call).await
                }
            });
            let results = futures_util::future::join_all(calls).await;
            for (result, (_, rows)) in results.into_iter().zip(batch) {
                let after = result?;
                if after.first() != Some(&1) {
                    continue;
                }
                restored += 1;
                // What a budget holds after the restore, where the spend settled since Redis
                // came back made it more than the copy's row: the copy gets it too, or a
                // second emptying would restore the row without that spend.
                let Some(log) = inner.spend_log.as_ref() else {
                    continue;
                };
                for (row, &now) in rows.iter().zip(&after[1..]) {
                    if let Ok(now) = u64::try_from(now) {
                        if now > row.spent.nanos() {
                            log.record(SpendRow {
                                spent: NanoUsd::from_nanos(now),
                                ..(*row).clone()
                            });
                        }
                    }
                }
            }
        }
        let mut connection = inner.connection.clone();
        let mut mark = redis::cmd("HSET");
        mark.arg(epoch_key(&inner.key_prefix))
            .arg("restored")
            .arg(&epoch.id);
        let mark = mark.query_async::<i64>(&mut connection);
        bounded(timeout, mark).await?;
        Ok(restored)
    }
}

/// `PREFIX{spend}`: the epoch's hash.
fn epoch_key(prefix: &str) -> String {
    format!("{prefix}{{spend}}")
}
