//! Replays an allocation trace through `MemoryPool<SimulatedBackend>` with a history
//! recorder attached and writes the self-contained HTML report of what happened, or PyTorch's
//! memory snapshot pickle of it, or both.
//!
//! ```text
//! cargo run -p cudars-mempool --release --example memviz -- TRACE [--out FILE.html] [--torch-snapshot FILE.pickle]
//! ```
//!
//! (`cargo xtask memviz TRACE ...` runs this.) Prints the trace's peaks and the files'
//! sizes; the report opens offline in any browser, the pickle in PyTorch's memory viewer
//! (`python3 -m torch.cuda._memory_viz trace_plot FILE.pickle -o FILE.html`, or
//! pytorch.org/memory_viz).

mod common;
use common::println;

use std::sync::Arc;

use cudars_mempool::history::{report, torch, Clock, Recorder};
use cudars_mempool::replay::{load_trace, replay_recorded, ReplayOptions};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut trace_path, mut out, mut pickle) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" | "-o" => out = it.next().cloned(),
            "--torch-snapshot" => pickle = it.next().cloned(),
            _ if trace_path.is_none() => trace_path = Some(a.clone()),
            _ => {
                eprintln!("memviz: unexpected argument {a:?}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let Some(trace_path) = trace_path.filter(|_| out.is_some() || pickle.is_some()) else {
        eprintln!("usage: memviz TRACE [--out FILE.html] [--torch-snapshot FILE.pickle]");
        return std::process::ExitCode::from(2);
    };
    match run(&trace_path, out.as_deref(), pickle.as_deref()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memviz: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(
    trace_path: &str,
    out: Option<&str>,
    pickle: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let trace = load_trace(trace_path)?;
    // Room for every event of the traces we have (a malloc, a free and a few backend calls
    // per operation); a longer trace keeps its newest events and says how many it dropped.
    let recorder = Arc::new(Recorder::new(1 << 23, Clock::Virtual));
    let result = replay_recorded(&trace, &ReplayOptions::default(), &recorder);
    let history = recorder.history();
    let snapshot = history.snapshot();
    let title = format!(
        "memory history of trace {} (simulated H200, default pool)",
        trace.name
    );
    let page = report::html(
        &history,
        &snapshot,
        &report::ReportOptions {
            title,
            ..report::ReportOptions::default()
        },
    );
    let mut written = Vec::new();
    if let Some(out) = out {
        std::fs::write(out, &page).map_err(|e| format!("{out}: {e}"))?;
        written.push(format!("{out} ({} bytes)", page.len()));
    }
    if let Some(pickle) = pickle {
        let bytes = torch::torch_snapshot(&history, &snapshot);
        std::fs::write(pickle, &bytes).map_err(|e| format!("{pickle}: {e}"))?;
        written.push(format!("{pickle} ({} bytes)", bytes.len()));
    }
    let written = written.join(", ");
    match result {
        Ok((r, _)) => println!(
            "{}: {} ops, peak requested {}, peak reserved {}, {} events -> {}",
            r.name,
            r.ops,
            r.peak_requested,
            r.peak_reserved,
            history.events.len(),
            written
        ),
        // The report of a failed replay still shows the history up to the failure.
        Err(e) => println!(
            "{}: replay failed ({e}); {} events -> {}",
            trace.name,
            history.events.len(),
            written
        ),
    }
    Ok(())
}
