//! Shared plumbing of the GPU benchmark binaries: timing helpers and one row format.
//!
//! Every benchmark prints `scenario | ours | raw | ratio | target | met` lines and, when
//! `BENCH_OUT` names a directory, appends the same rows to `$BENCH_OUT/results.csv`, which
//! `cargo xtask bench-report` joins with the peers' figures (`peers.csv`, written by
//! `peers.py` from CuPy and PyTorch in the same run).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::fs::OpenOptions;
use std::io::Write;
use std::time::Instant;

/// What a row must reach.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// `ours <= x` in the row's unit.
    AtMost(f64),
    /// `ours >= x` in the row's unit.
    AtLeast(f64),
    /// `ours / raw <= x`.
    RatioAtMost(f64),
    /// `ours / raw >= x`.
    RatioAtLeast(f64),
    /// Reported for context, no target.
    None,
}

impl Target {
    fn describe(self, unit: &str) -> String {
        match self {
            Target::AtMost(x) => format!("<= {} {unit}", short(x)),
            Target::AtLeast(x) => format!(">= {} {unit}", short(x)),
            Target::RatioAtMost(x) => format!("ratio <= {x}"),
            Target::RatioAtLeast(x) => format!("ratio >= {x}"),
            Target::None => "-".into(),
        }
    }

    fn met(self, ours: f64, raw: Option<f64>) -> Option<bool> {
        let ratio = raw.filter(|r| *r != 0.0).map(|r| ours / r);
        match self {
            Target::AtMost(x) => Some(ours <= x),
            Target::AtLeast(x) => Some(ours >= x),
            Target::RatioAtMost(x) => ratio.map(|r| r <= x),
            Target::RatioAtLeast(x) => ratio.map(|r| r >= x),
            Target::None => None,
        }
    }
}

/// `x` with at most three decimals and no trailing zeros.
fn short(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One benchmark's rows.
pub struct Report {
    bench: &'static str,
    header_printed: bool,
}

impl Report {
    /// Rows of the benchmark binary `bench`.
    pub fn new(bench: &'static str) -> Report {
        Report {
            bench,
            header_printed: false,
        }
    }

    /// Prints one row and appends it to `$BENCH_OUT/results.csv` when set. `raw_label` says
    /// what the raw column is (`cuMemAllocAsync`, `cuMemcpyHtoD`, `direct issue`, ...).
    pub fn row(
        &mut self,
        scenario: &str,
        unit: &str,
        ours: f64,
        raw: Option<f64>,
        raw_label: &str,
        target: Target,
    ) {
        if !self.header_printed {
            println!(
                "{:<34} | {:>12} | {:>12} | {:>7} | {:<16} | {:<18} | met",
                "scenario", "ours", "raw", "ratio", "raw is", "target"
            );
            self.header_printed = true;
        }
        let ratio = raw.filter(|r| *r != 0.0).map(|r| ours / r);
        let met = target.met(ours, raw);
        let fmt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
        let met_s = match met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:<34} | {:>12} | {:>12} | {:>7} | {:<16} | {:<18} | {met_s}",
            scenario,
            format!("{ours:.3} {unit}"),
            raw.map(|r| format!("{r:.3} {unit}"))
                .unwrap_or_else(|| "-".into()),
            fmt(ratio),
            raw_label,
            target.describe(unit),
        );
        if let Some(dir) = std::env::var_os("BENCH_OUT") {
            let path = std::path::Path::new(&dir).join("results.csv");
            let new = !path.exists();
            if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(&path) {
                if new {
                    let _ = writeln!(f, "bench,scenario,unit,ours,raw,raw_label,ratio,target,met");
                }
                let _ = writeln!(
                    f,
                    "{},{},{},{},{},{},{},{},{}",
                    self.bench,
                    scenario.replace(',', ";"),
                    unit,
                    ours,
                    raw.map(|r| r.to_string()).unwrap_or_default(),
                    raw_label.replace(',', ";"),
                    ratio.map(|r| r.to_string()).unwrap_or_default(),
                    target.describe(unit).replace(',', ";"),
                    met_s
                );
            }
        }
    }
}

/// Median of `samples` (sorted in place); 0 for none.
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Nanoseconds per call of `f`: `warmup` calls, then the median over `batches` batches of
/// `per_batch` calls each, timed with the host clock (for host-side costs: issue, pool pairs).
pub fn ns_per_call(warmup: usize, batches: usize, per_batch: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let mut samples: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / per_batch as f64
        })
        .collect();
    median(&mut samples)
}
