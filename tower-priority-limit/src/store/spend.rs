//! Budgets' spend as a durable copy (a database the gateway writes to) keeps it, and the log
//! that collects it from settlements.
//!
//! Spend in one budget period only grows, so a row is a state, not a change: the row with the
//! later period, or the same period and more spent, is the newer. Writing a row twice, or an
//! older one after a newer, changes nothing ([`SpendRow::is_newer_than`]); that is what makes
//! the copy idempotent across retries and across the gateways of a fleet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::caller::{CallerKind, NanoUsd};

/// One budget's spend: a key's or team's, all models' (`model: None`) or one model's, by the
/// model's name (ids change with the config; names are what a database keeps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendRow {
    /// Key or team.
    pub kind: CallerKind,
    /// The id its counters are kept under.
    pub id: Arc<str>,
    /// The model of a model budget (`None`: all models).
    pub model: Option<Arc<str>>,
    /// The period's start, in Unix ms (0 for a budget that never resets).
    pub period: u64,
    /// Settled cost in the period.
    pub spent: NanoUsd,
}

impl SpendRow {
    /// Whether this row is a later state of its budget than `other`'s: a later period, or the
    /// same one with more spent.
    pub fn is_newer_than(&self, other: &SpendRow) -> bool {
        newer((self.period, self.spent), (other.period, other.spent))
    }
}

/// The rule: a later period, or the same one with more spent.
fn newer(a: (u64, NanoUsd), b: (u64, NanoUsd)) -> bool {
    a > b
}

type Budget = (CallerKind, Arc<str>, Option<Arc<str>>);

/// The newest row of each budget a settlement changed, until a writer takes them; shared by
/// clones (a config reload's new store feeds the same log).
///
/// Bounded by `max_budgets` budgets: a row of a budget not in the log yet is dropped (and
/// counted) while it is full, so a writer that cannot write (its database down) costs bounded
/// memory; rows of budgets already in it still replace theirs.
#[derive(Debug, Clone)]
pub struct SpendLog {
    inner: Arc<Mutex<LogInner>>,
}

#[derive(Debug)]
struct LogInner {
    rows: HashMap<Budget, (u64, NanoUsd)>,
    max_budgets: usize,
    dropped: u64,
}

/// Budgets a [`SpendLog`] holds by default.
pub const DEFAULT_MAX_BUDGETS: usize = 1_000_000;

impl Default for SpendLog {
    fn default() -> Self {
        Self::bounded(DEFAULT_MAX_BUDGETS)
    }
}

impl SpendLog {
    /// An empty log holding at most `max_budgets` budgets.
    pub fn bounded(max_budgets: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(LogInner {
                rows: HashMap::new(),
                max_budgets,
                dropped: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `row` unless the log holds a newer row of its budget; returns `false` when it was
    /// dropped because the log is full.
    pub fn record(&self, row: SpendRow) -> bool {
        self.lock().record(row)
    }

    /// Keeps each of `rows` as [`record`](Self::record) does (rows a failed write gives back).
    pub fn record_all(&self, rows: impl IntoIterator<Item = SpendRow>) {
        let mut inner = self.lock();
        for row in rows {
            inner.record(row);
        }
    }

    /// Every row, leaving the log empty.
    pub fn take(&self) -> Vec<SpendRow> {
        let mut inner = self.lock();
        inner
            .rows
            .drain()
            .map(|((kind, id, model), (period, spent))| SpendRow {
                kind,
                id,
                model,
                period,
                spent,
            })
            .collect()
    }

    /// Budgets held now.
    pub fn len(&self) -> usize {
        self.lock().rows.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows dropped so far because the log was full.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}

impl LogInner {
    fn record(&mut self, row: SpendRow) -> bool {
        let full = self.rows.len() >= self.max_budgets;
        let budget = (row.kind, row.id, row.model);
        match self.rows.get_mut(&budget) {
            Some(held) => {
                if newer((row.period, row.spent), *held) {
                    *held = (row.period, row.spent);
                }
                true
            }
            None if full => {
                self.dropped += 1;
                false
            }
            None => {
                self.rows.insert(budget, (row.period, row.spent));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, model: Option<&str>, period: u64, nanos: u64) -> SpendRow {
        SpendRow {
            kind: CallerKind::Key,
            id: Arc::from(id),
            model: model.map(Arc::from),
            period,
            spent: NanoUsd::from_nanos(nanos),
        }
    }

    #[test]
    fn the_newest_row_of_a_budget_wins_whatever_the_order() {
        let log = SpendLog::default();
        for r in [
            row("a", None, 10, 5),
            row("a", None, 10, 9),
            row("a", None, 10, 7),
        ] {
            log.record(r);
        }
        // A new period replaces the old even with less spent; an older period never does.
        log.record(row("b", None, 10, 50));
        log.record(row("b", None, 20, 1));
        log.record(row("b", None, 10, 90));
        let mut rows = log.take();
        rows.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(rows, vec![row("a", None, 10, 9), row("b", None, 20, 1)]);
        assert!(log.is_empty());
    }

    #[test]
    fn a_model_budget_is_its_own_row() {
        let log = SpendLog::default();
        log.record(row("a", None, 0, 5));
        log.record(row("a", Some("m"), 0, 3));
        log.record(SpendRow {
            kind: CallerKind::Team,
            ..row("a", None, 0, 1)
        });
        assert_eq!(log.len(), 3);
    }

    #[test]
    fn a_full_log_drops_new_budgets_but_updates_the_ones_it_holds() {
        let log = SpendLog::bounded(2);
        assert!(log.record(row("a", None, 0, 1)));
        assert!(log.record(row("b", None, 0, 1)));
        assert!(!log.record(row("c", None, 0, 1)));
        assert!(log.record(row("a", None, 0, 4)));
        assert_eq!(log.dropped(), 1);
        let rows = log.take();
        assert_eq!(rows.len(), 2);
        assert!(rows.contains(&row("a", None, 0, 4)));
    }

    #[test]
    fn newer_is_by_period_then_spend() {
        assert!(row("a", None, 2, 0).is_newer_than(&row("a", None, 1, 100)));
        assert!(row("a", None, 1, 2).is_newer_than(&row("a", None, 1, 1)));
        assert!(!row("a", None, 1, 1).is_newer_than(&row("a", None, 1, 1)));
    }
}
