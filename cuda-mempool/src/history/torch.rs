//! Export to PyTorch's memory snapshot format: the pickle that
//! `torch.cuda.memory._dump_snapshot` writes and PyTorch's memory viewer
//! (`pytorch.org/memory_viz`, `python -m torch.cuda._memory_viz trace_plot FILE`) reads.
//!
//! [`torch_snapshot`] turns a [`Snapshot`] and the [`History`] it came from into the bytes of
//! that pickle (protocol 2, built by a small encoder of its own: dicts, lists, strings,
//! integers, booleans and `None`). The file is a dict with:
//!
//! * `"segments"`: one dict per segment held: `device`, `address`, `total_size`,
//!   `allocated_size`, `active_size`, `requested_size`, `stream`, `segment_type`
//!   (`"small"` for a segment of at most 2 MiB of address space, else `"large"`),
//!   `is_expandable` (a
//!   reserved address range with pages mapped into it) and `blocks`: the live blocks
//!   (`state` `"active_allocated"`, `size` rounded up to [`policy::ROUND`](crate::policy::ROUND),
//!   `requested_size` as asked) and the free memory between them (`"inactive"`), in
//!   address order, so the block sizes of a segment add up to its `total_size`. The
//!   `total_size` of an expandable segment is its mapped bytes.
//! * `"device_traces"`: one list per device (index = device number) of trace entries
//!   `{action, addr, size, stream, time_us, frames}`: `alloc` for a malloc, then
//!   `free_requested` and `free_completed` for its free (the `size` of all three is the
//!   size asked for, so the running sum of the trace is the history's active bytes),
//!   `segment_alloc`/`segment_free` for plain segments, `segment_map`/`segment_unmap` for
//!   pages mapped into a reserved range, and `oom` (with `size` the request) for an
//!   out-of-memory failure (its `device_free` is 0: the history does not know it). With a [`Clock::Virtual`] recorder `time_us` is the virtual
//!   time itself; with [`Clock::Real`] it is microseconds since the recorder was made.
//! * `frames` hold the caller's location where one was captured
//!   (`{filename, line, name}`), else nothing.
//!
//! ```
//! use cudars_mempool::history::{torch, Clock, Recorder};
//! use cudars_mempool::{DeviceAddress, DeviceId, StreamKey};
//!
//! let rec = Recorder::new(16, Clock::Virtual);
//! rec.malloc(DeviceId(0), StreamKey(1), 512, DeviceAddress(0x1000), None);
//! let history = rec.history();
//! let bytes = torch::torch_snapshot(&history, &history.snapshot());
//! assert_eq!(&bytes[..2], &[0x80, 2]); // pickle protocol 2
//! assert_eq!(bytes.last(), Some(&b'.')); // STOP
//! ```

use std::collections::BTreeMap;
use std::panic::Location;

use super::{CallStack, Clock, EventKind, History, Snapshot};
use crate::backend::DeviceAddress;
use crate::history::SegmentKind;

/// A value of the subset of Python objects the snapshot needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An `int` (any value an `i128` holds).
    Int(i128),
    /// A `str`.
    Str(String),
    /// A `list`.
    List(Vec<Value>),
    /// A `dict` with string keys, in this order.
    Dict(Vec<(String, Value)>),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i128::from(v))
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i128::from(v))
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

// Pickle opcodes (protocol 2).
const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const EMPTY_DICT: u8 = b'}';
const SETITEMS: u8 = b'u';
const MARK: u8 = b'(';

/// Items per `MARK ... APPENDS`/`SETITEMS` batch (as Python's own pickler does, so that no
/// loader's stack grows with the list).
const BATCH: usize = 1000;

/// The pickle (protocol 2) of `value`: `PROTO 2`, the value, `STOP`. Python's
/// `pickle.loads` gives back the same value.
///
/// ```
/// use cudars_mempool::history::torch::{pickle, Value};
///
/// assert_eq!(pickle(&Value::None), [0x80, 2, b'N', b'.']);
/// assert_eq!(pickle(&Value::Int(5)), [0x80, 2, b'K', 5, b'.']);
/// ```
pub fn pickle(value: &Value) -> Vec<u8> {
    let mut out = vec![PROTO, 2];
    encode(value, &mut out);
    out.push(STOP);
    out
}

fn encode_str(s: &str, out: &mut Vec<u8>) {
    out.push(BINUNICODE);
    // A string of 4 GiB or more cannot be pickled with protocol 2; ours are short (names and
    // file paths), so the length is clamped rather than failing.
    let bytes = s.as_bytes();
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes[..len as usize]);
}

fn encode(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::None => out.push(NONE),
        Value::Bool(true) => out.push(NEWTRUE),
        Value::Bool(false) => out.push(NEWFALSE),
        Value::Int(v) => encode_int(*v, out),
        Value::Str(s) => encode_str(s, out),
        Value::List(items) => {
            out.push(EMPTY_LIST);
            for chunk in items.chunks(BATCH) {
                out.push(MARK);
                for item in chunk {
                    encode(item, out);
                }
                out.push(APPENDS);
            }
        }
        Value::Dict(items) => {
            out.push(EMPTY_DICT);
            for chunk in items.chunks(BATCH) {
                out.push(MARK);
                for (k, v) in chunk {
                    encode_str(k, out);
                    encode(v, out);
                }
                out.push(SETITEMS);
            }
        }
    }
}

fn encode_int(v: i128, out: &mut Vec<u8>) {
    if let Ok(b) = u8::try_from(v) {
        out.extend_from_slice(&[BININT1, b]);
    } else if let Ok(h) = u16::try_from(v) {
        out.push(BININT2);
        out.extend_from_slice(&h.to_le_bytes());
    } else if let Ok(w) = i32::try_from(v) {
        out.push(BININT);
        out.extend_from_slice(&w.to_le_bytes());
    } else {
        // LONG1: the shortest little-endian two's complement bytes of the value.
        let bytes = v.to_le_bytes();
        let mut n = bytes.len();
        while n > 1 {
            let top = bytes[n - 1];
            let below_sign = bytes[n - 2] & 0x80;
            if (top == 0 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        out.push(LONG1);
        // `n` is at most 16.
        out.push(n as u8);
        out.extend_from_slice(&bytes[..n]);
    }
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// PyTorch's `frames` list: the captured call stack's frames from the pool's caller on,
/// where one was captured, else the caller's location (one frame), else none.
fn frames(location: Option<&'static Location<'static>>, stack: Option<&CallStack>) -> Value {
    if let Some(stack) = stack {
        return Value::List(
            stack
                .caller_frames()
                .iter()
                .map(|f| {
                    dict(vec![
                        (
                            "filename",
                            f.file.clone().unwrap_or_else(|| "??".into()).into(),
                        ),
                        ("line", u64::from(f.line.unwrap_or(0)).into()),
                        ("name", f.name.clone().into()),
                    ])
                })
                .collect(),
        );
    }
    Value::List(
        location
            .map(|l| {
                dict(vec![
                    ("filename", l.file().into()),
                    ("line", l.line().into()),
                    ("name", "<rust caller>".into()),
                ])
            })
            .into_iter()
            .collect(),
    )
}

fn round(size: u64) -> u64 {
    let r = crate::policy::ROUND;
    size.div_ceil(r).saturating_mul(r)
}

/// Segments of at most this many bytes are reported as `"small"`.
const SMALL_SEGMENT: u64 = 2 << 20;

/// The snapshot as PyTorch's `torch.cuda.memory._snapshot()` dict (see the
/// [module](self) for its keys).
pub fn torch_value(history: &History, snapshot: &Snapshot) -> Value {
    let segments = segments_value(history, snapshot);
    let devices = device_count(history, snapshot);
    let mut traces: Vec<Vec<Value>> = vec![Vec::new(); devices as usize];
    for e in &history.events {
        traces[e.device.0 as usize].extend(trace_entries(history, e));
    }
    dict(vec![
        ("segments", segments),
        (
            "device_traces",
            Value::List(traces.into_iter().map(Value::List).collect()),
        ),
    ])
}

/// How many `device_traces` lists the snapshot has: at least one, and one for every device of
/// a segment or an event.
fn device_count(history: &History, snapshot: &Snapshot) -> u32 {
    history
        .events
        .iter()
        .map(|e| e.device.0)
        .chain(snapshot.segments.iter().map(|s| s.device.0))
        .map(|d| d.saturating_add(1))
        .fold(1, u32::max)
}

/// The `segments` list: each segment with its blocks, live and free. A live block's frames
/// come from the call stack of its malloc in `history`: by the block's `seq` when the
/// snapshot was rebuilt from that history, else (a snapshot of the live pool, numbered by
/// another recorder) by the history's last malloc at the block's address.
fn segments_value(history: &History, snapshot: &Snapshot) -> Value {
    let mut last_malloc: std::collections::HashMap<(u32, u64), u64> =
        std::collections::HashMap::new();
    for e in history
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Malloc)
    {
        last_malloc.insert((e.device.0, e.addr.0), e.seq);
    }
    // Blocks of each segment: live ones and free ones, keyed by (device, address).
    let mut blocks: BTreeMap<(u32, u64), Value> = BTreeMap::new();
    for b in &snapshot.live {
        blocks.insert(
            (b.device.0, b.addr.0),
            dict(vec![
                ("address", b.addr.0.into()),
                ("size", round(b.size).into()),
                ("requested_size", b.size.into()),
                ("state", "active_allocated".into()),
                (
                    "frames",
                    frames(
                        b.location,
                        b.seq
                            .or_else(|| last_malloc.get(&(b.device.0, b.addr.0)).copied())
                            .and_then(|q| history.stack(q)),
                    ),
                ),
            ]),
        );
    }
    for f in &snapshot.free {
        blocks.insert(
            (f.device.0, f.addr.0),
            dict(vec![
                ("address", f.addr.0.into()),
                ("size", f.size.into()),
                ("requested_size", 0u64.into()),
                ("state", "inactive".into()),
                ("frames", Value::List(Vec::new())),
            ]),
        );
    }
    let mut segments = Vec::with_capacity(snapshot.segments.len());
    for seg in &snapshot.segments {
        let (lo, hi) = (
            (seg.device.0, seg.base.0),
            (seg.device.0, seg.base.0.saturating_add(seg.size)),
        );
        let live = snapshot
            .live
            .iter()
            .filter(|b| b.device == seg.device && (lo.1..hi.1).contains(&b.addr.0));
        let (allocated, requested) =
            live.fold((0u64, 0u64), |(a, r), b| (a + round(b.size), r + b.size));
        let total = seg.backed_bytes();
        segments.push(dict(vec![
            ("device", seg.device.0.into()),
            ("address", seg.base.0.into()),
            ("total_size", total.into()),
            ("allocated_size", allocated.into()),
            ("active_size", allocated.into()),
            ("requested_size", requested.into()),
            ("stream", seg.stream.map_or(0, |s| s.0).into()),
            (
                "segment_type",
                if seg.size <= SMALL_SEGMENT {
                    "small"
                } else {
                    "large"
                }
                .into(),
            ),
            ("is_expandable", (seg.kind == SegmentKind::Virtual).into()),
            (
                "blocks",
                Value::List(blocks.range(lo..hi).map(|(_, b)| b.clone()).collect()),
            ),
        ]));
    }
    Value::List(segments)
}

/// The `device_traces` entries of one event (none, one, or two for a free).
fn trace_entries(history: &History, e: &super::Record) -> Vec<Value> {
    let time_us = |t: u64| match history.clock {
        Clock::Virtual => t,
        Clock::Real => t / 1000,
    };
    let actions: &[&str] = match e.kind {
        EventKind::Malloc => &["alloc"],
        EventKind::Free => &["free_requested", "free_completed"],
        EventKind::SegmentAlloc => &["segment_alloc"],
        EventKind::SegmentFree => &["segment_free"],
        EventKind::PageMap => &["segment_map"],
        EventKind::PageUnmap => &["segment_unmap"],
        EventKind::OutOfMemory { .. } => &["oom"],
        _ => &[],
    };
    let addr = if matches!(e.kind, EventKind::OutOfMemory { .. }) {
        DeviceAddress(0)
    } else {
        e.addr
    };
    actions
        .iter()
        .map(|action| {
            let mut entry = vec![
                ("action", (*action).into()),
                ("addr", addr.0.into()),
                ("size", e.size.into()),
                ("stream", e.stream.map_or(0, |s| s.0).into()),
                ("time_us", time_us(e.time).into()),
                ("frames", frames(e.location, history.stack(e.seq))),
            ];
            if matches!(e.kind, EventKind::OutOfMemory { .. }) {
                // PyTorch's `trace` printout reads the device's free bytes of an `oom`; the
                // history does not know them.
                entry.push(("device_free", 0u64.into()));
            }
            dict(entry)
        })
        .collect()
}

/// Writes the PyTorch snapshot pickle of `snapshot` and its `history` to `out`, event by
/// event: the same bytes as [`torch_snapshot`], without holding the whole pickle (or a value
/// tree of every event) in memory, which for a million events is about a gigabyte. Wrap a
/// file in a `BufWriter`.
pub fn write_torch_snapshot(
    history: &History,
    snapshot: &Snapshot,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    // The segments (bounded by what the pool holds) as a value; the traces streamed.
    let segments = segments_value(history, snapshot);
    let devices = device_count(history, snapshot);
    let mut buf = vec![PROTO, 2, EMPTY_DICT, MARK];
    encode_str("segments", &mut buf);
    encode(&segments, &mut buf);
    encode_str("device_traces", &mut buf);
    // The list of devices, in batches as `encode` writes a list.
    buf.push(EMPTY_LIST);
    for first in (0..devices).step_by(BATCH) {
        buf.push(MARK);
        for device in first..devices.min(first.saturating_add(BATCH as u32)) {
            buf.push(EMPTY_LIST);
            let mut in_batch = 0;
            for e in history.events.iter().filter(|e| e.device.0 == device) {
                for entry in trace_entries(history, e) {
                    if in_batch == 0 {
                        buf.push(MARK);
                    }
                    encode(&entry, &mut buf);
                    in_batch += 1;
                    if in_batch == BATCH {
                        buf.push(APPENDS);
                        in_batch = 0;
                        out.write_all(&buf)?;
                        buf.clear();
                    }
                }
            }
            if in_batch > 0 {
                buf.push(APPENDS);
            }
        }
        buf.push(APPENDS);
        out.write_all(&buf)?;
        buf.clear();
    }
    buf.extend_from_slice(&[SETITEMS, STOP]);
    out.write_all(&buf)
}

/// The bytes of the PyTorch snapshot pickle of `snapshot` and its `history` (see the
/// [module](self)); write them to a `.pickle` file.
pub fn torch_snapshot(history: &History, snapshot: &Snapshot) -> Vec<u8> {
    pickle(&torch_value(history, snapshot))
}

#[cfg(test)]
mod streaming_tests {
    use super::*;
    use crate::backend::{DeviceId, StreamKey};
    use crate::error::OomCause;
    use crate::history::Recorder;

    #[test]
    fn the_streamed_pickle_is_the_value_trees_byte_for_byte() {
        // Two devices (one with no events in the middle), frees (two entries each), more
        // entries than a batch, an out of memory, an empty history.
        for n in [0u64, 1, 499, 500, 1200] {
            let rec = Recorder::new(1 << 14, Clock::Virtual);
            for i in 0..n {
                rec.set_time(i);
                let d = DeviceId(if i % 3 == 0 { 2 } else { 0 });
                let a = DeviceAddress(0x10000 + (i % 7) * 0x1000);
                rec.malloc(d, StreamKey(i % 4), 512 * (1 + i % 5), a, None);
                rec.free(d, StreamKey(i % 4), 512 * (1 + i % 5), a);
            }
            rec.out_of_memory(DeviceId(0), None, 1 << 40, OomCause::Limit, 0, 0);
            // A segment on a device with no other event.
            rec.event(
                EventKind::SegmentAlloc,
                DeviceId(4),
                None,
                2 << 20,
                DeviceAddress(0x9000_0000),
                None,
            );
            let h = rec.history();
            let s = h.snapshot();
            let mut streamed = Vec::new();
            write_torch_snapshot(&h, &s, &mut streamed).unwrap();
            assert_eq!(streamed, torch_snapshot(&h, &s), "{n} events");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: &Value) -> Vec<u8> {
        let p = pickle(v);
        assert_eq!(&p[..2], &[PROTO, 2]);
        assert_eq!(p.last(), Some(&STOP));
        p[2..p.len() - 1].to_vec()
    }

    #[test]
    fn history_pickle_bytes_of_small_values() {
        assert_eq!(body(&Value::None), b"N");
        assert_eq!(body(&Value::Bool(true)), [0x88]);
        assert_eq!(body(&Value::Bool(false)), [0x89]);
        assert_eq!(body(&Value::Int(0)), [b'K', 0]);
        assert_eq!(body(&Value::Int(255)), [b'K', 255]);
        assert_eq!(body(&Value::Int(256)), [b'M', 0, 1]);
        assert_eq!(body(&Value::Int(65536)), [b'J', 0, 0, 1, 0]);
        assert_eq!(body(&Value::Int(-1)), [b'J', 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(body(&Value::Int(1 << 31)), [0x8a, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(
            body(&Value::Int(-(1 << 31) - 1)),
            [0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff]
        );
        assert_eq!(
            body(&Value::Int(i128::from(u64::MAX))),
            [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
        assert_eq!(body(&"ab".into()), [b'X', 2, 0, 0, 0, b'a', b'b']);
        assert_eq!(body(&Value::List(Vec::new())), b"]");
        assert_eq!(
            body(&Value::List(vec![Value::Int(1), Value::None])),
            [b']', b'(', b'K', 1, b'N', b'e']
        );
        assert_eq!(
            body(&dict(vec![("k", true.into())])),
            [b'}', b'(', b'X', 1, 0, 0, 0, b'k', 0x88, b'u']
        );
        // Long lists go in batches.
        let long = body(&Value::List(vec![Value::None; 2500]));
        assert_eq!(long.iter().filter(|&&b| b == b'(').count(), 3);
        assert_eq!(long.iter().filter(|&&b| b == b'e').count(), 3);
    }

    #[test]
    fn history_torch_oom_entry_has_device_free() {
        use crate::backend::{DeviceId, StreamKey};
        use crate::error::OomCause;
        use crate::history::Recorder;
        let rec = Recorder::new(8, Clock::Virtual);
        rec.malloc(DeviceId(1), StreamKey(7), 512, DeviceAddress(0x1000), None);
        rec.out_of_memory(DeviceId(1), None, 1 << 40, OomCause::Limit, 512, 0);
        let h = rec.history();
        let Value::Dict(top) = torch_value(&h, &h.snapshot()) else {
            panic!("not a dict")
        };
        let traces = &top.iter().find(|(k, _)| k == "device_traces").unwrap().1;
        let Value::List(devices) = traces else {
            panic!("not a list")
        };
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0], Value::List(Vec::new()));
        let Value::List(entries) = &devices[1] else {
            panic!("not a list")
        };
        assert_eq!(entries.len(), 2);
        let Value::Dict(oom) = &entries[1] else {
            panic!("not a dict")
        };
        let get = |k: &str| oom.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("action"), Some("oom".into()));
        assert_eq!(get("size"), Some(Value::Int(1 << 40)));
        assert_eq!(get("device_free"), Some(Value::Int(0)));
    }
}
