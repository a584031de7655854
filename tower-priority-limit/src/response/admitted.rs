//! The rate-limit headers of an admitted response: what they say, a rule over the admission
//! ([`HeaderNumbers`]), and how they are written into the response ([`AdmittedHeaders`]).
//!
//! They are most of what the layer adds to a response: up to 15 headers, each a long custom name
//! that `http`'s map hashes byte by byte on insert (about 70 ns each here). But a model's
//! responses under one priority and mode carry the same names, with the same values except the
//! counts and resets, after service headers that are mostly named alike too (a JSON answer's, a
//! stream's). So the first response of each kind builds a template: its service's header names,
//! then the rate-limit headers. A later response of that kind clones it, moves its service's
//! values in and sets the numbers: no name is hashed. A response no template fits gets each header
//! inserted, with the same result: the service's headers first, then these, any of the service's
//! with one of these names replaced.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use super::headers::{explain_refusal, priority_value, X_LITELLM_PRIORITY, X_SHADOW_REFUSED_BY};
use crate::config::{pool_at, pool_index, LimiterConfig, ModelId, ModelLimits, PoolRef};
use crate::decision::Admitted;

/// Headers per dimension (requests, then tokens): the model's limit and remaining, the pool's,
/// then the caller's effective limit, remaining and reset.
const PER_DIMENSION: usize = 7;
const MODEL_LIMIT: usize = 0;
const MODEL_REMAINING: usize = 1;
const POOL_LIMIT: usize = 2;
const POOL_REMAINING: usize = 3;
const LIMIT: usize = 4;
const REMAINING: usize = 5;
const RESET: usize = 6;
/// Both dimensions' headers, then `x-litellm-priority`.
const SLOTS: usize = 2 * PER_DIMENSION + 1;
const PRIORITY: usize = SLOTS - 1;

macro_rules! slot_names {
    [$($dim:literal),*] => {
        [
            $(
                HeaderName::from_static(concat!("x-ratelimit-model_saturation_check-limit-", $dim)),
                HeaderName::from_static(concat!(
                    "x-ratelimit-model_saturation_check-remaining-",
                    $dim
                )),
                HeaderName::from_static(concat!("x-ratelimit-priority_model-limit-", $dim)),
                HeaderName::from_static(concat!("x-ratelimit-priority_model-remaining-", $dim)),
                HeaderName::from_static(concat!("x-ratelimit-limit-", $dim)),
                HeaderName::from_static(concat!("x-ratelimit-remaining-", $dim)),
                HeaderName::from_static(concat!("x-ratelimit-reset-", $dim)),
            )*
            X_LITELLM_PRIORITY,
        ]
    };
}

/// Each slot's header name, in slot order.
static SLOT_NAMES: [HeaderName; SLOTS] = slot_names!["requests", "tokens"];

/// What a slot's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A limit or the priority label: the same for every response of a model, priority and mode.
    Fixed,
    /// A remaining count.
    Count,
    /// Seconds until the window resets, as `6s`.
    Reset,
}

fn kind(slot: usize) -> Kind {
    if slot == PRIORITY {
        return Kind::Fixed;
    }
    match slot % PER_DIMENSION {
        REMAINING | MODEL_REMAINING | POOL_REMAINING => Kind::Count,
        RESET => Kind::Reset,
        _ => Kind::Fixed,
    }
}

/// What one admission's headers say: which slots it has and, for count and reset slots, their
/// numbers. The rule of docs/behaviour.md ("Headers on admitted responses"): the OpenAI-style
/// `x-ratelimit-{limit,remaining,reset}-*` describe the caller's effective limit, the model-wide
/// capacity in generous mode and its pool's (bounded by what the model has left) in strict mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeaderNumbers {
    /// Bit `slot` set: the header is sent.
    present: u16,
    /// Remaining counts and reset seconds by slot; 0 for the fixed ones.
    numbers: [u64; SLOTS],
    /// Strict mode with a pool that has limits: the effective limit is the pool's.
    strict: bool,
}

impl HeaderNumbers {
    fn of(limits: &ModelLimits, pool: PoolRef, a: &Admitted) -> Self {
        let pool_limits = limits.pool(pool);
        let strict = a.strict && pool_limits.is_some();
        let reset_ms = if strict {
            a.pool_resets_in
        } else {
            a.model_resets_in
        };
        let mut said = HeaderNumbers {
            present: 0,
            numbers: [0; SLOTS],
            strict,
        };
        let dimensions = [
            (
                limits.rpm,
                a.model.requests,
                pool_limits.and_then(|p| p.rpm),
                a.pool.map(|u| u.requests),
            ),
            (
                limits.tpm,
                a.model.tokens,
                pool_limits.and_then(|p| p.tpm),
                a.pool.map(|u| u.tokens),
            ),
        ];
        for (d, (model_limit, model_used, pool_limit, pool_used)) in
            dimensions.into_iter().enumerate()
        {
            let base = d * PER_DIMENSION;
            let model_remaining = model_limit.map(|l| l.saturating_sub(model_used));
            let pool_remaining = pool_limit.zip(pool_used).map(|(l, u)| l.saturating_sub(u));
            if let Some(m) = model_remaining {
                said.set(base + MODEL_LIMIT, 0);
                said.set(base + MODEL_REMAINING, m);
            }
            if let Some(p) = pool_remaining {
                said.set(base + POOL_LIMIT, 0);
                said.set(base + POOL_REMAINING, p);
            }
            let effective = if strict {
                pool_remaining.zip(model_remaining).map(|(p, m)| p.min(m))
            } else {
                model_remaining
            };
            if let Some(remaining) = effective {
                said.set(base + LIMIT, 0);
                said.set(base + REMAINING, remaining);
                said.set(base + RESET, reset_ms.div_ceil(1000));
            }
        }
        said.set(PRIORITY, 0);
        said
    }

    fn set(&mut self, slot: usize, number: u64) {
        self.present |= 1 << slot;
        self.numbers[slot] = number;
    }

    fn has(&self, slot: usize) -> bool {
        self.present & (1 << slot) != 0
    }

    fn count(&self) -> usize {
        self.present.count_ones() as usize
    }

    /// The count and reset slots' values.
    fn numbers(&self) -> Numbers {
        let mut text = CountText {
            bytes: [0; COUNT_TEXT],
            len: 0,
        };
        let mut spans = [(0u8, 0u8); SLOTS];
        for slot in (0..SLOTS).filter(|&s| self.has(s) && kind(s) == Kind::Count) {
            let start = text.len;
            text.push_decimal(self.numbers[slot]);
            spans[slot] = (start as u8, text.len as u8);
        }
        // A model without limits has no counts: nothing to allocate.
        let text = if text.len == 0 {
            Bytes::new()
        } else {
            Bytes::from_owner(text)
        };
        Numbers { text, spans }
    }
}

/// Room for the decimal text of every count slot: two dimensions, three counts each, at most 20
/// digits a count.
const COUNT_TEXT: usize = 2 * 3 * 20;

/// The decimal text of one response's counts, shared by their header values: one allocation for
/// all of them, where `HeaderValue::from(u64)` makes two for each.
struct CountText {
    bytes: [u8; COUNT_TEXT],
    len: usize,
}

impl CountText {
    fn push_decimal(&mut self, n: u64) {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n).as_bytes();
        let end = self.len + digits.len();
        self.bytes[self.len..end].copy_from_slice(digits);
        self.len = end;
    }
}

impl AsRef<[u8]> for CountText {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// One response's count and reset values ([`HeaderNumbers::numbers`]).
struct Numbers {
    text: Bytes,
    /// Each count slot's bytes in `text`.
    spans: [(u8, u8); SLOTS],
}

impl Numbers {
    /// A count or reset slot's value.
    fn value(&self, said: &HeaderNumbers, slot: usize) -> HeaderValue {
        let n = said.numbers[slot];
        if kind(slot) == Kind::Reset {
            return reset_value(n);
        }
        let (start, end) = self.spans[slot];
        HeaderValue::from_maybe_shared(self.text.slice(usize::from(start)..usize::from(end)))
            .unwrap_or_else(|_| HeaderValue::from(n))
    }
}

/// `6s`-style reset duration.
fn reset_value(secs: u64) -> HeaderValue {
    // The default window is 60 s: those values need no allocation.
    match RESET_SECONDS.get(secs as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => {
            HeaderValue::from_str(&format!("{secs}s")).unwrap_or(HeaderValue::from_static("0s"))
        }
    }
}

static RESET_SECONDS: [&str; 61] = [
    "0s", "1s", "2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s", "10s", "11s", "12s", "13s", "14s",
    "15s", "16s", "17s", "18s", "19s", "20s", "21s", "22s", "23s", "24s", "25s", "26s", "27s",
    "28s", "29s", "30s", "31s", "32s", "33s", "34s", "35s", "36s", "37s", "38s", "39s", "40s",
    "41s", "42s", "43s", "44s", "45s", "46s", "47s", "48s", "49s", "50s", "51s", "52s", "53s",
    "54s", "55s", "56s", "57s", "58s", "59s", "60s",
];

/// `value` as one that lives as long as the process, when it is visible ASCII: cloning and
/// dropping it then costs no reference count, and every response clones the fixed values (a
/// config's limits and labels). Each distinct text is kept once, so reloading a config keeps
/// nothing more unless its limits or labels are new.
fn lasting(value: HeaderValue) -> HeaderValue {
    static KEPT: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    // `to_str` answers only for visible ASCII, which is what `from_static` takes.
    let Ok(text) = value.to_str() else {
        return value;
    };
    let mut kept = KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let text = match kept.get(text) {
        Some(&text) => text,
        None => {
            let text: &'static str = Box::leak(text.into());
            kept.insert(text);
            text
        }
    };
    HeaderValue::from_static(text)
}

/// The rate-limit headers of a config's admitted responses: every fixed value formatted once when
/// the limiter is built, and templates, each built by the first response of its kind.
#[derive(Debug)]
pub(crate) struct AdmittedHeaders {
    models: Box<[ModelHeaders]>,
    /// `x-litellm-priority` per named priority, then `default`.
    labels: Box<[HeaderValue]>,
}

#[derive(Debug)]
struct ModelHeaders {
    /// Model-wide `[rpm, tpm]`.
    model: [Option<HeaderValue>; 2],
    /// Per pool (named, then default): `[rpm, tpm]`.
    pools: Box<[[Option<HeaderValue>; 2]]>,
    /// Per label (named, then default): generous, then strict.
    templates: Box<[[Templates; 2]]>,
}

/// The templates of one model, priority and mode: for the first [`KINDS`] sets of the service's
/// header names seen that can make one (e.g. a JSON answer's and a stream's). Boxed: a config of
/// many models and priorities pays 16 bytes a cell until its responses come.
type Templates = [OnceLock<Box<Template>>; KINDS];

/// Templates per model, priority and mode: one per set of the service's header names.
const KINDS: usize = 2;

/// A response's headers as a map to clone: the service's header names (values to be moved in),
/// then the rate-limit headers of one model, priority and mode (counts to be set).
#[derive(Debug)]
struct Template {
    map: HeaderMap,
    /// The service's header names, in the order of its map: the first values of `map`.
    service: Box<[HeaderName]>,
    /// The slot of each of `map`'s values after the service's, in the order `values_mut` yields
    /// them. A clone yields them in the same order: `HeaderMap`'s `Clone` copies its entries.
    slots: Box<[u8]>,
    /// The slots it was built for ([`HeaderNumbers::present`]).
    present: u16,
}

impl Template {
    /// Whether it is the template for `said` on a service map of exactly `headers`' names, in
    /// the same order, one value each.
    fn fits(&self, headers: &HeaderMap, said: &HeaderNumbers) -> bool {
        self.present == said.present
            && headers.len() == self.service.len()
            && headers.keys_len() == self.service.len()
            && headers.keys().zip(self.service.iter()).all(|(a, b)| a == b)
    }
}

impl AdmittedHeaders {
    /// Formats every limit and label of `config`.
    pub(crate) fn new(config: &LimiterConfig) -> Self {
        let value = |n: Option<u64>| n.map(|n| lasting(HeaderValue::from(n)));
        let mut labels: Vec<HeaderValue> = config
            .priorities()
            .iter()
            .map(|l| lasting(priority_value(Some(l))))
            .collect();
        labels.push(priority_value(None));
        let models = config
            .models()
            .iter()
            .map(|m| ModelHeaders {
                model: [value(m.rpm), value(m.tpm)],
                pools: (0..m.pool_count())
                    .map(|i| {
                        let pool = pool_at(i, m.pool_count());
                        let p = m.pool(pool);
                        [value(p.and_then(|p| p.rpm)), value(p.and_then(|p| p.tpm))]
                    })
                    .collect(),
                templates: labels.iter().map(|_| Default::default()).collect(),
            })
            .collect();
        Self {
            models,
            labels: labels.into(),
        }
    }

    /// Adds the rate-limit headers of a request on `model` from `pool`, admitted as `a`, to a
    /// response's `headers` (replacing any of the same name), and under `shadow` enforcement
    /// those that explain the refusal it was admitted despite.
    pub(crate) fn write(
        &self,
        headers: &mut HeaderMap,
        config: &LimiterConfig,
        model: ModelId,
        pool: PoolRef,
        a: &Admitted,
    ) {
        let (Some(values), Some(limits)) = (
            self.models.get(model.index()),
            config.models().get(model.index()),
        ) else {
            // A model of another config: nothing to say.
            return;
        };
        let said = HeaderNumbers::of(limits, pool, a);
        if !self.write_from_template(headers, values, pool, &said) {
            self.write_each(headers, values, pool, &said);
        }
        if let Some(refused) = &a.shadow {
            explain_refusal(headers, X_SHADOW_REFUSED_BY, refused);
        }
    }

    /// Inserts each header of `said` into `headers`.
    fn write_each(
        &self,
        headers: &mut HeaderMap,
        values: &ModelHeaders,
        pool: PoolRef,
        said: &HeaderNumbers,
    ) {
        headers.reserve(said.count());
        let numbers = said.numbers();
        for slot in (0..SLOTS).filter(|&s| said.has(s)) {
            if let Some(value) = self.value(values, pool, said, &numbers, slot) {
                headers.insert(SLOT_NAMES[slot].clone(), value);
            }
        }
    }

    /// Replaces `headers` with a clone of the template for them and `said`, their values moved in
    /// and `said`'s numbers set: no header name is hashed. `false`, and `headers` untouched, when
    /// no template fits and none is left to build or they cannot make one.
    fn write_from_template(
        &self,
        headers: &mut HeaderMap,
        values: &ModelHeaders,
        pool: PoolRef,
        said: &HeaderNumbers,
    ) -> bool {
        let Some(cells) = values.templates.get(self.label_index(pool)) else {
            return false;
        };
        let template = cells[usize::from(said.strict)].iter().find_map(|cell| {
            match cell.get() {
                Some(template) => Some(template),
                // A response that cannot make a template takes no cell: an odd first response
                // must not keep the usual ones from theirs.
                None => {
                    let built = self.template(headers, values, pool, said)?;
                    Some(cell.get_or_init(|| Box::new(built)))
                }
            }
            .filter(|t| t.fits(headers, said))
        });
        let Some(template) = template else {
            return false;
        };
        let mut map = template.map.clone();
        let mut map_values = map.values_mut();
        // The service's values first, in order: `fits` checked the names. (`headers` first in
        // the zip, so that its end does not take one more of the map's values.)
        for ((_, own), value) in std::mem::take(headers).into_iter().zip(map_values.by_ref()) {
            *value = own;
        }
        let numbers = said.numbers();
        for (value, &slot) in map_values.zip(template.slots.iter()) {
            let slot = usize::from(slot);
            if kind(slot) != Kind::Fixed {
                *value = numbers.value(said, slot);
            }
        }
        *headers = map;
        true
    }

    /// The template for responses saying what `said` says on service headers named as `headers`;
    /// `None` when they repeat a name or have one of the rate-limit headers'.
    fn template(
        &self,
        headers: &HeaderMap,
        values: &ModelHeaders,
        pool: PoolRef,
        said: &HeaderNumbers,
    ) -> Option<Template> {
        // Checked before anything is built: while a cell is free, every response no template fits
        // comes here. Names are compared, not hashed.
        if headers.len() != headers.keys_len() || headers.keys().any(|k| SLOT_NAMES.contains(k)) {
            return None;
        }
        let service: Box<[HeaderName]> = headers.keys().cloned().collect();
        let mut map = HeaderMap::with_capacity(service.len() + said.count());
        for name in service.iter() {
            map.insert(name.clone(), HeaderValue::from_static(""));
        }
        self.write_each(&mut map, values, pool, said);
        // Every response sets its own values: static placeholders clone and drop for free.
        let mut slots = Vec::with_capacity(said.count());
        for (i, (name, value)) in map.iter_mut().enumerate() {
            match SLOT_NAMES.iter().position(|n| n == name) {
                Some(slot) if i >= service.len() => {
                    if kind(slot) != Kind::Fixed {
                        *value = HeaderValue::from_static("0");
                    }
                    slots.push(slot as u8);
                }
                // The map is not in the order it was built in: no template.
                _ if i >= service.len() || service[i] != name => return None,
                _ => {}
            }
        }
        Some(Template {
            map,
            service,
            slots: slots.into(),
            present: said.present,
        })
    }

    /// A slot's value: a fixed one from the config, or `said`'s number.
    fn value(
        &self,
        values: &ModelHeaders,
        pool: PoolRef,
        said: &HeaderNumbers,
        numbers: &Numbers,
        slot: usize,
    ) -> Option<HeaderValue> {
        if kind(slot) != Kind::Fixed {
            return Some(numbers.value(said, slot));
        }
        if slot == PRIORITY {
            return Some(
                self.labels
                    .get(self.label_index(pool))
                    .cloned()
                    .unwrap_or_else(|| priority_value(None)),
            );
        }
        let dimension = slot / PER_DIMENSION;
        let model = || values.model[dimension].clone();
        let pool = || {
            values
                .pools
                .get(pool_index(pool, values.pools.len()))
                .and_then(|p| p[dimension].clone())
        };
        match slot % PER_DIMENSION {
            MODEL_LIMIT => model(),
            POOL_LIMIT => pool(),
            _ if said.strict => pool(),
            _ => model(),
        }
    }

    /// Where `pool`'s label and templates are: named priorities in order, then the default.
    fn label_index(&self, pool: PoolRef) -> usize {
        match pool {
            PoolRef::Named(i) => usize::from(i),
            PoolRef::Default => self.labels.len() - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Reservation;
    use crate::decision::Usage;
    use proptest::prelude::*;

    /// Each name with its values in order, names sorted: what a client sees of a header map.
    fn seen(headers: &HeaderMap) -> Vec<(String, Vec<String>)> {
        let mut seen: Vec<_> = headers
            .keys()
            .map(|name| {
                let values = headers.get_all(name).iter();
                let values = values.map(|v| v.to_str().unwrap().to_owned()).collect();
                (name.as_str().to_owned(), values)
            })
            .collect();
        seen.sort();
        seen
    }

    fn config(rpm: Option<u64>, tpm: Option<u64>, reserve: bool) -> Option<LimiterConfig> {
        let mut model = ModelLimits::new("m");
        if let Some(rpm) = rpm {
            model = model.rpm(rpm);
        }
        if let Some(tpm) = tpm {
            model = model.tpm(tpm);
        }
        let mut builder = LimiterConfig::builder().model(model);
        if reserve {
            builder = builder
                .reserve("a", Reservation::Percent(0.5))
                .reserve("b", Reservation::Percent(0.2));
        }
        builder.build().ok()
    }

    fn admitted() -> impl Strategy<Value = Admitted> {
        let usage = (0u64..2_000, 0u64..2_000_000)
            .prop_map(|(requests, tokens)| Usage { requests, tokens });
        (
            any::<bool>(),
            usage.clone(),
            proptest::option::weighted(0.8, usage),
            0u64..200_000,
            0u64..200_000,
        )
            .prop_map(
                |(strict, model, pool, model_resets_in, pool_resets_in)| Admitted {
                    saturation: 0.5,
                    strict,
                    model,
                    pool,
                    model_resets_in,
                    pool_resets_in,
                    reserved: 0,
                    model_window: 0,
                    pool_window: 0,
                    shadow: None,
                    on_fallback: false,
                },
            )
    }

    /// A service's headers: usually one of two sets (a JSON answer's, a stream's), so templates
    /// are reused; else any names, some the limiter's, some repeated.
    fn service_headers() -> impl Strategy<Value = HeaderMap> {
        const NAMES: [&str; 7] = [
            "content-type",
            "x-litellm-model-id",
            "cache-control",
            "set-cookie",
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-tokens",
            "x-litellm-priority",
        ];
        let pairs = |names: &'static [usize]| {
            proptest::collection::vec(0u8..10, names.len())
                .prop_map(move |values| names.iter().copied().zip(values).collect::<Vec<_>>())
        };
        prop_oneof![
            pairs(&[0, 1]),
            pairs(&[0, 2, 1]),
            proptest::collection::vec((0..NAMES.len(), 0u8..10), 0..8),
        ]
        .prop_map(|pairs| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.append(NAMES[name], HeaderValue::from(u16::from(value)));
            }
            headers
        })
    }

    /// The headers as sent, in order.
    fn sent(headers: &HeaderMap) -> Vec<(String, String)> {
        let pairs = headers.iter();
        pairs
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    proptest! {
        /// Over configs with and without limits and reservations, both modes, each priority, and
        /// responses of several shapes one after another: a template writes exactly the headers,
        /// in the same order, that inserting each does; a response no template fits is left to the
        /// inserts, untouched.
        #[test]
        fn a_template_writes_what_inserting_each_header_does(
            limits in (proptest::option::of(1u64..5_000), proptest::option::of(1u64..5_000_000), any::<bool>()),
            pool in prop_oneof![Just(PoolRef::Named(0)), Just(PoolRef::Named(1)), Just(PoolRef::Default)],
            responses in proptest::collection::vec((admitted(), service_headers()), 1..6),
        ) {
            let Some(config) = config(limits.0, limits.1, limits.2) else {
                return Ok(());
            };
            let headers = AdmittedHeaders::new(&config);
            let model = ModelId(0);
            let values = &headers.models[0];
            let known = values.templates.get(headers.label_index(pool)).is_some();
            for (i, (a, service)) in responses.into_iter().enumerate() {
                let said = HeaderNumbers::of(config.model(model), pool, &a);
                let mut inserted = service.clone();
                headers.write_each(&mut inserted, values, pool, &said);
                let mut templated = service.clone();
                let fits = headers.write_from_template(&mut templated, values, pool, &said);
                let plain = service.len() == service.keys_len()
                    && !SLOT_NAMES.iter().any(|n| service.contains_key(n));
                prop_assert!(fits || !(known && plain && i == 0), "the first response builds a template that fits it");
                if fits {
                    prop_assert_eq!(sent(&templated), sent(&inserted));
                } else {
                    prop_assert_eq!(sent(&templated), sent(&service), "no template: untouched");
                }
                let mut written = service.clone();
                headers.write(&mut written, &config, model, pool, &a);
                prop_assert_eq!(seen(&written), seen(&inserted));
            }
        }
    }

    #[test]
    fn fixed_values_last_once_per_text() {
        let a = lasting(HeaderValue::from(1_000_u64));
        let b = lasting(HeaderValue::from(1_000_u64));
        assert_eq!(a, "1000");
        assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr(), "kept once");
        // A UTF-8 label is a valid value but not a static one: it stays as it is.
        let label = priority_value(Some("équipe"));
        assert_eq!(lasting(label.clone()), label);
    }

    #[test]
    fn a_response_that_cannot_make_a_template_takes_no_cell() {
        let config = config(Some(100), Some(10_000), false).unwrap();
        let headers = AdmittedHeaders::new(&config);
        let (model, pool) = (ModelId(0), PoolRef::Default);
        let a = Admitted {
            saturation: 0.1,
            strict: false,
            model: Usage {
                requests: 1,
                tokens: 10,
            },
            pool: None,
            model_resets_in: 1_000,
            pool_resets_in: 1_000,
            reserved: 0,
            model_window: 0,
            pool_window: 0,
            shadow: None,
            on_fallback: false,
        };
        let said = HeaderNumbers::of(config.model(model), pool, &a);
        let values = &headers.models[0];
        let odd = |name: &'static str| {
            let mut h = HeaderMap::new();
            h.append(name, HeaderValue::from_static("a"));
            h.append(name, HeaderValue::from_static("b"));
            h
        };
        // Two odd responses first (a repeated name): neither takes a cell.
        for name in ["set-cookie", "x-ratelimit-limit-requests"] {
            let mut service = odd(name);
            assert!(!headers.write_from_template(&mut service, values, pool, &said));
        }
        // So both cells are left for the usual kinds.
        for name in ["content-type", "cache-control"] {
            let mut service = HeaderMap::new();
            service.insert(name, HeaderValue::from_static("x"));
            assert!(headers.write_from_template(&mut service, values, pool, &said));
            assert_eq!(service[name], "x");
            assert_eq!(service["x-ratelimit-remaining-requests"], "99");
        }
    }

    #[test]
    fn counts_share_one_text() {
        let mut text = CountText {
            bytes: [0; COUNT_TEXT],
            len: 0,
        };
        for n in [
            0,
            9,
            10,
            1_234_567,
            u64::MAX,
            u64::MAX,
            u64::MAX,
            u64::MAX,
            u64::MAX,
        ] {
            text.push_decimal(n);
        }
        let max = u64::MAX.to_string().repeat(5);
        assert_eq!(text.as_ref(), format!("0910{}{max}", 1_234_567).as_bytes());
    }

    #[test]
    fn each_kind_of_response_gets_a_template_until_they_are_taken() {
        let config = config(Some(100), Some(10_000), true).unwrap();
        let headers = AdmittedHeaders::new(&config);
        let model = ModelId(0);
        let pool = PoolRef::Named(0);
        let with_pool = Admitted {
            saturation: 0.9,
            strict: true,
            model: Usage {
                requests: 10,
                tokens: 900,
            },
            pool: Some(Usage {
                requests: 4,
                tokens: 400,
            }),
            model_resets_in: 30_500,
            pool_resets_in: 12_000,
            reserved: 0,
            model_window: 0,
            pool_window: 0,
            shadow: None,
            on_fallback: false,
        };
        let mut first = HeaderMap::new();
        headers.write(&mut first, &config, model, pool, &with_pool);
        assert_eq!(
            first["x-ratelimit-limit-requests"], "50",
            "the pool's, strict"
        );
        assert_eq!(first["x-ratelimit-remaining-requests"], "46");
        assert_eq!(first["x-ratelimit-reset-requests"], "12s");
        assert_eq!(first["x-litellm-priority"], "a");
        // The same key without the pool's usage: fewer headers than the first template has, so
        // the second is built for it.
        let without_pool = Admitted {
            pool: None,
            ..with_pool
        };
        let values = &headers.models[0];
        let said = HeaderNumbers::of(config.model(model), pool, &without_pool);
        let mut second = HeaderMap::new();
        assert!(headers.write_from_template(&mut second, values, pool, &said));
        assert!(second
            .get("x-ratelimit-priority_model-limit-requests")
            .is_none());
        assert!(
            second.get("x-ratelimit-limit-requests").is_none(),
            "strict needs the pool's use"
        );
        assert_eq!(
            second["x-ratelimit-model_saturation_check-remaining-requests"],
            "90"
        );
        // A third kind of response: both templates are taken, so it is written header by header.
        let said = HeaderNumbers::of(config.model(model), pool, &with_pool);
        let mut third = HeaderMap::new();
        third.insert("content-type", HeaderValue::from_static("text/plain"));
        assert!(!headers.write_from_template(&mut third, values, pool, &said));
        headers.write(&mut third, &config, model, pool, &with_pool);
        assert_eq!(third["x-ratelimit-remaining-requests"], "46");
        assert_eq!(third["content-type"], "text/plain");
    }
}
