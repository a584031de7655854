//! [`AtomicHistogram`]: a Prometheus histogram of durations that records with atomics only.
//! (`prometheus-client`'s own takes a write lock per observation, which would put one shared lock
//! on every request.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Durations counted in fixed buckets: an observation is two relaxed atomic adds. Clones share
/// the counts.
#[derive(Debug, Clone)]
pub struct AtomicHistogram(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Upper bounds in seconds, ascending; `+Inf` is implied after them.
    bounds: Box<[f64]>,
    /// Per bucket (the last is `+Inf`), not cumulative.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with `start`, `start × factor`, … (`length` bounds), in seconds.
    pub fn exponential(start: f64, factor: f64, length: u16) -> Self {
        let bounds: Box<[f64]> = (0..length as i32).map(|i| start * factor.powi(i)).collect();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(Inner {
            bounds,
            counts,
            sum_nanos: AtomicU64::new(0),
        }))
    }

    /// Counts one duration.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = self.0.bounds.partition_point(|bound| *bound < seconds);
        self.0.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let inner = &self.0;
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain([f64::MAX]) // the encoder writes f64::MAX as +Inf
            .zip(inner.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_encode_cumulatively() {
        let h = AtomicHistogram::exponential(0.001, 10.0, 3); // 1 ms, 10 ms, 100 ms, +Inf
        for ms in [0, 1, 5, 50, 5000] {
            h.observe(Duration::from_millis(ms));
        }
        assert_eq!(h.count(), 5);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("d", "durations", h.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "d_sum 5.056",
            "d_count 5",
            r#"d_bucket{le="0.001"} 2"#,
            r#"d_bucket{le="0.01"} 3"#,
            r#"d_bucket{le="0.1"} 4"#,
            r#"d_bucket{le="+Inf"} 5"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
