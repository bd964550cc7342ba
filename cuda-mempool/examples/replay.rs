//! Replays allocation traces through `MemoryPool<SimulatedBackend>` and prints, per
//! trace: name, operations, peak requested, peak reserved, their ratio and ns/op.
//!
//! ```text
//! cargo run -p cudars-mempool --release --example replay -- /work/shared/traces/*.trace
//! cargo run -p cudars-mempool --release --example replay -- --all-rules TRACE...
//! ```
//!
//! `--all-rules` also prints the figures under the stricter fence rules.

mod common;
use common::println;

use cuda_mempool::replay::{load_trace, replay, FenceRule, ReplayOptions};

fn main() -> std::process::ExitCode {
    let mut all_rules = false;
    let mut paths = Vec::new();
    for arg in std::env::args().skip(1) {
        if arg == "--all-rules" {
            all_rules = true;
        } else {
            paths.push(arg);
        }
    }
    if paths.is_empty() {
        // No arguments: the traces in $CUDA_RS_TRACES (set by the GPU bundle's run.sh), else
        // the steering repo's shared/traces beside the checkout.
        let dir = std::env::var_os("CUDA_RS_TRACES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces")
            });
        if let Ok(entries) = std::fs::read_dir(&dir) {
            paths = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "trace"))
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            paths.sort();
        }
    }
    if paths.is_empty() {
        eprintln!(
            "usage: replay [--all-rules] TRACE...  (no traces given or found in $CUDA_RS_TRACES)"
        );
        return std::process::ExitCode::FAILURE;
    }
    let rules: &[FenceRule] = if all_rules {
        &[
            FenceRule::SynchronizeBeforeEachAllocation,
            FenceRule::SynchronizeEvery(64),
            FenceRule::Never,
        ]
    } else {
        &[FenceRule::SynchronizeBeforeEachAllocation]
    };
    println!(
        "{:<14} {:<18} {:>8} {:>16} {:>16} {:>7} {:>8}",
        "trace", "fence rule", "ops", "peak requested", "peak reserved", "ratio", "ns/op"
    );
    let mut failed = false;
    for path in &paths {
        let trace = match load_trace(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}");
                failed = true;
                continue;
            }
        };
        for &rule in rules {
            let options = ReplayOptions {
                fence_rule: rule,
                ..ReplayOptions::default()
            };
            match replay(&trace, &options) {
                Ok(r) => println!(
                    "{:<14} {:<18} {:>8} {:>16} {:>16} {:>7.4} {:>8.1}",
                    r.name,
                    r.fence_rule.to_string(),
                    r.ops,
                    r.peak_requested,
                    r.peak_reserved,
                    r.ratio,
                    r.ns_per_op
                ),
                Err(e) => {
                    eprintln!("{}: {e}", trace.name);
                    failed = true;
                }
            }
        }
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
