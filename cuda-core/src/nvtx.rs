//! NVTX annotations: marks and nested ranges that profiling tools (Nsight Systems, ...) show on
//! the timeline (CuPy's `cupy.cuda.nvtx.Mark`, `MarkC`, `RangePush`, `RangePushC`, `RangePop`).
//!
//! * [`mark`] / [`mark_colored`]: an instant event.
//! * [`range`] / [`range_colored`]: a guard that pushes a range and pops it on drop (the usual
//!   way); [`range_push`] / [`range_push_colored`] / [`range_pop`] for the explicit form.
//! * [`Color`]: an ARGB colour, with a small palette ([`Color::from_index`], CuPy's `id_color`).
//!
//! These functions never fail. With no profiling tool attached they do nothing (NVTX's own
//! contract), and when `cuda-sys` was built without the NVTX headers ([`ENABLED`] is `false`)
//! they return at once without touching the message.
//!
//! Messages are Rust strings. NVTX takes NUL-terminated C strings, so an interior NUL byte
//! cannot be passed on: **interior NUL bytes are removed** (`"a\0b"` shows as `"ab"`), so an
//! annotation never turns into an error. Messages of fewer than 256 bytes are converted on the
//! stack, without allocating. The bytes go through NVTX's ASCII entry points unchanged; tools
//! display UTF-8 text as such.
//!
//! Ranges are per thread (NVTX's rule): a range pushed on one thread is popped on that thread,
//! which is why [`Range`] is neither `Send` nor `Sync`.
//!
//! ```
//! use cudars_core::nvtx::{self, Color};
//!
//! nvtx::mark("start");
//! {
//!     let _step = nvtx::range_colored("step 1", Color::GREEN);
//!     // ... work shown as "step 1" in the profiler ...
//! } // popped here
//! ```

use std::ffi::c_char;
use std::marker::PhantomData;

/// `true` when the NVTX3 headers were compiled into `cuda-sys`; `false` makes every function
/// of this module a no-op.
pub const ENABLED: bool = cudars_sys::nvtx::ENABLED;

/// An ARGB colour for marks and ranges (`0xAARRGGBB`).
///
/// ```
/// use cudars_core::nvtx::Color;
/// assert_eq!(Color::rgb(0x12, 0x34, 0x56), Color(0xFF12_3456));
/// assert_eq!(Color::from_index(0), Color::from_index(Color::PALETTE.len()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Color(pub u32);

impl Color {
    /// Opaque red.
    pub const RED: Color = Color::rgb(0xE0, 0x30, 0x30);
    /// Opaque green.
    pub const GREEN: Color = Color::rgb(0x30, 0xB0, 0x40);
    /// Opaque blue.
    pub const BLUE: Color = Color::rgb(0x30, 0x60, 0xE0);
    /// Opaque yellow.
    pub const YELLOW: Color = Color::rgb(0xF0, 0xD0, 0x20);
    /// Opaque cyan.
    pub const CYAN: Color = Color::rgb(0x20, 0xC0, 0xD0);
    /// Opaque magenta.
    pub const MAGENTA: Color = Color::rgb(0xC0, 0x30, 0xC0);
    /// Opaque orange.
    pub const ORANGE: Color = Color::rgb(0xF0, 0x80, 0x20);
    /// Opaque grey.
    pub const GRAY: Color = Color::rgb(0x80, 0x80, 0x80);

    /// The colours [`Color::from_index`] cycles through.
    pub const PALETTE: [Color; 8] = [
        Color::GREEN,
        Color::BLUE,
        Color::YELLOW,
        Color::MAGENTA,
        Color::CYAN,
        Color::RED,
        Color::ORANGE,
        Color::GRAY,
    ];

    /// A colour from its components.
    pub const fn argb(alpha: u8, red: u8, green: u8, blue: u8) -> Color {
        Color(u32::from_be_bytes([alpha, red, green, blue]))
    }

    /// An opaque colour from its components.
    pub const fn rgb(red: u8, green: u8, blue: u8) -> Color {
        Color::argb(0xFF, red, green, blue)
    }

    /// A colour picked by number from [`Color::PALETTE`], wrapping around (CuPy's `id_color`
    /// argument): the same index always gives the same colour.
    pub const fn from_index(index: usize) -> Color {
        Color::PALETTE[index % Color::PALETTE.len()]
    }
}

impl From<u32> for Color {
    fn from(argb: u32) -> Color {
        Color(argb)
    }
}

/// Places an instant marker named `message` on the calling thread's timeline (CuPy's `Mark`).
pub fn mark(message: &str) {
    annotate_mark(message, None);
}

/// Places a coloured instant marker (CuPy's `MarkC`).
pub fn mark_colored(message: &str, color: Color) {
    annotate_mark(message, Some(color));
}

/// Starts a nested range named `message` on the calling thread (CuPy's `RangePush`).
///
/// Returns the zero-based nesting level of the new range, or `None` when no profiling tool is
/// attached (or NVTX is compiled out), in which case NVTX keeps no count. Prefer [`range`], whose
/// guard cannot forget the pop.
pub fn range_push(message: &str) -> Option<u32> {
    annotate_push(message, None)
}

/// Starts a coloured nested range (CuPy's `RangePushC`); see [`range_push`].
pub fn range_push_colored(message: &str, color: Color) -> Option<u32> {
    annotate_push(message, Some(color))
}

/// Ends the innermost range of the calling thread (CuPy's `RangePop`).
///
/// Returns the nesting level of the range that ended, or `None` when no tool is attached, NVTX
/// is compiled out, or no range was open.
pub fn range_pop() -> Option<u32> {
    if !ENABLED {
        return None;
    }
    level(cudars_sys::nvtx::range_pop())
}

/// A range named `message` that lasts until the returned guard drops.
///
/// ```
/// fn step() {
///     let _range = cudars_core::nvtx::range("step");
///     // ...
/// }
/// ```
pub fn range(message: &str) -> Range {
    range_push(message);
    Range {
        _per_thread: PhantomData,
    }
}

/// A coloured range that lasts until the returned guard drops.
pub fn range_colored(message: &str, color: Color) -> Range {
    range_push_colored(message, color);
    Range {
        _per_thread: PhantomData,
    }
}

/// An open NVTX range, popped when dropped; see [`range`].
///
/// Neither `Send` nor `Sync`: NVTX ranges belong to the thread that pushed them.
#[derive(Debug)]
#[must_use = "the range ends when the guard drops; bind it to a variable such as `_range`"]
pub struct Range {
    _per_thread: PhantomData<*const ()>,
}

impl Drop for Range {
    fn drop(&mut self) {
        range_pop();
    }
}

/// NVTX's level result: negative means "no tool" or an error.
fn level(raw: i32) -> Option<u32> {
    u32::try_from(raw).ok()
}

fn annotate_mark(message: &str, color: Option<Color>) {
    if !ENABLED {
        return;
    }
    with_c_string(message, |p| {
        // SAFETY: `p` points to a NUL-terminated string that outlives the call.
        unsafe { cudars_sys::nvtx::mark(p, color.map(|c| c.0)) }
    });
}

fn annotate_push(message: &str, color: Option<Color>) -> Option<u32> {
    if !ENABLED {
        return None;
    }
    let raw = with_c_string(message, |p| {
        // SAFETY: `p` points to a NUL-terminated string that outlives the call.
        unsafe { cudars_sys::nvtx::range_push(p, color.map(|c| c.0)) }
    });
    level(raw)
}

/// Messages shorter than this are converted on the stack.
const STACK_MESSAGE: usize = 256;

/// Calls `f` with `message` as a NUL-terminated C string, interior NULs removed.
fn with_c_string<R>(message: &str, f: impl FnOnce(*const c_char) -> R) -> R {
    let bytes = message.as_bytes();
    if bytes.len() < STACK_MESSAGE {
        let mut buf = [0u8; STACK_MESSAGE];
        // At most bytes.len() < STACK_MESSAGE bytes are written, so a 0 follows them.
        for (slot, &b) in buf.iter_mut().zip(bytes.iter().filter(|&&b| b != 0)) {
            *slot = b;
        }
        f(buf.as_ptr().cast())
    } else {
        let mut owned: Vec<u8> = bytes.iter().copied().filter(|&b| b != 0).collect();
        owned.push(0);
        f(owned.as_ptr().cast())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn converted(message: &str) -> String {
        with_c_string(message, |p| {
            // SAFETY: with_c_string passes a NUL-terminated string valid during the closure.
            unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
        })
    }

    #[test]
    fn interior_nuls_are_removed_short_and_long() {
        assert_eq!(converted("plain"), "plain");
        assert_eq!(converted(""), "");
        assert_eq!(converted("a\0b\0"), "ab");
        let long = "x\0y".repeat(200);
        assert_eq!(converted(&long), "xy".repeat(200));
        let exact = "z".repeat(STACK_MESSAGE - 1);
        assert_eq!(converted(&exact), exact);
        let over = "é".repeat(STACK_MESSAGE);
        assert_eq!(converted(&over), over);
    }

    #[test]
    fn colours_pack_as_argb() {
        assert_eq!(Color::argb(0x11, 0x22, 0x33, 0x44).0, 0x1122_3344);
        assert_eq!(Color::rgb(1, 2, 3).0, 0xFF01_0203);
        assert_eq!(Color::from_index(1), Color::BLUE);
        assert_eq!(Color::from_index(9), Color::BLUE);
        assert_eq!(Color::from(0xDEAD_BEEF), Color(0xDEAD_BEEF));
    }

    #[test]
    fn calls_never_fail_without_a_tool() {
        // With no profiler attached (no injection library named in the environment) NVTX
        // keeps no levels; either way nothing panics.
        let no_tool = std::env::var_os("NVTX_INJECTION64_PATH").is_none();
        mark("mark");
        mark_colored("mark", Color::RED);
        let pushed = [range_push("r"), range_push_colored("r", Color::GREEN)];
        let popped = [range_pop(), range_pop()];
        if no_tool || !ENABLED {
            assert_eq!(pushed, [None, None]);
            assert_eq!(popped, [None, None]);
        }
        drop(range("guard"));
        drop(range_colored("guard", Color::CYAN));
    }
}
