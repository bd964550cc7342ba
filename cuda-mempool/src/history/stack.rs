//! [`CallStack`]: a backtrace captured with an event, for recorders that ask for them
//! ([`Recorder::with_backtraces`](super::Recorder::with_backtraces)).

use std::backtrace::Backtrace;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// One frame of a [`CallStack`], as the standard library resolves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The function (demangled), or `"<unknown>"`.
    pub name: String,
    /// The source file, where the debug information has it.
    pub file: Option<String>,
    /// The line in `file`.
    pub line: Option<u32>,
}

struct Inner {
    backtrace: Backtrace,
    frames: OnceLock<Vec<Frame>>,
}

/// A backtrace captured when an event was recorded. Cheap to clone (shared); its frames are
/// resolved once, on first use ([`frames`](Self::frames)), which is what costs: symbolisation
/// reads the program's debug information. Two stacks are equal when they are the same
/// capture.
#[derive(Clone)]
pub struct CallStack(Arc<Inner>);

impl CallStack {
    /// Captures the calling thread's stack now, whatever `RUST_BACKTRACE` says.
    pub fn capture() -> CallStack {
        CallStack(Arc::new(Inner {
            backtrace: Backtrace::force_capture(),
            frames: OnceLock::new(),
        }))
    }

    /// Every frame, innermost first (the capture itself and the recorder included).
    pub fn frames(&self) -> &[Frame] {
        self.0
            .frames
            .get_or_init(|| parse(&self.0.backtrace.to_string()))
    }

    /// The frames from the caller of the pool on: the innermost run of the standard
    /// library's capture, of this crate's pool and recorder, and of the C ABI is left out
    /// (when every frame is such, all are kept). Frames of a library without symbols read
    /// `<unknown>` or borrow the name of the nearest exported function.
    pub fn caller_frames(&self) -> &[Frame] {
        callers(self.frames())
    }
}

impl PartialEq for CallStack {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CallStack {}

impl std::fmt::Debug for CallStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CallStack")
            .field(&self.0.frames.get().map_or(0, Vec::len))
            .finish()
    }
}

/// Frames of a backtrace as the standard library prints it: `  N: name` lines, each followed
/// by zero or more `at file:line:column` lines (the first one counts).
fn parse(text: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(at) = t.strip_prefix("at ") {
            let Some(f) = frames.last_mut() else { continue };
            if f.file.is_some() {
                continue;
            }
            // file:line:column, where the file may itself hold colons.
            let mut parts = at.rsplitn(3, ':');
            let (col, line_no, file) = (parts.next(), parts.next(), parts.next());
            match (file, line_no.and_then(|l| l.parse().ok()), col) {
                (Some(file), Some(l), Some(_)) => {
                    f.file = Some(file.to_string());
                    f.line = Some(l);
                }
                _ => f.file = Some(at.to_string()),
            }
            continue;
        }
        if let Some((n, name)) = t.split_once(": ") {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                frames.push(Frame {
                    name: name.trim().to_string(),
                    file: None,
                    line: None,
                });
            }
        }
    }
    frames
}

/// [`CallStack::caller_frames`] of `all`.
fn callers(all: &[Frame]) -> &[Frame] {
    // Read once: the standard library's print shortened paths under it.
    let cwd = std::env::current_dir().ok();
    let machinery = |f: &Frame| {
        let n = f.name.trim_start_matches('<');
        if n.contains("::tests::") {
            return false;
        }
        let named = [
            "std::",
            "core::",
            "alloc::",
            "cudars_mempool::",
            "cudars_mempool_capi::",
            // The C ABI's exported functions (and, in a stripped library, the name the
            // nearest export lends to its private functions).
            "cuda_mempool_",
        ]
        .iter()
        .any(|p| n.starts_with(p));
        // An inlined frame carries its function's bare name in optimised builds
        // ("capture", "malloc", "call_once<...>"): its source file tells whose it is.
        named
            || f.file
                .as_deref()
                .is_some_and(|p| is_machinery_source(p, cwd.as_deref()))
    };
    let mut is_machinery: Vec<bool> = all.iter().map(machinery).collect();
    // An inlined frame printed without a file, under a bare name ("malloc_in<...>"),
    // belongs with the frame it was inlined into: the next one outwards.
    for i in (0..all.len().saturating_sub(1)).rev() {
        let f = &all[i];
        let head = f.name.split('<').next().unwrap_or("");
        if f.file.is_none() && !head.is_empty() && !head.contains("::") {
            // (Never the other way: a C ABI export's name stays machinery.)
            is_machinery[i] |= is_machinery[i + 1];
        }
    }
    match is_machinery.iter().position(|m| !m) {
        Some(i) => &all[i..],
        None => all,
    }
}

/// Whether a frame's source file belongs to the standard library or to this crate's pool and
/// C ABI (not their test files). The paths are the ones rustc recorded, absolute; the
/// standard library's print shortens those under the current directory to `./...`, which is
/// undone here with `cwd`, the current directory (read once per stack by the caller).
fn is_machinery_source(path: &str, cwd: Option<&Path>) -> bool {
    if path.starts_with("/rustc/")
        || ["library/std/", "library/core/", "library/alloc/"]
            .iter()
            .any(|d| path.contains(d))
    {
        return true;
    }
    let file = match path.strip_prefix("./") {
        Some(rest) => match cwd {
            Some(dir) => dir.join(rest),
            None => return false,
        },
        None => PathBuf::from(path),
    };
    if file.file_name().is_some_and(|n| n == "tests.rs") {
        return false;
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let capi = crate_dir
        .parent()
        .map(|p| p.join("cuda-mempool-capi").join("src"));
    file.starts_with(crate_dir.join("src"))
        || capi.is_some_and(|c| file.starts_with(c))
        // A registry copy of the C ABI crate beside this one.
        || path.contains("/cudars-mempool-capi-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_librarys_print_parses_into_frames() {
        let text = "   0: std::backtrace::Backtrace::force_capture\n             at /rustc/abc/library/std/src/backtrace.rs:312:13\n   1: cudars_mempool::history::Recorder::record\n             at ./src/history/mod.rs:270:9\n   2: my_app::train::step\n             at C:\\proj\\src\\train.rs:42:5\n             at ./src/inlined.rs:7:1\n   3: __libc_start_main\n   4: <unknown>\n";
        let f = parse(text);
        assert_eq!(f.len(), 5);
        assert_eq!(f[0].name, "std::backtrace::Backtrace::force_capture");
        assert_eq!(f[0].line, Some(312));
        assert_eq!(f[2].file.as_deref(), Some("C:\\proj\\src\\train.rs"));
        assert_eq!(f[2].line, Some(42));
        assert_eq!(f[3].file, None);
        assert_eq!(f[4].name, "<unknown>");
    }

    /// An optimised build with line tables: inlined frames carry bare names, the pool's
    /// files absolute or (under the current directory) `./`-relative, one inlined frame no
    /// file at all; the caller is the first frame outside the standard library and the pool.
    #[test]
    fn callers_skip_the_pools_inlined_frames_of_an_optimised_build() {
        let frame = |name: &str, file: Option<String>| Frame {
            name: name.to_string(),
            file,
            line: Some(1),
        };
        let own = |rel: &str| Some(format!("{}/src/{rel}", env!("CARGO_MANIFEST_DIR")));
        let all = vec![
            frame(
                "std::backtrace::Backtrace::force_capture",
                Some("/rustc/abc/library/std/src/backtrace.rs".into()),
            ),
            frame("capture", own("history/stack.rs")),
            frame(
                "call_once<fn() -> cudars_mempool::history::stack::CallStack, ()>",
                Some("/rustc/abc/library/core/src/ops/function.rs".into()),
            ),
            frame("record", own("history/mod.rs")),
            frame(
                "note_malloc<cudars_mempool::sim::SimulatedBackend>",
                own("pool/history.rs"),
            ),
            frame("malloc_in<cudars_mempool::sim::SimulatedBackend>", None),
            frame(
                "malloc<cudars_mempool::sim::SimulatedBackend>",
                own("pool/mod.rs"),
            ),
            frame("train_step", Some("/home/user/app/src/train.rs".into())),
            frame("main", Some("/home/user/app/src/main.rs".into())),
        ];
        let found = callers(&all);
        assert_eq!(found.first().map(|f| f.name.as_str()), Some("train_step"));
        assert_eq!(found.len(), 2);
        // The standard library's print shortens paths under the current directory.
        let cwd = std::env::current_dir().unwrap();
        if let Ok(rel) = Path::new(env!("CARGO_MANIFEST_DIR")).strip_prefix(&cwd) {
            let short = format!("./{}", rel.join("src/pool/mod.rs").display());
            assert!(is_machinery_source(&short, Some(&cwd)), "{short}");
        }
        // The crate's own test files are callers, not machinery.
        assert!(!is_machinery_source(&own("pool/tests.rs").unwrap(), None));
        assert!(is_machinery_source(
            &own("pool/shard/mod.rs").unwrap(),
            None
        ));
        assert!(!is_machinery_source("/home/user/app/src/pool/mod.rs", None));
        // A stripped C ABI library under Python: the export stays machinery, the
        // interpreter's frame (no file either) is the caller.
        let c = vec![
            frame("cuda_mempool_cupy_malloc", None),
            frame("_PyObject_Call", None),
            frame("_PyEval_EvalFrameDefault", None),
        ];
        assert_eq!(callers(&c)[0].name, "_PyObject_Call");
    }

    #[inline(never)]
    fn outer_caller() -> CallStack {
        CallStack::capture()
    }

    #[test]
    fn a_capture_has_frames_and_is_shared() {
        let s = outer_caller();
        let t = s.clone();
        assert_eq!(s, t);
        assert_ne!(s, outer_caller());
        // A test binary built with debug information resolves its own frames.
        assert!(!s.frames().is_empty());
        assert!(
            s.frames().iter().any(|f| f.name.contains("outer_caller")),
            "{:?}",
            s.frames()
        );
    }
}
