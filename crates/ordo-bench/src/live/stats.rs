//! The process clock, seeded random numbers and the latency histogram.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The one clock of the process: writers stamp updates with it and subscribers
/// read it on arrival, so latency needs no clock synchronisation.
#[derive(Clone, Copy)]
pub struct Clock {
    pub origin: Instant,
}

impl Clock {
    pub fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }
}

/// xorshift64: a fixed seed gives the same update stream on every run.
pub struct XorShift64 {
    pub state: u64,
}

impl XorShift64 {
    pub fn new(seed: u64) -> XorShift64 {
        // Zero is xorshift's one fixed point; mix the seed so that small seeds differ a lot.
        let state = (seed ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        XorShift64 { state: if state == 0 { 0x2545_F491_4F6C_DD1D } else { state } }
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    /// Uniform in `0..bound` (multiply-shift: no modulo bias worth the name at these bounds).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }
}

/// Log-linear histogram of microsecond values: exact below 256 µs, then 128
/// buckets per power of two (under 0.8 % relative error). Fixed size whatever
/// the number of samples, and shared by all subscribers through atomics.
pub struct Histogram {
    pub counts: Vec<AtomicU64>,
    pub n_samples: AtomicU64,
    pub max: AtomicU64,
}

pub const HISTOGRAM_SUB_BUCKET_BITS: u32 = 7;
pub const HISTOGRAM_SUB_BUCKETS: u64 = 1 << HISTOGRAM_SUB_BUCKET_BITS;
/// The highest bucket is `u64::MAX`'s: shift 56, mantissa 255, so index 56 × 128 + 255.
pub const HISTOGRAM_BUCKETS: usize = (64 - HISTOGRAM_SUB_BUCKET_BITS as usize + 1) * HISTOGRAM_SUB_BUCKETS as usize;
const _: () = assert!(HISTOGRAM_BUCKETS == 56 * 128 + 255 + 1);

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: (0..HISTOGRAM_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            n_samples: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    pub fn bucket_of(value: u64) -> usize {
        if value < 2 * HISTOGRAM_SUB_BUCKETS {
            return value as usize;
        }
        let shift = (63 - value.leading_zeros()) - HISTOGRAM_SUB_BUCKET_BITS;
        (shift as u64 * HISTOGRAM_SUB_BUCKETS + (value >> shift)) as usize
    }

    /// The middle of the bucket's range of values.
    pub fn value_of(bucket: usize) -> u64 {
        let bucket = bucket as u64;
        if bucket < 2 * HISTOGRAM_SUB_BUCKETS {
            return bucket;
        }
        let shift = bucket / HISTOGRAM_SUB_BUCKETS - 1;
        let mantissa = bucket - shift * HISTOGRAM_SUB_BUCKETS;
        (mantissa << shift) + ((1u64 << shift) >> 1)
    }

    pub fn record(&self, value: u64) {
        self.counts[Self::bucket_of(value)].fetch_add(1, Ordering::Relaxed);
        self.n_samples.fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(value, Ordering::Relaxed);
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> u64 {
        self.n_samples.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The value below which a `quantile` of the samples fall; 0 without samples.
    pub fn quantile(&self, quantile: f64) -> u64 {
        let n_samples = self.len();
        if n_samples == 0 {
            return 0;
        }
        let rank = ((quantile * n_samples as f64).ceil() as u64).clamp(1, n_samples);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count.load(Ordering::Relaxed);
            if seen >= rank {
                return Self::value_of(bucket).min(self.max());
            }
        }
        self.max()
    }
}

pub fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

pub fn megabytes(bytes: f64) -> String {
    format!("{:.2} MB", bytes / 1e6)
}
