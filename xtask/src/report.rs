//! `cargo xtask bench-report DIR`: turns what the benchmark binaries (`results.csv`) and the
//! peers script (`peers.csv`) wrote in one run into `bench/results/REPORT.md` and SVG plots.
//!
//! Kept by hand: the CSV files are written by our own benchmarks and `peers.py` with fields
//! that hold no commas or quotes, so splitting lines is exact (the `csv` crate would add
//! nothing); the plots are a few lines of SVG text, where a plotting crate would add dozens of
//! dependencies to every `cargo xtask` build.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use crate::util::{fail, root, Result};

/// The peer name of peers.py's trace replays under `expandable_segments:True`.
const EXPANDABLE: &str = "PyTorch-expandable";

struct Ours {
    bench: String,
    unit: String,
    ours: String,
    raw: String,
    raw_label: String,
    target: String,
    met: String,
}

/// The `met` value of a row whose difference to its target is inside the measured spread
/// (the workload benchmark, `tests/bundle/workload_bench.py`, compares medians of several runs
/// and gives a verdict only where the difference exceeds the interquartile range).
const SPREAD: &str = "within spread";

pub fn bench_report(dir: &Path) -> Result<()> {
    let results = fs::read_to_string(dir.join("results.csv"))
        .map_err(|e| format!("{}/results.csv: {e}", dir.display()))?;
    let peers = fs::read_to_string(dir.join("peers.csv")).unwrap_or_default();
    let meta = fs::read_to_string(dir.join("meta.txt")).unwrap_or_default();
    let mut meta_lines = meta.lines();
    let date = meta_lines.next().unwrap_or("unknown date").to_string();
    let gpu = meta_lines.next().unwrap_or("unknown GPU").to_string();

    let mut ours: BTreeMap<String, Ours> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for line in results.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 9 {
            continue;
        }
        if !ours.contains_key(f[1]) {
            order.push(f[1].to_string());
        }
        ours.insert(
            f[1].to_string(),
            Ours {
                bench: f[0].into(),
                unit: f[2].into(),
                ours: f[3].into(),
                raw: f[4].into(),
                raw_label: f[5].into(),
                target: f[7].into(),
                met: f[8].into(),
            },
        );
    }
    let mut peer: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for line in peers.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 4 {
            continue;
        }
        let key = canonical(f[0]);
        if !order.iter().any(|s| canonical(s) == key) {
            order.push(f[0].to_string());
        }
        peer.insert(
            (key, f[1].to_string()),
            (f[2].to_string(), f[3].to_string()),
        );
    }
    if order.is_empty() {
        return fail("no rows in results.csv");
    }

    let num = |s: &str| s.parse::<f64>().ok();
    let show = |s: &str, unit: &str| {
        num(s)
            .map(|v| format!("{} {unit}", sig(v)))
            .unwrap_or_else(|| "-".into())
    };
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmark report\n");
    let _ = writeln!(md, "Run: {date} on {gpu}. Produced by `bash target/gpu-bundle/run.sh bench` on the GPU machine and");
    let _ = writeln!(md, "`cargo xtask bench-report <dir>` here; targets from BRIEF section 6. Each row's figures come from");
    let _ = writeln!(
        md,
        "the same run. `raw` is the raw driver call named in the `raw is` column.\n"
    );
    // PyTorch with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (peers.py's trace
    // replays, peer "PyTorch-expandable"): a column of its own when the run has it.
    let expandable = peer.keys().any(|(_, who)| who == EXPANDABLE);
    let _ = writeln!(
        md,
        "| scenario | ours | raw driver | raw is | CuPy | PyTorch |{} target | met |",
        if expandable {
            " PyTorch expandable |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | --- | ---: | ---: |{} --- | --- |",
        if expandable { " ---: |" } else { "" }
    );
    let (mut n_met, mut n_missed, mut n_spread, mut n_none) = (0, 0, 0, 0);
    for scenario in &order {
        let p = |who: &str| {
            peer.get(&(canonical(scenario), who.to_string()))
                .map(|(v, u)| show(v, u))
                .unwrap_or_else(|| "-".into())
        };
        let torch = if expandable {
            format!("{} | {}", p("PyTorch"), p(EXPANDABLE))
        } else {
            p("PyTorch")
        };
        match ours.get(scenario) {
            Some(o) => {
                match o.met.as_str() {
                    "yes" => n_met += 1,
                    "NO" => n_missed += 1,
                    SPREAD => n_spread += 1,
                    _ => n_none += 1,
                }
                let met = match o.met.as_str() {
                    "yes" => "yes",
                    "NO" => "**missed**",
                    SPREAD => SPREAD,
                    _ => "-",
                };
                let _ = writeln!(
                    md,
                    "| {scenario} ({}) | {} | {} | {} | {} | {} | {} | {met} |",
                    o.bench,
                    show(&o.ours, &o.unit),
                    show(&o.raw, &o.unit),
                    if o.raw.is_empty() { "-" } else { &o.raw_label },
                    p("CuPy"),
                    torch,
                    o.target
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "| {scenario} (peers only) | not measured | - | - | {} | {} | - | - |",
                    p("CuPy"),
                    torch
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\nTargets met: {n_met}; missed: {n_missed}; {SPREAD} (the runs' spread is larger than the \
         difference to the target, so they cannot tell): {n_spread}; rows without a target: {n_none}.\n"
    );

    let out = root().join("bench/results");
    fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    // Plots: bandwidth against size, pool pairs per second against threads.
    for dir_name in ["h2d", "d2h"] {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for scenario in &order {
            let Some(rest) = scenario.strip_prefix(&format!("{dir_name}_")) else {
                continue;
            };
            let Some((kind, size)) = rest.rsplit_once('_') else {
                continue;
            };
            let Some(bytes) = parse_size(size) else {
                continue;
            };
            if let Some(o) = ours.get(scenario) {
                if let Some(v) = num(&o.ours) {
                    series
                        .entry(format!("ours {kind}"))
                        .or_default()
                        .push((bytes, v));
                }
                if let Some(v) = num(&o.raw) {
                    series
                        .entry(format!("raw {kind}"))
                        .or_default()
                        .push((bytes, v));
                }
            }
            for who in ["CuPy", "PyTorch"] {
                if let Some(v) = peer
                    .get(&(scenario.clone(), who.to_string()))
                    .and_then(|(v, _)| num(v))
                {
                    series
                        .entry(format!("{who} {kind}"))
                        .or_default()
                        .push((bytes, v));
                }
            }
        }
        if !series.is_empty() {
            let svg = line_plot(
                &format!("{} bandwidth", dir_name.to_uppercase()),
                "bytes",
                "GB/s",
                &series,
                true,
            );
            fs::write(out.join(format!("{dir_name}_bandwidth.svg")), svg)
                .map_err(|e| e.to_string())?;
            let _ = writeln!(md, "![{dir_name} bandwidth]({dir_name}_bandwidth.svg)\n");
        }
    }
    let mut scaling: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for scenario in &order {
        let Some(t) = scenario
            .strip_prefix("pool_scaling_")
            .and_then(|s| s.strip_suffix('t'))
        else {
            continue;
        };
        let (Ok(threads), Some(o)) = (t.parse::<f64>(), ours.get(scenario)) else {
            continue;
        };
        if let Some(v) = num(&o.ours) {
            scaling
                .entry("MemoryPool".into())
                .or_default()
                .push((threads, v));
        }
        if let Some(v) = num(&o.raw) {
            scaling
                .entry(o.raw_label.clone())
                .or_default()
                .push((threads, v));
        }
    }
    if !scaling.is_empty() {
        let unit = order
            .iter()
            .find_map(|s| {
                s.starts_with("pool_scaling_")
                    .then(|| ours.get(s))
                    .flatten()
            })
            .map(|o| o.unit.clone());
        let svg = line_plot(
            "Pool scaling",
            "threads",
            &unit.unwrap_or_default(),
            &scaling,
            false,
        );
        fs::write(out.join("pool_scaling.svg"), svg).map_err(|e| e.to_string())?;
        let _ = writeln!(md, "![pool scaling](pool_scaling.svg)\n");
    }
    nccl_plot(&ours, &order, &out, &mut md)?;
    // Hand-written explanations of the misses, kept beside the generated report.
    if let Ok(notes) = fs::read_to_string(root().join("bench/NOTES.md")) {
        md.push('\n');
        md.push_str(&notes);
    }
    fs::write(out.join("REPORT.md"), &md).map_err(|e| e.to_string())?;
    fs::copy(dir.join("results.csv"), out.join("results.csv")).map_err(|e| e.to_string())?;
    if !peers.is_empty() {
        fs::write(out.join("peers.csv"), &peers).map_err(|e| e.to_string())?;
    }
    print!("{md}");
    println!("xtask: wrote {}", out.join("REPORT.md").display());
    Ok(())
}

/// The key that joins our rows with the peers': lower case, units glued to their number,
/// words joined by `_`, plus the few scenarios the two sides name differently.
/// bench_nccl's rows (`nccl all_reduce <n>gpu <size> busbw`): bus bandwidth against size, ours
/// and torch.distributed's, one line each per GPU count.
fn nccl_plot(
    ours: &BTreeMap<String, Ours>,
    order: &[String],
    out: &Path,
    md: &mut String,
) -> Result<()> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for scenario in order {
        let Some(rest) = scenario
            .strip_prefix("nccl all_reduce ")
            .and_then(|r| r.strip_suffix(" busbw"))
        else {
            continue;
        };
        let Some((gpus, size)) = rest.split_once(' ') else {
            continue;
        };
        let (Some(bytes), Some(o)) = (parse_size(&size.replace(' ', "")), ours.get(scenario))
        else {
            continue;
        };
        let gpus = gpus.trim_end_matches("gpu");
        if let Ok(v) = o.ours.parse::<f64>() {
            series
                .entry(format!("ours {gpus} GPUs"))
                .or_default()
                .push((bytes, v));
        }
        if let Ok(v) = o.raw.parse::<f64>() {
            series
                .entry(format!("torch {gpus} GPUs"))
                .or_default()
                .push((bytes, v));
        }
    }
    if series.is_empty() {
        return Ok(());
    }
    let svg = line_plot(
        "NCCL all_reduce bus bandwidth",
        "bytes",
        "GB/s",
        &series,
        true,
    );
    fs::write(out.join("nccl_all_reduce_busbw.svg"), svg).map_err(|e| e.to_string())?;
    let _ = writeln!(
        md,
        "![NCCL all_reduce bus bandwidth](nccl_all_reduce_busbw.svg)\n"
    );
    Ok(())
}

fn canonical(scenario: &str) -> String {
    let mut s = scenario.to_lowercase();
    for unit in ["kib", "mib", "gib"] {
        s = s.replace(&format!(" {unit}"), unit);
    }
    let s: String = s
        .split(|c: char| c.is_whitespace() || c == '+')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("_");
    match s.as_str() {
        "memset_issue_256_b" => "memset_issue".into(),
        "4kib_h2d_async_copy_issue" => "copy_4kib_issue".into(),
        "100_kernels_1_block:_end-to-end" => "graph_100_ops".into(),
        _ => s,
    }
}

fn sig(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// `512B`, `4KiB`, `64MiB`, `1GiB` -> bytes.
fn parse_size(s: &str) -> Option<f64> {
    let s = s.to_lowercase();
    let (n, mult) = if let Some(n) = s.strip_suffix("gib") {
        (n, 1u64 << 30)
    } else if let Some(n) = s.strip_suffix("mib") {
        (n, 1 << 20)
    } else if let Some(n) = s.strip_suffix("kib") {
        (n, 1 << 10)
    } else if let Some(n) = s.strip_suffix('b') {
        (n, 1)
    } else {
        return None;
    };
    n.parse::<f64>().ok().map(|v| v * mult as f64)
}

/// A small self-contained SVG line plot.
fn line_plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
    log_x: bool,
) -> String {
    const W: f64 = 760.0;
    const H: f64 = 440.0;
    const L: f64 = 70.0;
    const R: f64 = 190.0;
    const T: f64 = 40.0;
    const B: f64 = 50.0;
    const COLOURS: [&str; 8] = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    ];
    let fx = |x: f64| if log_x { x.max(1.0).log2() } else { x };
    let pts: Vec<(f64, f64)> = series
        .values()
        .flatten()
        .map(|&(x, y)| (fx(x), y))
        .collect();
    let (x0, x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = pts.iter().fold(0.0f64, |m, p| m.max(p.1)) * 1.1;
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let y1 = if y1 > 0.0 { y1 } else { 1.0 };
    let px = |x: f64| L + (fx(x) - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - y / y1 * (H - T - B);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{title}</text>"#,
        (W - R + L) / 2.0
    );
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        H - B,
        W - R,
        H - B
    );
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>"#,
        H - B
    );
    for i in 0..=5 {
        let y = y1 * i as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{0}" x2="{1}" y2="{0}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{4}</text>"##,
            py(y),
            W - R,
            L - 6.0,
            py(y) + 4.0,
            sig(y)
        );
    }
    let mut ticks: Vec<f64> = series.values().flatten().map(|p| p.0).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let label = if log_x { human_bytes(x) } else { sig(x) };
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{label}</text>"#,
            px(x),
            H - B + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        (W - R + L) / 2.0,
        H - 10.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{y_label}</text>"#,
        H / 2.0,
        H / 2.0
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut points = points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &(x, y) in &points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = T + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="14" height="4" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            W - R + 14.0,
            ly,
            W - R + 34.0,
            ly + 6.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn human_bytes(b: f64) -> String {
    let b = b as u64;
    if b >= 1 << 30 {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_names_and_the_peers_names_meet_on_one_key() {
        assert_eq!(
            canonical("H2D pageable 64 MiB"),
            canonical("h2d_pageable_64MiB")
        );
        assert_eq!(canonical("event record+query"), "event_record_query");
        assert_eq!(canonical("4 KiB H2D async copy issue"), "copy_4kib_issue");
        assert_ne!(
            canonical("H2D pinned 64 MiB"),
            canonical("h2d_pageable_64MiB")
        );
    }

    #[test]
    fn sizes_parse_in_either_case() {
        assert_eq!(parse_size("64MiB"), Some((64u64 << 20) as f64));
        assert_eq!(parse_size("1gib"), Some((1u64 << 30) as f64));
        assert_eq!(parse_size("512B"), Some(512.0));
        assert_eq!(parse_size("fast"), None);
    }

    #[test]
    fn a_plot_has_one_line_and_one_legend_entry_per_series() {
        let mut series = BTreeMap::new();
        series.insert(
            "ours pageable".to_string(),
            vec![(4096.0, 0.5), (1048576.0, 13.0)],
        );
        series.insert(
            "raw pageable".to_string(),
            vec![(4096.0, 0.5), (1048576.0, 11.0)],
        );
        let svg = line_plot("H2D", "bytes", "GB/s", &series, true);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains(">ours pageable<") && svg.contains(">raw pageable<"));
        assert!(
            svg.contains(">4K<") && svg.contains(">1M<"),
            "log-x tick labels"
        );
    }
}
