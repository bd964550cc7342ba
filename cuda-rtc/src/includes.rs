//! What a program reads from disk: the files its `#include`s can reach, for the cache key.
//!
//! NVRTC reads more than the source and the in-memory headers: a quoted `#include "x.h"`
//! searches the directory of the file that includes it (for the program itself, the
//! directory of its name, unless `--no-source-include`), then each `-I` directory in order;
//! an angle `#include <x.h>` searches the `-I` directories; `-include` / `--pre-include`
//! names files too. An in-memory header of the same name wins over any file (measured with
//! NVRTC 13.0). A key that hashed only the option string `-I<dir>` kept returning the old
//! image after a header in `<dir>` changed (soundness round 3, item 1).
//!
//! The scan over-approximates what the compiler may read, so that a change to anything it
//! reads changes the key:
//! - every `#include`, `#include_next` and `__has_include` of the program and of every
//!   header reached (in memory or on disk) is followed, whether or not a `#if` around it is
//!   taken, and comments and line splices are removed first;
//! - for each name, *every* candidate path is probed (the including file's directory, the
//!   program's directory, each `-I` directory), not only the first that exists, and the key
//!   records each candidate's state: the file's SHA-256, absent, or not a readable file. A
//!   header that appears earlier in the search order later, or one that changes anywhere
//!   the compiler could look, gives another key;
//! - an include the scanner cannot resolve without running the preprocessor (a computed
//!   `#include MACRO`, a `__has_include` of a macro) makes the program
//!   uncacheable ([`Program::uncacheable_reason`](crate::Program::uncacheable_reason)): it is compiled every time, never cached. So are
//!   programs that reach more than [`MAX_FILES`] files or [`MAX_BYTES`] bytes.
//!
//! Names NVRTC resolves itself (its built-in headers, when no directory has them) add only
//! "absent" probes: they are covered by the compiler's version, which is in the key.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

/// At most this many files are read for one program's key.
pub const MAX_FILES: usize = 4096;
/// At most this many bytes are read for one program's key.
pub const MAX_BYTES: u64 = 256 << 20;

/// What [`scan`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Every file the compiler may read, as a digest of each candidate path and its state.
    Complete { digest: [u8; 32], files: usize },
    /// The program cannot be keyed by what it reads; why.
    Uncacheable(String),
}

/// One `#include`-like reference found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reference {
    /// `"name"`.
    Quoted(String),
    /// `<name>`.
    Angle(String),
}

/// The options that name directories or files the preprocessor reads.
#[derive(Debug, Default)]
struct PathOptions {
    include_dirs: Vec<PathBuf>,
    pre_includes: Vec<String>,
    no_source_include: bool,
    /// An option that makes the compiler read files the scanner does not follow.
    uncacheable: Option<String>,
}

fn path_options(options: &[String]) -> PathOptions {
    let mut out = PathOptions::default();
    let mut it = options.iter();
    while let Some(o) = it.next() {
        let o = o.as_str();
        if o == "-I" || o == "--include-path" {
            if let Some(dir) = it.next() {
                out.include_dirs.push(PathBuf::from(dir));
            }
        } else if let Some(dir) = o
            .strip_prefix("--include-path=")
            .or_else(|| o.strip_prefix("-I="))
            .or_else(|| o.strip_prefix("-I"))
        {
            out.include_dirs.push(PathBuf::from(dir));
        } else if o == "-include" || o == "--pre-include" {
            if let Some(f) = it.next() {
                out.pre_includes.push(f.clone());
            }
        } else if let Some(f) = o
            .strip_prefix("--pre-include=")
            .or_else(|| o.strip_prefix("-include="))
        {
            out.pre_includes.push(f.to_string());
        } else if o == "--no-source-include" || o == "-no-source-include" {
            out.no_source_include = true;
        } else if o.contains("pch") {
            // Precompiled headers (NVRTC 12.8+: --pch, --create-pch, --use-pch, --pch-dir):
            // files the key does not follow.
            out.uncacheable = Some(format!(
                "the option `{o}` reads or writes precompiled headers"
            ));
        }
    }
    out
}

/// Whether a raw string literal (`R"delim(...)delim"`, with an optional `u8`, `u`, `U` or
/// `L` prefix) opens at `b[quote]`, the `"`.
fn raw_string_at(b: &[u8], quote: usize) -> bool {
    if quote == 0 || b[quote - 1] != b'R' {
        return false;
    }
    let mut start = quote - 1;
    for prefix in [&b"u8"[..], b"u", b"U", b"L"] {
        if start >= prefix.len() && &b[start - prefix.len()..start] == prefix {
            start -= prefix.len();
            break;
        }
    }
    start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_')
}

/// `text` with comments replaced by a space and line splices (`\` newline) removed; string,
/// raw string and character literals are kept as they are (a `/*` inside one opens no
/// comment). A byte-order mark at the start is dropped.
fn strip(text: &str) -> String {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let joined = text.replace("\\\r\n", "").replace("\\\n", "");
    let b = joined.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                out.push(b' ');
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
                i = (i + 2).min(b.len());
                out.push(b' ');
            }
            b'"' if raw_string_at(b, i) => {
                // R"delim( ... )delim": copied whole, whatever it holds.
                let open = b[i + 1..]
                    .iter()
                    .position(|&c| c == b'(')
                    .map(|p| i + 1 + p);
                let end = open.and_then(|open| {
                    let mut close = vec![b')'];
                    close.extend_from_slice(&b[i + 1..open]);
                    close.push(b'"');
                    b[open..]
                        .windows(close.len())
                        .position(|w| w == close.as_slice())
                        .map(|p| open + p + close.len())
                });
                let end = end.unwrap_or(b.len());
                out.extend_from_slice(&b[i..end]);
                i = end;
            }
            q @ (b'"' | b'\'') => {
                out.push(q);
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() && b[i] == q {
                    out.push(q);
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `"name"` or `<name>` at the start of `rest` (after blanks), or `None`.
fn literal(rest: &str) -> Option<Reference> {
    let rest = rest.trim_start();
    let (close, quoted) = match rest.as_bytes().first()? {
        b'"' => ('"', true),
        b'<' => ('>', false),
        _ => return None,
    };
    let body = &rest[1..];
    let end = body.find(close)?;
    let name = body[..end].to_string();
    Some(if quoted {
        Reference::Quoted(name)
    } else {
        Reference::Angle(name)
    })
}

/// Every reference in `text`, or why the text cannot be scanned.
fn references(text: &str) -> Result<Vec<Reference>, String> {
    let text = strip(text);
    let mut refs = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let after_hash = t
            .strip_prefix('#')
            .or_else(|| t.strip_prefix("%:"))
            .or_else(|| t.strip_prefix("??="));
        if let Some(d) = after_hash {
            let d = d.trim_start();
            // Directives that name a file and that this scanner does not follow.
            for other in ["import", "embed"] {
                if d.strip_prefix(other).is_some_and(|r| {
                    !r.chars()
                        .next()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                }) {
                    return Err(format!(
                        "`{}` reads a file the key cannot follow",
                        line.trim()
                    ));
                }
            }
            let rest = d
                .strip_prefix("include_next")
                .or_else(|| d.strip_prefix("include"));
            if let Some(rest) = rest {
                // `#include_next`, `#include`, but not `#includes` or other words.
                if rest
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
                {
                    continue;
                }
                match literal(rest) {
                    Some(r) => refs.push(r),
                    None => {
                        return Err(format!("`{}` names its file through a macro", line.trim()))
                    }
                }
                continue;
            }
        }
        if line.contains("__has_embed") {
            return Err(format!(
                "`{}` asks about a file the key cannot follow",
                line.trim()
            ));
        }
        // `__has_include("x")`, `__has_include(<x>)`, `__has_include_next(...)` and
        // `__has_include__(...)`, anywhere.
        let mut from = 0;
        while let Some(at) = line[from..].find("__has_include") {
            let start = from + at + "__has_include".len();
            let rest = &line[start..];
            let rest = rest
                .strip_prefix("_next")
                .or_else(|| rest.strip_prefix("__"))
                .unwrap_or(rest);
            let Some(arg) = rest.trim_start().strip_prefix('(') else {
                // `defined(__has_include)` and the like: no file named.
                from = start;
                continue;
            };
            match literal(arg) {
                Some(r) => refs.push(r),
                None => {
                    return Err(format!(
                        "`{}` asks about a file named through a macro",
                        line.trim()
                    ))
                }
            }
            from = start;
        }
    }
    Ok(refs)
}

/// The references of one text, and the directory its quoted names are resolved from first.
struct Pending {
    refs: Result<Vec<Reference>, String>,
    dir: Option<PathBuf>,
}

/// The candidate paths of `reference`, in no particular order (each is probed).
fn candidates(
    reference: &Reference,
    own_dir: Option<&Path>,
    source_dir: Option<&Path>,
    opts: &PathOptions,
) -> Vec<PathBuf> {
    let name = match reference {
        Reference::Quoted(n) | Reference::Angle(n) => n,
    };
    if Path::new(name).is_absolute() {
        return vec![PathBuf::from(name)];
    }
    let mut dirs: Vec<&Path> = Vec::new();
    if matches!(reference, Reference::Quoted(_)) {
        dirs.extend(own_dir);
        dirs.extend(source_dir);
    }
    dirs.extend(opts.include_dirs.iter().map(PathBuf::as_path));
    let mut seen = HashSet::new();
    dirs.into_iter()
        .map(|d| d.join(name))
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

/// The directory a file at `path` sits in, as the preprocessor resolves from it.
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// What identifies a file's content without reading it: device, inode, size, and the
/// modification and status-change times in nanoseconds (the status-change time cannot be set
/// back by a user), as git and ccache use it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp([i64; 6]);

#[cfg(unix)]
fn stamp(m: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt as _;
    Stamp([
        m.dev() as i64,
        m.ino() as i64,
        m.size() as i64,
        m.mtime()
            .wrapping_mul(1_000_000_000)
            .wrapping_add(m.mtime_nsec()),
        m.ctime()
            .wrapping_mul(1_000_000_000)
            .wrapping_add(m.ctime_nsec()),
        m.mode() as i64,
    ])
}

#[cfg(not(unix))]
fn stamp(m: &std::fs::Metadata) -> Stamp {
    let t = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64);
    Stamp([0, 0, m.len() as i64, t, 0, 0])
}

/// A file read once: its stamp, its content's SHA-256 and its references.
type Memo = std::collections::HashMap<PathBuf, (Stamp, [u8; 32], Refs)>;

/// What a text refers to, or why it cannot be scanned.
type Refs = Arc<Result<Vec<Reference>, String>>;

/// Files already read, by path: a file whose stamp is unchanged is not read again, so a cache
/// hit costs a `stat` per candidate path, not a read and a hash per header.
fn memo() -> &'static Mutex<Memo> {
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// The digest and references of the file at `path` (with `meta`), from the memo when its stamp
/// is unchanged.
fn read_file(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<([u8; 32], Refs)> {
    let st = stamp(meta);
    if let Some((s, digest, refs)) = memo()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(path)
    {
        if *s == st {
            return Ok((*digest, Arc::clone(refs)));
        }
    }
    let content = std::fs::read(path)?;
    let digest: [u8; 32] = Sha256::digest(&content).into();
    let refs = Arc::new(references(&String::from_utf8_lossy(&content)));
    // Kept only if the file did not change while it was read.
    if std::fs::metadata(path).is_ok_and(|m| stamp(&m) == st) {
        let mut memo = memo()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if memo.len() > 4 * MAX_FILES {
            memo.clear();
        }
        memo.insert(path.to_path_buf(), (st, digest, Arc::clone(&refs)));
    }
    Ok((digest, refs))
}

/// Scans the program named `name` (whose directory NVRTC searches for quoted includes),
/// its `source`, its in-memory `headers` and its `options`: see the [module](self).
pub(crate) fn scan(
    name: &str,
    source: &str,
    headers: &[(String, String)],
    options: &[String],
) -> Scan {
    let opts = path_options(options);
    if let Some(why) = opts.uncacheable {
        return Scan::Uncacheable(why);
    }
    let source_dir = (!opts.no_source_include).then(|| parent(Path::new(name)));
    let mut h = Sha256::new();
    let mut queue: VecDeque<Pending> = VecDeque::new();
    queue.push_back(Pending {
        refs: references(source),
        dir: source_dir.clone(),
    });
    for (header_name, text) in headers {
        // Its quoted names may be resolved from its own (relative) directory, or the
        // program's: both are probed.
        queue.push_back(Pending {
            refs: references(text),
            dir: Some(parent(Path::new(header_name))),
        });
    }
    // Pre-included files: resolved like quoted names from the working directory and the
    // search path.
    queue.push_back(Pending {
        refs: Ok(opts
            .pre_includes
            .iter()
            .map(|f| Reference::Quoted(f.clone()))
            .collect()),
        dir: Some(PathBuf::from(".")),
    });
    let mut probed: HashSet<PathBuf> = HashSet::new();
    let mut files = 0usize;
    let mut bytes = 0u64;
    while let Some(item) = queue.pop_front() {
        let refs = match item.refs {
            Ok(r) => r,
            Err(why) => return Scan::Uncacheable(why),
        };
        for r in refs {
            for path in candidates(&r, item.dir.as_deref(), source_dir.as_deref(), &opts) {
                if !probed.insert(path.clone()) {
                    continue;
                }
                field(&mut h, path.as_os_str().as_encoded_bytes());
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_file() => {
                        files += 1;
                        bytes += m.len();
                        if files > MAX_FILES || bytes > MAX_BYTES {
                            return Scan::Uncacheable(format!(
                                "its includes reach more than {MAX_FILES} files or {} MiB",
                                MAX_BYTES >> 20
                            ));
                        }
                        match read_file(&path, &m) {
                            Ok((digest, refs)) => {
                                h.update([1]);
                                h.update(digest);
                                queue.push_back(Pending {
                                    refs: (*refs).clone(),
                                    dir: Some(parent(&path)),
                                });
                            }
                            Err(e) => {
                                h.update([2]);
                                field(&mut h, e.kind().to_string().as_bytes());
                            }
                        }
                    }
                    Ok(_) => h.update([3]),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => h.update([0]),
                    Err(e) => {
                        h.update([2]);
                        field(&mut h, e.kind().to_string().as_bytes());
                    }
                }
            }
        }
    }
    Scan::Complete {
        digest: h.finalize().into(),
        files,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn directives_are_found_through_comments_splices_and_spellings() {
        let text = "#include \"a.h\"\n  #  include <b.h>\n#include_next \"c.h\"\n\
                    /* #include \"no.h\" */\n// #include \"no2.h\"\n#\\\ninclude \"d.h\"\n\
                    %:include \"e.h\"\n# /* c */ include \"f.h\"\n#if __has_include(<g.h>)\n\
                    #endif\nconst char* s = \"#include \\\"no3.h\\\"\";\n#includes \"no4.h\"\n";
        let refs = references(text).unwrap();
        assert_eq!(
            refs,
            vec![
                Reference::Quoted("a.h".into()),
                Reference::Angle("b.h".into()),
                Reference::Quoted("c.h".into()),
                Reference::Quoted("d.h".into()),
                Reference::Quoted("e.h".into()),
                Reference::Quoted("f.h".into()),
                Reference::Angle("g.h".into()),
            ]
        );
    }

    #[test]
    fn raw_strings_byte_order_marks_and_other_spellings() {
        // A `/*` inside a raw string opens no comment that would hide the include after it.
        let text = "const char* s = R\"x(\n/*\n)x\";\n#include \"real.h\"\n//*/\n";
        assert_eq!(
            references(text).unwrap(),
            vec![Reference::Quoted("real.h".into())]
        );
        let bom = "\u{feff}#include \"first.h\"\n";
        assert_eq!(
            references(bom).unwrap(),
            vec![Reference::Quoted("first.h".into())]
        );
        let old = "#if __has_include__(\"h.h\")\n#endif\n";
        assert_eq!(
            references(old).unwrap(),
            vec![Reference::Quoted("h.h".into())]
        );
        assert!(references("#import \"x.h\"\n").is_err());
        assert!(references("#embed \"x.bin\"\n").is_err());
        assert!(references("#if __has_embed(\"x.bin\")\n#endif\n").is_err());
        assert!(references("#important_pragma\n").is_ok());
        match scan("p.cu", "", &[], &["--use-pch=a.pch".to_string()]) {
            Scan::Uncacheable(why) => assert!(why.contains("precompiled"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unchanged_file_is_not_read_again_and_a_changed_one_is() {
        let root = temp_dir("memo");
        let f = root.join("m.h");
        std::fs::write(&f, "int a;\n").unwrap();
        let opts = vec![format!("-I{}", root.display())];
        let a = digest(scan("p.cu", "#include <m.h>\n", &[], &opts));
        assert_eq!(a, digest(scan("p.cu", "#include <m.h>\n", &[], &opts)));
        // Same size, rewritten: the stamp (times) changes, so the file is read again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, "int b;\n").unwrap();
        assert_ne!(a, digest(scan("p.cu", "#include <m.h>\n", &[], &opts)));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn computed_includes_are_uncacheable() {
        assert!(references("#define H \"x.h\"\n#include H\n").is_err());
        assert!(references("#if __has_include(H)\n#endif\n").is_err());
        assert!(references("#if defined(__has_include)\n#endif\n").is_ok());
        match scan("p.cu", "#include MACRO\n", &[], &[]) {
            Scan::Uncacheable(why) => assert!(why.contains("macro"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn include_options_in_every_spelling() {
        let o = path_options(&s(&[
            "-Ia",
            "-I",
            "b",
            "-I=c",
            "--include-path=d",
            "--include-path",
            "e",
            "-include",
            "f.h",
            "-include=g.h",
            "--pre-include=h.h",
            "--pre-include",
            "i.h",
            "-DX=1",
        ]));
        let dirs: Vec<_> = o.include_dirs.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(dirs, ["a", "b", "c", "d", "e"]);
        assert_eq!(o.pre_includes, s(&["f.h", "g.h", "h.h", "i.h"]));
        assert!(!o.no_source_include);
        assert!(path_options(&s(&["--no-source-include"])).no_source_include);
    }

    fn temp_dir(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "cudars-rtc-includes-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn digest(scan: Scan) -> [u8; 32] {
        match scan {
            Scan::Complete { digest, .. } => digest,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_change_anywhere_the_compiler_may_look_changes_the_digest() {
        let root = temp_dir("change");
        let (d1, d2) = (root.join("d1"), root.join("d2"));
        std::fs::create_dir_all(&d1).unwrap();
        std::fs::create_dir_all(&d2).unwrap();
        std::fs::write(d2.join("x.h"), "#include \"y.h\"\n#define V 2\n").unwrap();
        std::fs::write(d2.join("y.h"), "#define W 1\n").unwrap();
        let name = root.join("p.cu").to_string_lossy().into_owned();
        let opts = vec![format!("-I{}", d1.display()), format!("-I{}", d2.display())];
        let src = "#include \"x.h\"\n";
        let run = || digest(scan(&name, src, &[], &opts));
        let first = run();
        assert_eq!(first, run(), "the digest is deterministic");
        // A header two levels down changes.
        std::fs::write(d2.join("y.h"), "#define W 3\n").unwrap();
        let second = run();
        assert_ne!(first, second, "a nested header's change");
        // A header appears earlier in the search order (d1 before d2).
        std::fs::write(d1.join("x.h"), "#define V 2\n").unwrap();
        let third = run();
        assert_ne!(second, third, "a header that shadows another");
        // A header appears in the program's own directory.
        std::fs::write(root.join("x.h"), "#define V 9\n").unwrap();
        assert_ne!(third, run(), "a header beside the program");
        // The source's own directory is not searched with --no-source-include.
        let mut o2 = opts.clone();
        o2.push("--no-source-include".into());
        let without = digest(scan(&name, src, &[], &o2));
        std::fs::write(root.join("x.h"), "#define V 10\n").unwrap();
        assert_eq!(without, digest(scan(&name, src, &[], &o2)));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn in_memory_headers_are_scanned_and_conditional_includes_followed() {
        let root = temp_dir("memory");
        std::fs::write(root.join("z.h"), "int z;\n").unwrap();
        let opts = vec![format!("-I{}", root.display())];
        let headers = vec![(
            "m.h".to_string(),
            "#ifdef NEVER\n#include <z.h>\n#endif\n".to_string(),
        )];
        let a = digest(scan("p.cu", "#include \"m.h\"\n", &headers, &opts));
        std::fs::write(root.join("z.h"), "int z2;\n").unwrap();
        let b = digest(scan("p.cu", "#include \"m.h\"\n", &headers, &opts));
        assert_ne!(a, b, "a file behind an #ifdef in an in-memory header");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn include_cycles_end_and_limits_hold() {
        let root = temp_dir("cycle");
        std::fs::write(root.join("a.h"), "#include \"b.h\"\n").unwrap();
        std::fs::write(root.join("b.h"), "#include \"a.h\"\n").unwrap();
        let opts = vec![format!("-I{}", root.display())];
        match scan("p.cu", "#include <a.h>\n", &[], &opts) {
            Scan::Complete { files, .. } => assert_eq!(files, 2),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn pre_included_files_are_keyed() {
        let root = temp_dir("pre");
        let f = root.join("pre.h");
        std::fs::write(&f, "#define A 1\n").unwrap();
        let opts = vec![format!("--pre-include={}", f.display())];
        let a = digest(scan("p.cu", "", &[], &opts));
        std::fs::write(&f, "#define A 2\n").unwrap();
        assert_ne!(a, digest(scan("p.cu", "", &[], &opts)));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
