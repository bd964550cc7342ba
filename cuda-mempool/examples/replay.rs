//! Replays allocation traces through `MemoryPool<SimulatedBackend>` and prints, per
//! trace: name, operations, peak requested, peak reserved, their ratio and ns/op.
//!
//! ```text
//! cargo run -p cudars-mempool --release --example replay -- traces/*.trace
//! cargo run -p cudars-mempool --release --example replay -- --all-rules TRACE...
//! ```
//!
//! The default fence rule is `never-sync` (no forced synchronisation, as the GPU replay);
//! `--all-rules` also prints the figures under the rules that synchronise, each rule
//! again with cross-stream stealing off (`PoolConfig::steal_before_growing = false`), and
//! the default rule on a simulated device that completes work at once (`keeps-up`, as the
//! GPU replay's device does). `moved`: pages the pool unmapped from free memory to map
//! elsewhere (`Stats::pages_moved`).

mod common;
use common::println;

use cudars_mempool::replay::{load_trace, replay, FenceRule, ReplayOptions};

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
        // the repository's traces/.
        let dir = std::env::var_os("CUDA_RS_TRACES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces"));
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
        &FenceRule::ALL
    } else {
        &[FenceRule::Never]
    };
    println!(
        "{:<14} {:<26} {:>8} {:>16} {:>16} {:>7} {:>8} {:>7}",
        "trace", "fence rule", "ops", "peak requested", "peak reserved", "ratio", "ns/op", "moved"
    );
    let mut failed = false;
    let steal_modes: &[bool] = if all_rules { &[true, false] } else { &[true] };
    for path in &paths {
        let trace = match load_trace(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}");
                failed = true;
                continue;
            }
        };
        let keeps_up: &[(FenceRule, bool, bool)] = if all_rules {
            &[(FenceRule::Never, true, true)]
        } else {
            &[]
        };
        for &(rule, steal, device_keeps_up) in rules
            .iter()
            .flat_map(|&r| steal_modes.iter().map(move |&s| (r, s, false)))
            .collect::<Vec<_>>()
            .iter()
            .chain(keeps_up)
        {
            let mut options = ReplayOptions {
                fence_rule: rule,
                device_keeps_up,
                ..ReplayOptions::default()
            };
            options.config.steal_before_growing = steal;
            let mut label = rule.to_string();
            if !steal {
                label.push_str(",no-steal");
            }
            if device_keeps_up {
                label.push_str(",keeps-up");
            }
            match replay(&trace, &options) {
                Ok(r) => println!(
                    "{:<14} {:<26} {:>8} {:>16} {:>16} {:>7.4} {:>8.1} {:>7}",
                    r.name,
                    label,
                    r.ops,
                    r.peak_requested,
                    r.peak_reserved,
                    r.ratio,
                    r.ns_per_op,
                    r.stats.pages_moved
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
