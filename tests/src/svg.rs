//! A small SVG line plot, dependency-free, for benchmark reports (bandwidth against size).
//!
//! ```ignore
//! let svg = line_plot(
//!     "H2D bandwidth",
//!     "bytes",
//!     "GB/s",
//!     &[("pinned".to_string(), vec![(4096.0, 3.1), (1048576.0, 50.2)])],
//!     true,
//! );
//! std::fs::write("h2d.svg", svg)?;
//! ```

use std::fmt::Write as _;

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// Line colours, in series order (repeats after the last).
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A number for an axis label: binary prefixes for powers of two from 1024 up (`4Ki`, `64Mi`,
/// `1Gi`), otherwise a short decimal.
fn tick_label(v: f64, binary: bool) -> String {
    if binary && v >= 1024.0 {
        for (div, suffix) in [
            (1u64 << 40, "Ti"),
            (1 << 30, "Gi"),
            (1 << 20, "Mi"),
            (1 << 10, "Ki"),
        ] {
            let d = div as f64;
            if v >= d {
                let q = v / d;
                return if (q - q.round()).abs() < 1e-9 {
                    format!("{}{suffix}", q.round())
                } else {
                    format!("{q:.1}{suffix}")
                };
            }
        }
    }
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A "nice" step (1, 2 or 5 times a power of ten) giving at most about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = span / n;
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// Renders `series` (name, points `(x, y)`) as an SVG line plot with a legend. With `log_x`
/// the x axis is logarithmic (points with `x <= 0` are skipped) and ticked at powers of two;
/// the y axis is linear from 0. Returns the SVG document.
pub fn line_plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> String {
    let fx = |x: f64| if log_x { x.log2() } else { x };
    let points = series
        .iter()
        .flat_map(|(_, p)| p.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0));
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in points {
        x0 = x0.min(fx(x));
        x1 = x1.max(fx(x));
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let y_step = nice_step(y1 * 1.05, 8.0);
    let y1 = (y1 * 1.05 / y_step).ceil() * y_step;
    let pw = WIDTH - LEFT - RIGHT;
    let ph = HEIGHT - TOP - BOTTOM;
    let px = |x: f64| LEFT + (fx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| TOP + ph - y / y1 * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        LEFT + pw / 2.0,
        escape(title)
    );
    // Grid and ticks: y.
    let mut y = 0.0;
    while y <= y1 + y_step * 1e-6 {
        let yy = py(y);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0,
            tick_label(y, false)
        );
        y += y_step;
    }
    // Grid and ticks: x.
    if log_x {
        let (lo, hi) = (x0.floor() as i64, x1.ceil() as i64);
        let every = ((hi - lo) as f64 / 10.0).ceil().max(1.0) as i64;
        let mut e = lo;
        while e <= hi {
            let v = 2f64.powi(e as i32);
            if fx(v) >= x0 - 1e-9 && fx(v) <= x1 + 1e-9 {
                let xx = px(v);
                let _ = writeln!(
                    s,
                    r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                    TOP + ph,
                    TOP + ph + 18.0,
                    tick_label(v, true)
                );
            }
            e += every;
        }
    } else {
        let step = nice_step(x1 - x0, 8.0);
        let mut x = (x0 / step).ceil() * step;
        while x <= x1 + step * 1e-6 {
            let xx = px(x);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 18.0,
                tick_label(x, false)
            );
            x += step;
        }
    }
    // Axes and labels.
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 18.0,
        escape(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(y_label)
    );
    // Series and legend.
    for (k, (name, pts)) in series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        let mut pts: Vec<(f64, f64)> = pts
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
            for &(x, y) in &pts {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#,
                    px(x),
                    py(y)
                );
            }
        }
        let ly = TOP + 10.0 + 18.0 * k as f64;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_names_its_series_and_draws_each() {
        let svg = line_plot(
            "A & B",
            "bytes",
            "GB/s",
            &[
                (
                    "ours".into(),
                    vec![(4096.0, 2.0), (1048576.0, 40.0), (1073741824.0, 52.0)],
                ),
                ("raw".into(), vec![(4096.0, 1.0), (1073741824.0, 9.0)]),
            ],
            true,
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("A &amp; B"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains(">1Gi<") && svg.contains(">4Ki<"), "{svg}");
    }

    #[test]
    fn labels_use_binary_prefixes_on_log_axes() {
        assert_eq!(tick_label(65536.0, true), "64Ki");
        assert_eq!(tick_label(1536.0, true), "1.5Ki");
        assert_eq!(tick_label(512.0, true), "512");
        assert_eq!(tick_label(2.5, false), "2.5");
    }

    #[test]
    fn an_empty_plot_is_still_a_document() {
        let svg = line_plot("empty", "x", "y", &[], false);
        assert!(svg.contains("</svg>"));
        assert!(!svg.contains("<polyline"));
    }
}
