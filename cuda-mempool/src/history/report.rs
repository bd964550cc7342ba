//! A self-contained HTML report of a [`History`]: one file, inline SVG and a few lines of
//! inline JavaScript for hovering, nothing loaded from the network.
//!
//! It shows:
//! * active memory over time, stacked by allocation: the [`ReportOptions::max_blocks`]
//!   blocks that weigh most (bytes times lifetime) each as a band at exact times (hovering
//!   shows size, stream, call site and lifetime), over a grey area of all active memory;
//! * physical memory held (reserved) against active memory;
//! * out-of-memory events, as red lines on both charts;
//! * the figures, and a summary of the [`Snapshot`] at the end.
//!
//! The grey area and the lines run over [`ReportOptions::columns`] columns, each showing the
//! most reached within it, so short peaks stay visible. The exact peaks are in the
//! figures and in the embedded data (`<script id="memviz-data" type="application/json">`).
//!
//! ```
//! use cudars_mempool::history::{report, Clock, Recorder};
//! use cudars_mempool::{DeviceAddress, DeviceId, StreamKey};
//!
//! let rec = Recorder::new(100, Clock::Virtual);
//! rec.malloc(DeviceId(0), StreamKey(1), 4096, DeviceAddress(0x1000), None);
//! rec.set_time(1);
//! rec.free(DeviceId(0), StreamKey(1), 4096, DeviceAddress(0x1000));
//! let h = rec.history();
//! let page = report::html(&h, &h.snapshot(), &report::ReportOptions::default());
//! assert!(page.contains("\"peak_active\":4096"));
//! assert!(!page.contains("http://") && !page.contains("https://"));
//! ```

use std::collections::HashMap;
use std::fmt::Write;

use super::snapshot::round;
use super::{EventKind, History, Snapshot};

/// How to draw the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportOptions {
    /// The page's title.
    pub title: String,
    /// The most blocks drawn as bands of their own (those of most bytes times lifetime).
    pub max_blocks: usize,
    /// Columns of the time axis.
    pub columns: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            title: "memory history".to_string(),
            max_blocks: 400,
            columns: 600,
        }
    }
}

/// One block's life, `end` exclusive (`u64::MAX`: live at the end).
struct Life {
    start: u64,
    end: u64,
    size: u64,
    stream: u64,
    site: String,
    addr: u64,
}

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 70.0;

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A JSON string literal, safe inside a `<script>` element.
fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '<' => o.push_str("\\u003c"),
            '>' => o.push_str("\\u003e"),
            '&' => o.push_str("\\u0026"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Bytes for humans.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The report page for `history` and the `snapshot` taken at its end.
pub fn html(history: &History, snapshot: &Snapshot, options: &ReportOptions) -> String {
    let figures = history.figures();
    let t_end = figures.end_time.saturating_add(1);
    let columns = options.columns.clamp(1, 4096) as u64;
    let cols = columns.min(t_end).max(1);
    let col =
        |t: u64| -> usize { ((u128::from(t) * u128::from(cols)) / u128::from(t_end)) as usize };
    let x = |c: usize| LEFT + c as f64 * (WIDTH - LEFT) / cols as f64;

    // Block lives, and the running sums per column.
    let mut lives: Vec<Life> = Vec::new();
    let mut open: HashMap<(u32, u64), usize> = HashMap::new();
    let n = cols as usize;
    let (mut active_max, mut reserved_max) = (vec![0u64; n], vec![0u64; n]);
    let (mut active, mut reserved) = (0u64, 0u64);
    let mut ooms: Vec<(u64, u64, u64, u64, String)> = Vec::new();
    let mut streams: Vec<u64> = Vec::new();
    for e in &history.events {
        let c = col(e.time).min(n - 1);
        match e.kind {
            EventKind::Malloc => {
                active += e.size;
                let stream = e.stream.map_or(0, |s| s.0);
                if !streams.contains(&stream) {
                    streams.push(stream);
                }
                open.insert((e.device.0, e.addr.0), lives.len());
                lives.push(Life {
                    start: e.time,
                    end: u64::MAX,
                    size: e.size,
                    stream,
                    site: site(history, e),
                    addr: e.addr.0,
                });
            }
            EventKind::Free => {
                active = active.saturating_sub(e.size);
                if let Some(i) = open.remove(&(e.device.0, e.addr.0)) {
                    lives[i].end = e.time;
                }
            }
            EventKind::SegmentAlloc | EventKind::PageCreate => reserved += e.size,
            EventKind::SegmentFree | EventKind::PageRelease => {
                reserved = reserved.saturating_sub(e.size)
            }
            EventKind::OutOfMemory {
                cause,
                used,
                reserved,
            } => ooms.push((e.time, e.size, used, reserved, cause.to_string())),
            _ => {}
        }
        active_max[c] = active_max[c].max(active);
        reserved_max[c] = reserved_max[c].max(reserved);
    }
    // Carry the level across columns without events.
    for i in 1..n {
        if active_max[i] == 0 && reserved_max[i] == 0 {
            active_max[i] = active_max[i - 1];
            reserved_max[i] = reserved_max[i - 1];
        }
    }

    // The blocks that weigh most (bytes times lifetime) get bands, stacked in order of
    // allocation at exact times: a band steps down when an earlier band ends.
    let end_of = |l: &Life| l.end.min(t_end);
    let mut order: Vec<usize> = (0..lives.len()).collect();
    let weight =
        |l: &Life| u128::from(l.size) * u128::from(end_of(l).saturating_sub(l.start).max(1));
    order.sort_by(|&a, &b| weight(&lives[b]).cmp(&weight(&lives[a])).then(a.cmp(&b)));
    order.truncate(options.max_blocks);
    order.sort_unstable();
    // Each band: (life, [(time, offset)]) with the offset from that time on.
    let mut bands: Vec<(usize, Vec<(u64, u64)>)> = Vec::with_capacity(order.len());
    for (k, &i) in order.iter().enumerate() {
        let l = &lives[i];
        let (s0, e0) = (l.start, end_of(l));
        let mut offset = 0u64;
        let mut ends: Vec<(u64, u64)> = Vec::new();
        for &j in &order[..k] {
            let o = &lives[j];
            let oe = end_of(o);
            if o.start <= s0 && oe > s0 {
                offset += o.size;
                if oe < e0 {
                    ends.push((oe, o.size));
                }
            }
        }
        ends.sort_unstable();
        let mut pts = vec![(s0, offset)];
        for (t, size) in ends {
            offset -= size;
            match pts.last_mut() {
                Some(p) if p.0 == t => p.1 = offset,
                _ => pts.push((t, offset)),
            }
        }
        bands.push((i, pts));
    }
    let y_max = active_max
        .iter()
        .chain(reserved_max.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let y = |v: u64| HEIGHT - 10.0 - (v as f64 / y_max) * (HEIGHT - 30.0);
    let xt = |t: u64| LEFT + t as f64 * (WIDTH - LEFT) / t_end as f64;

    let mut svg1 = String::new();
    let _ = write!(
        svg1,
        "<svg id=\"stack\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"100%\" role=\"img\" aria-label=\"active memory stacked by allocation\">"
    );
    axes(&mut svg1, y_max, &y, t_end);
    // All active memory, per column at its most, in grey: what the bands leave uncovered
    // is the other blocks'.
    let mut pts = format!("{:.1},{:.1} ", x(0), y(0));
    for (c, v) in active_max.iter().enumerate() {
        let _ = write!(
            pts,
            "{:.1},{:.1} {:.1},{:.1} ",
            x(c),
            y(*v),
            x(c + 1),
            y(*v)
        );
    }
    let _ = write!(pts, "{:.1},{:.1}", x(n), y(0));
    let _ = write!(
        svg1,
        "<polygon data-i=\"other\" points=\"{pts}\" fill=\"#c8c8c8\"/>"
    );
    for (k, (i, pts)) in bands.iter().enumerate() {
        let l = &lives[*i];
        let e0 = end_of(l);
        let mut upper = Vec::new();
        let mut lower = Vec::new();
        // A band at least one column wide, so that short lives stay visible.
        let min_right = xt(l.start) + (WIDTH - LEFT) / n as f64;
        for (j, &(t, off)) in pts.iter().enumerate() {
            let right = match pts.get(j + 1) {
                Some(p) => xt(p.0),
                None => xt(e0).max(min_right).min(WIDTH),
            };
            upper.push((xt(t), y(off + l.size)));
            upper.push((right, y(off + l.size)));
            lower.push((xt(t), y(off)));
            lower.push((right, y(off)));
        }
        lower.reverse();
        let mut points = String::new();
        for (px, py) in upper.iter().chain(lower.iter()) {
            let _ = write!(points, "{px:.1},{py:.1} ");
        }
        let hue = (l.stream.wrapping_mul(97) % 360) as f64;
        let light = 40 + (k * 37 % 30);
        let _ = write!(
            svg1,
            "<polygon data-i=\"{k}\" points=\"{}\" fill=\"hsl({hue},65%,{light}%)\" stroke=\"#fff\" stroke-width=\"0.2\"/>",
            points.trim_end()
        );
    }
    oom_lines(&mut svg1, &ooms, &x, &col, n);
    svg1.push_str("</svg>");

    let mut svg2 = String::new();
    let _ = write!(
        svg2,
        "<svg id=\"lines\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"100%\" role=\"img\" aria-label=\"reserved and active memory\">"
    );
    axes(&mut svg2, y_max, &y, t_end);
    for (series, colour, name) in [
        (&reserved_max, "#d62728", "reserved"),
        (&active_max, "#1f77b4", "active"),
    ] {
        let mut p = String::new();
        for (c, v) in series.iter().enumerate() {
            let _ = write!(p, "{:.1},{:.1} {:.1},{:.1} ", x(c), y(*v), x(c + 1), y(*v));
        }
        let _ = write!(
            svg2,
            "<polyline class=\"{name}\" points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"/>",
            p.trim_end()
        );
    }
    oom_lines(&mut svg2, &ooms, &x, &col, n);
    svg2.push_str("</svg>");

    // The embedded data: figures, and what hovering shows.
    let mut data = String::new();
    let _ = write!(
        data,
        "{{\"title\":{},\"clock\":{},\"events\":{},\"dropped\":{},\"end_time\":{},\"peak_active\":{},\"peak_reserved\":{},\"ooms\":[",
        json_str(&options.title),
        json_str(match history.clock {
            super::Clock::Virtual => "virtual",
            super::Clock::Real => "ns",
        }),
        history.events.len(),
        history.dropped,
        figures.end_time,
        figures.peak_active,
        figures.peak_reserved,
    );
    for (j, (t, size, used, res, cause)) in ooms.iter().enumerate() {
        let sep = if j == 0 { "" } else { "," };
        let _ = write!(
            data,
            "{sep}{{\"time\":{t},\"requested\":{size},\"used\":{used},\"reserved\":{res},\"cause\":{}}}",
            json_str(cause)
        );
    }
    data.push_str("],\"blocks\":[");
    for (k, (i, _)) in bands.iter().enumerate() {
        let l = &lives[*i];
        let sep = if k == 0 { "" } else { "," };
        let end = if l.end == u64::MAX {
            "null".to_string()
        } else {
            l.end.to_string()
        };
        let _ = write!(
            data,
            "{sep}[{},{},{end},{},{},{}]",
            l.size,
            l.start,
            l.stream,
            json_str(&format!("{:#x}", l.addr)),
            json_str(&l.site)
        );
    }
    data.push_str("]}");

    // The segment and page map at a few instants, one shown at a time (a slider picks).
    let instants = map_instants(history, figures.end_time);
    let mut maps = String::new();
    let mut labels = Vec::new();
    // The peak of active memory is shown first.
    let map_first = instants.iter().position(|i| i.1).unwrap_or(0);
    for (i, (t, peak)) in instants.iter().enumerate() {
        maps.push_str(&segment_map(&history.snapshot_at(*t), i, i == map_first));
        labels.push(json_str(&format!(
            "time {t}{}",
            if *peak {
                " (peak of active memory)"
            } else {
                ""
            }
        )));
    }
    let map_last = instants.len().saturating_sub(1);
    let map_labels = labels.join(",");

    let free_bytes: u64 = snapshot.free.iter().map(|f| f.size).sum();
    let largest_free = snapshot.free.iter().map(|f| f.size).max().unwrap_or(0);
    let oom_text = if ooms.is_empty() {
        "none".to_string()
    } else {
        ooms.iter()
            .map(|o| {
                format!(
                    "at {} asking {} ({}; used {}, reserved {})",
                    o.0,
                    human(o.1),
                    o.4,
                    human(o.2),
                    human(o.3)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let title = esc(&options.title);
    let clock = match history.clock {
        super::Clock::Virtual => "time: operation index",
        super::Clock::Real => "time: ns since recording began",
    };
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font:14px system-ui,sans-serif;margin:1.5em;max-width:1100px;color:#222}}
table{{border-collapse:collapse}}td{{padding:2px 10px 2px 0}}
#tip{{position:fixed;display:none;background:#fffbe8;border:1px solid #888;padding:4px 8px;font:12px monospace;pointer-events:none;white-space:pre}}
polygon[data-i]:hover{{opacity:.7}}
</style></head><body>
<h1>{title}</h1>
<table>
<tr><td>events</td><td>{events} ({dropped} dropped)</td></tr>
<tr><td>peak active</td><td>{peak_active} ({peak_active_b} bytes)</td></tr>
<tr><td>peak reserved</td><td>{peak_reserved} ({peak_reserved_b} bytes)</td></tr>
<tr><td>streams</td><td>{streams}</td></tr>
<tr><td>out of memory</td><td>{oom_text}</td></tr>
<tr><td>at the end</td><td>{live} live blocks ({live_bytes}), {segments} segments ({backed} backed), {nfree} free blocks ({free_bytes}, largest {largest_free})</td></tr>
</table>
<h2>Active memory, stacked by allocation</h2>
<p>The {bands} blocks that weigh most (bytes times lifetime) as bands stacked in allocation order (colour by stream); grey: all active memory, at its most within each column, so what the bands leave grey is the other {others} blocks'; {clock}, 0 to {t_end}; red lines: out of memory. Hover for details.</p>
{svg1}
<h2>Reserved against active memory</h2>
<p><span style="color:#d62728">reserved</span>: physical memory the pool holds (plain segments and created pages); <span style="color:#1f77b4">active</span>: bytes in live blocks.</p>
{svg2}
<h2>Segments and pages</h2>
<p>One row per segment the pool held at the chosen instant: grey its address space, pale blue the memory behind it (all of a plain segment, the mapped pages of a virtual one), coloured the live blocks (by stream). <input id="mapat" type="range" min="0" max="{map_last}" value="{map_first}"> <span id="mapt"></span></p>
{maps}
<div id="tip"></div>
<script id="memviz-data" type="application/json">{data}</script>
<script>
(function(){{
var d=JSON.parse(document.getElementById('memviz-data').textContent);
var tip=document.getElementById('tip');
function h(b){{var u=['B','KiB','MiB','GiB','TiB'],i=0;while(b>=1024&&i<4){{b/=1024;i++;}}return (i?b.toFixed(1):b)+' '+u[i];}}
document.getElementById('stack').addEventListener('mousemove',function(e){{
var i=e.target.getAttribute&&e.target.getAttribute('data-i');
if(i===null||i===undefined){{tip.style.display='none';return;}}
var t;
if(i==='other'){{t='other blocks (too small to draw each)';}}else{{
var b=d.blocks[+i];
t='size    '+h(b[0])+' ('+b[0]+' B)\nstream  '+b[3]+'\naddress '+b[4]+'\nsite    '+b[5]+'\nlife    '+b[1]+' .. '+(b[2]===null?'end':b[2]);}}
tip.textContent=t;tip.style.display='block';tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';}});
document.getElementById('stack').addEventListener('mouseleave',function(){{tip.style.display='none';}});
var at=document.getElementById('mapat'),mt=document.getElementById('mapt'),ml=[{map_labels}];
function show(){{var k=+at.value;document.querySelectorAll('svg.segmap').forEach(function(m,i){{m.style.display=i===k?'':'none';}});mt.textContent=ml[k];}}
at.addEventListener('input',show);show();
}})();
</script>
</body></html>
"#,
        events = history.events.len(),
        dropped = history.dropped,
        peak_active = human(figures.peak_active),
        peak_active_b = figures.peak_active,
        peak_reserved = human(figures.peak_reserved),
        peak_reserved_b = figures.peak_reserved,
        streams = streams.len(),
        live = snapshot.live.len(),
        live_bytes = human(snapshot.active_bytes()),
        segments = snapshot.segments.len(),
        backed = human(snapshot.backed_bytes()),
        nfree = snapshot.free.len(),
        free_bytes = human(free_bytes),
        largest_free = human(largest_free),
        bands = bands.len(),
        others = lives.len() - bands.len(),
    )
}

/// Segments drawn at most in one map (the rest are counted below it).
const MAP_ROWS: usize = 48;
/// Live blocks drawn at most in one map, the largest first (the rest are counted).
const MAP_BLOCKS: usize = 200;
/// Instants the segment map is drawn at, spread over the recording (plus the peak).
const MAP_INSTANTS: u64 = 6;

/// The instants of the segment map: evenly spread from the first event to the last, and the
/// time of the peak of active memory, in order, without repeats.
fn map_instants(history: &History, end_time: u64) -> Vec<(u64, bool)> {
    let (mut active, mut peak, mut peak_t) = (0u64, 0u64, 0u64);
    for e in &history.events {
        match e.kind {
            EventKind::Malloc => active += e.size,
            EventKind::Free => active = active.saturating_sub(e.size),
            _ => {}
        }
        if active > peak {
            (peak, peak_t) = (active, e.time);
        }
    }
    let start = history.events.first().map_or(0, |e| e.time);
    let span = end_time.saturating_sub(start);
    let mut v: Vec<(u64, bool)> = (1..=MAP_INSTANTS)
        .map(|k| (start + span * k / MAP_INSTANTS, false))
        .collect();
    v.push((peak_t, true));
    v.sort_unstable();
    v.dedup_by(|a, b| {
        let same = a.0 == b.0;
        if same {
            b.1 |= a.1;
        }
        same
    });
    v
}

/// One segment map: a row per segment (address space grey, memory behind it pale blue,
/// live blocks coloured by stream), at most [`MAP_ROWS`] rows.
fn segment_map(snap: &Snapshot, id: usize, shown: bool) -> String {
    const ROW: f64 = 14.0;
    let rows = snap.segments.len().min(MAP_ROWS);
    let height = (rows.max(1) as f64) * ROW + 16.0;
    // One scale for every row, up to the furthest byte in use: all of a plain segment; the
    // last mapped page or live block of a virtual one (the pool reserves far more address
    // space than it maps, which would shrink the memory to nothing).
    let extent = |g: &super::Segment| -> u64 {
        match g.kind {
            super::SegmentKind::Plain => g.size,
            super::SegmentKind::Virtual => {
                let end = g.base.0 + g.size;
                let pages = g.pages.iter().map(|p| p.0 .0 + p.1);
                let live = snap
                    .live
                    .iter()
                    .filter(|b| b.device == g.device && b.addr.0 >= g.base.0 && b.addr.0 < end)
                    .map(|b| b.addr.0 + round(b.size));
                pages.chain(live).max().map_or(0, |e| e - g.base.0)
            }
        }
    };
    let widest = snap
        .segments
        .iter()
        .take(MAP_ROWS)
        .map(extent)
        .max()
        .unwrap_or(1)
        .max(1);
    let scale = |bytes: u64| (WIDTH - LEFT) * bytes.min(widest) as f64 / widest as f64;
    let mut svg = String::new();
    let display = if shown { "" } else { " style=\"display:none\"" };
    let _ = write!(
        svg,
        "<svg class=\"segmap\" id=\"map-{id}\" viewBox=\"0 0 {WIDTH} {height:.0}\" width=\"100%\" role=\"img\" aria-label=\"segments and pages\"{display}>"
    );
    for (r, seg) in snap.segments.iter().take(MAP_ROWS).enumerate() {
        let y = r as f64 * ROW;
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"end\">{}</text><rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#e4e4e4\"><title>segment {:#x}, {} of address space (drawn up to its last byte in use)</title></rect>",
            LEFT - 4.0,
            y + ROW - 4.0,
            esc(&human(seg.size)),
            scale(seg.size),
            ROW - 3.0,
            seg.base.0,
            esc(&human(seg.size))
        );
        let mut backed: Vec<(u64, u64)> = Vec::new();
        match seg.kind {
            super::SegmentKind::Plain => backed.push((seg.base.0, seg.size)),
            // Runs of adjacent mapped pages, one rectangle each.
            super::SegmentKind::Virtual => {
                for &(addr, len) in &seg.pages {
                    match backed.last_mut() {
                        Some(run) if run.0 + run.1 == addr.0 => run.1 += len,
                        _ => backed.push((addr.0, len)),
                    }
                }
            }
        }
        for (addr, len) in backed {
            let _ = write!(
                svg,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"#b9d4ea\"/>",
                LEFT + scale(addr - seg.base.0),
                scale(len).max(0.5),
                ROW - 3.0
            );
        }
    }
    // The largest live blocks of the drawn segments, at most MAP_BLOCKS of them.
    let drawn = &snap.segments[..rows];
    let mut blocks: Vec<(usize, &super::LiveBlock)> = snap
        .live
        .iter()
        .filter_map(|b| {
            drawn
                .iter()
                .position(|g| {
                    g.device == b.device && b.addr.0 >= g.base.0 && b.addr.0 < g.base.0 + g.size
                })
                .map(|r| (r, b))
        })
        .collect();
    let hidden = blocks.len().saturating_sub(MAP_BLOCKS);
    blocks.sort_unstable_by_key(|b| std::cmp::Reverse(b.1.size));
    blocks.truncate(MAP_BLOCKS);
    for (r, b) in blocks {
        let (seg, y) = (&drawn[r], r as f64 * ROW);
        // The stream's hue, as in the stacked plot.
        let hue = (b.stream.0.wrapping_mul(97) % 360) as f64;
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"hsl({hue},65%,45%)\"><title>{} at {:#x}, stream {}</title></rect>",
            LEFT + scale(b.addr.0 - seg.base.0),
            y + 2.0,
            scale(round(b.size)).max(0.5),
            ROW - 7.0,
            esc(&human(b.size)),
            b.addr.0,
            b.stream.0
        );
    }
    if hidden > 0 {
        let _ = write!(
            svg,
            "<text x=\"{WIDTH}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{hidden} smaller live blocks not drawn</text>",
            rows as f64 * ROW + 12.0
        );
    }
    if snap.segments.len() > MAP_ROWS {
        let _ = write!(
            svg,
            "<text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"10\">{} more segments not drawn</text>",
            rows as f64 * ROW + 12.0,
            snap.segments.len() - MAP_ROWS
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The y axis with a few labelled lines, and the x axis's ends.
fn axes(svg: &mut String, y_max: f64, y: &dyn Fn(u64) -> f64, t_end: u64) {
    for k in 0..=4u64 {
        let v = (y_max * k as f64 / 4.0) as u64;
        let py = y(v);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{WIDTH}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{}</text>",
            LEFT - 4.0,
            py + 3.0,
            esc(&human(v))
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{HEIGHT}\" font-size=\"10\">0</text><text x=\"{WIDTH}\" y=\"{HEIGHT}\" font-size=\"10\" text-anchor=\"end\">{t_end}</text>"
    );
}

fn oom_lines(
    svg: &mut String,
    ooms: &[(u64, u64, u64, u64, String)],
    x: &dyn Fn(usize) -> f64,
    col: &dyn Fn(u64) -> usize,
    n: usize,
) {
    for o in ooms {
        let px = x(col(o.0).min(n - 1));
        let _ = write!(
            svg,
            "<line class=\"oom\" x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"0\" y2=\"{HEIGHT}\" stroke=\"red\" stroke-width=\"1.5\"><title>out of memory: {} asked, {}</title></line>",
            esc(&human(o.1)),
            esc(&o.4)
        );
    }
}

/// Who allocated: the innermost frame of the caller's captured stack (function and file:line),
/// else the caller's location, else "(not recorded)".
fn site(history: &History, e: &super::Record) -> String {
    let frame = history
        .stack(e.seq)
        .and_then(|s| s.caller_frames().first().cloned());
    match (frame, e.location) {
        (Some(f), _) => match (f.file, f.line) {
            (Some(file), Some(line)) => format!("{} ({file}:{line})", f.name),
            _ => f.name,
        },
        (None, Some(l)) => l.to_string(),
        (None, None) => "(not recorded)".to_string(),
    }
}
