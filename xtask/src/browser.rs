//! The memory report in a real browser (issue 37): `cargo xtask ci` renders the HTML report
//! of a replayed trace in headless Chromium (Debian's package, which `.ci/run` installs),
//! keeps the screenshot (`target/memviz-screenshot.png`), and checks that the page drew its
//! timeline (enough coloured pixels where the plot is) and logged nothing to the console.
//! Without Chromium the step fails: it never passes without having looked.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{cargo, fail, root, Result};

/// The trace rendered: one of the two recorded PyTorch traces in the repository's `traces/`.
const TRACE: &str = "traces/multistream.trace";
/// The browser window (the report is about 1200 pixels wide).
const WIDTH: u32 = 1400;
const HEIGHT: u32 = 2400;

/// Whether headless Chromium is there (the reason when it is not).
pub fn chromium_found() -> Result<()> {
    chromium().map(|_| ())
}

fn chromium() -> Result<PathBuf> {
    let candidates = [
        std::env::var("CHROMIUM").unwrap_or_default(),
        "/usr/bin/chromium".into(),
        "/usr/bin/chromium-browser".into(),
    ];
    candidates
        .iter()
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "headless Chromium not found (/usr/bin/chromium or $CHROMIUM): `.ci/run` installs \
             Debian's chromium package; `apt-get install chromium` does it by hand"
                .to_string()
        })
}

/// Colour statistics of a screenshot: pixels whose channels differ by more than 40 (the
/// plot's fills; text and axes are grey), and pixels that are not near-white.
fn colour_counts(png: &Path) -> Result<(u64, u64, u64)> {
    let file = std::fs::File::open(png).map_err(|e| format!("{}: {e}", png.display()))?;
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("{}: not a PNG: {e}", png.display()))?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| format!("{}: {e}", png.display()))?;
    let channels = info.color_type.samples();
    if channels < 3 {
        return fail(&format!("{}: not an RGB screenshot", png.display()));
    }
    let (mut coloured, mut inked, mut total) = (0u64, 0u64, 0u64);
    for px in buf[..info.buffer_size()].chunks_exact(channels) {
        let (r, g, b) = (px[0], px[1], px[2]);
        let (max, min) = (r.max(g).max(b), r.min(g).min(b));
        total += 1;
        if max - min > 40 {
            coloured += 1;
        }
        if min < 235 {
            inked += 1;
        }
    }
    Ok((coloured, inked, total))
}

/// Renders the report of [`TRACE`] in headless Chromium and checks the screenshot and the
/// console; returns a line for the log.
pub fn ci_memviz_screenshot() -> Result<String> {
    let browser = chromium()?;
    let trace = root().join(TRACE);
    if !trace.is_file() {
        return fail(&format!(
            "{} is required for the report check",
            trace.display()
        ));
    }
    let out = root().join("target/memviz-check");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let page = out.join("report.html");
    let trace_s = trace.to_string_lossy().into_owned();
    let page_s = page.to_string_lossy().into_owned();
    cargo(
        &[
            "run",
            "-q",
            "-p",
            "cudars-mempool",
            "--example",
            "memviz",
            "--",
            &trace_s,
            "--out",
            &page_s,
        ],
        &[],
    )?;
    let shot = root().join("target/memviz-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let profile = out.join("chromium-profile");
    let output = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={WIDTH},{HEIGHT}"))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .map_err(|e| format!("{}: {e}", browser.display()))?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || !shot.is_file() {
        return fail(&format!(
            "Chromium took no screenshot ({}):\n{log}",
            output.status
        ));
    }
    // Console messages (console.log / console.error and uncaught exceptions) come on stderr as
    // "CONSOLE(line)" entries: the report writes none.
    let console: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .collect();
    if !console.is_empty() {
        return fail(&format!(
            "the report wrote to the browser console:\n{}",
            console.join("\n")
        ));
    }
    let (coloured, inked, total) = colour_counts(&shot)?;
    // The stacked timeline alone covers far more than 2% of the window with colour; a page
    // that failed to draw it is white and grey.
    if coloured * 50 < total {
        return fail(&format!(
            "the screenshot shows no timeline: {coloured} coloured pixels of {total} \
             ({inked} not white) in {}",
            shot.display()
        ));
    }
    Ok(format!(
        "xtask: {} rendered the report of {}: {coloured} coloured pixels of {total} ({:.1}%), \
         no console output; screenshot in {}",
        browser.display(),
        trace
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        100.0 * coloured as f64 / total as f64,
        shot.display()
    ))
}
