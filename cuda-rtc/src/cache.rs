//! [`Cache`]: compiled programs kept in memory and on disk, safe across processes.
//!
//! An entry is keyed by a SHA-256 over everything that decides the compiler's output: the
//! program's name and source, every in-memory header (name and text, in order), every option
//! (in order), the name expressions, every file on disk that the program's `#include`s can
//! reach (each candidate path and its content's hash: see [`crate::includes`]), the
//! compiler's version, the architecture and the kind of output. Change any of them and the
//! key changes. A program whose includes cannot be resolved without the preprocessor (a
//! computed `#include MACRO`) is compiled every time and never cached
//! ([`CacheStats::uncacheable`]).
//!
//! **Whom the disk cache trusts.** A cubin read from disk goes to the driver's loader, which
//! does not survive crafted bytes (see `cudars_core::Module::from_cubin`). The cache
//! therefore reads and writes only a directory owned by the effective user that no other user
//! may write (mode without group or other write bits; it is created `0700`, and a directory of
//! this user's that others may write loses those bits), and loads only
//! entries that are regular files (not symbolic links), owned by that user, writable by no
//! one else. Anything else is counted in [`CacheStats::untrusted`] and never loaded, and
//! an untrusted directory is not written either (memory only). The checksum beside it finds
//! accidental damage (a torn write, a flipped bit); it is not a signature: whoever can write
//! files as this user can plant an entry, as they could plant a library. (These checks exist on
//! Unix; elsewhere the directory is trusted as it is.)
//!
//! On disk each entry is one file, `<key>.rtc`, in the cache directory:
//!
//! ```text
//! "CUDARTC\0" | format u32 | key [32] | payload length u64 | payload | SHA-256 of all before [32]
//! payload: output u8 | arch major u32, minor u32, suffix u8 | image | log | lowered names
//!          (byte strings as u64 length + bytes; lowered names as a u32 count of pairs)
//! ```
//!
//! A writer writes a temporary file in the same directory (`.<key>.<pid>.<n>.tmp`), syncs it
//! and renames it over `<key>.rtc`: a reader sees the old file or the new one, never a part,
//! and processes writing the same entry at once all succeed, leaving one valid file. A reader
//! checks magic, format, key, length and checksum; an entry that fails any of them (a torn
//! write from a crash, a truncated copy, a flipped bit) is counted as corrupt, never loaded,
//! and the program is compiled again and the entry rewritten.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

use crate::arch::Arch;
use crate::output::Output;

/// The variable naming the disk cache's directory; set and empty turns the disk cache off.
pub const CACHE_DIR_ENV: &str = "CUDA_RTC_CACHE_DIR";

/// The first bytes of every entry file.
const MAGIC: &[u8; 8] = b"CUDARTC\0";
/// The entry format; part of the key too, so a new format never reads an old file.
const FORMAT: u32 = 1;
/// Extension of entry files.
const EXTENSION: &str = "rtc";

/// An entry's key: SHA-256 over what decides the compiler's output (see the [module](self)).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// The key as 64 lowercase hex digits (the entry's file name, less `.rtc`).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CacheKey({})", self.hex())
    }
}

/// What a key is made of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyInputs<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub headers: &'a [(String, String)],
    pub options: &'a [String],
    pub name_expressions: &'a [String],
    /// The digest of what the includes reach on disk ([`crate::includes`]).
    pub disk: [u8; 32],
    pub compiler: (u32, u32),
    pub arch: Arch,
    pub output: Output,
}

/// Feeds `bytes` with its length first, so no two sequences of fields hash alike.
fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

impl KeyInputs<'_> {
    pub(crate) fn key(&self) -> CacheKey {
        let mut h = Sha256::new();
        h.update(MAGIC);
        h.update(FORMAT.to_le_bytes());
        field(&mut h, self.name.as_bytes());
        field(&mut h, self.source.as_bytes());
        h.update((self.headers.len() as u64).to_le_bytes());
        for (name, text) in self.headers {
            field(&mut h, name.as_bytes());
            field(&mut h, text.as_bytes());
        }
        h.update((self.options.len() as u64).to_le_bytes());
        for o in self.options {
            field(&mut h, o.as_bytes());
        }
        h.update((self.name_expressions.len() as u64).to_le_bytes());
        for e in self.name_expressions {
            field(&mut h, e.as_bytes());
        }
        h.update(self.disk);
        h.update(self.compiler.0.to_le_bytes());
        h.update(self.compiler.1.to_le_bytes());
        field(&mut h, self.arch.sm().as_bytes());
        h.update([self.output.code()]);
        CacheKey(h.finalize().into())
    }
}

/// A compiled program as the cache keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub output: Output,
    pub arch: Arch,
    pub image: Vec<u8>,
    pub log: String,
    pub lowered: Vec<(String, String)>,
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads what [`Entry::encode`] wrote, with bounds checked at every step.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

impl Entry {
    /// The entry file's bytes for `key`.
    pub(crate) fn encode(&self, key: &CacheKey) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.image.len() + self.log.len() + 64);
        payload.push(self.output.code());
        payload.extend_from_slice(&self.arch.major.to_le_bytes());
        payload.extend_from_slice(&self.arch.minor.to_le_bytes());
        payload.push(self.arch.suffix.map_or(0, |c| c as u8));
        put_bytes(&mut payload, &self.image);
        put_bytes(&mut payload, self.log.as_bytes());
        payload.extend_from_slice(&(self.lowered.len() as u32).to_le_bytes());
        for (expr, lowered) in &self.lowered {
            put_bytes(&mut payload, expr.as_bytes());
            put_bytes(&mut payload, lowered.as_bytes());
        }
        let mut out = Vec::with_capacity(payload.len() + 96);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&key.0);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&payload);
        let sum: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&sum);
        out
    }

    /// The entry in `bytes`, or `None` when they are not a whole, intact entry for `key`.
    pub(crate) fn decode(bytes: &[u8], key: &CacheKey) -> Option<Entry> {
        let body_len = bytes.len().checked_sub(32)?;
        let (body, sum) = bytes.split_at(body_len);
        let mut r = Reader { b: body };
        if r.take(8)? != MAGIC || r.u32()? != FORMAT || r.take(32)? != key.0 {
            return None;
        }
        if usize::try_from(r.u64()?).ok()? != r.b.len() {
            return None;
        }
        let want: [u8; 32] = Sha256::digest(body).into();
        if want.as_slice() != sum {
            return None;
        }
        let output = Output::from_code(r.u8()?)?;
        let (major, minor) = (r.u32()?, r.u32()?);
        let suffix = match r.u8()? {
            0 => None,
            c => Some(c as char),
        };
        let image = r.bytes()?.to_vec();
        let log = r.string()?;
        let n = r.u32()?;
        let mut lowered = Vec::new();
        for _ in 0..n {
            lowered.push((r.string()?, r.string()?));
        }
        if !r.b.is_empty() {
            return None;
        }
        Some(Entry {
            output,
            arch: Arch {
                major,
                minor,
                suffix,
            },
            image,
            log,
            lowered,
        })
    }
}

/// Where a compiled program came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// NVRTC compiled it just now.
    Compiled,
    /// This process's memory cache.
    Memory,
    /// The disk cache (another process, or an earlier run, compiled it).
    Disk,
}

/// Counters of a [`Cache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served from memory.
    pub memory_hits: u64,
    /// Lookups served from disk.
    pub disk_hits: u64,
    /// Lookups that found nothing usable (the program was then compiled).
    pub misses: u64,
    /// Disk entries found corrupted or truncated (never loaded; compiled again and rewritten).
    pub corrupt: u64,
    /// Entries written to disk.
    pub writes: u64,
    /// Disk writes that failed (the compile still succeeded).
    pub write_failures: u64,
    /// Compiles that could not be cached: the program's includes could not be resolved
    /// without the preprocessor, or a file they reach changed while NVRTC ran.
    pub uncacheable: u64,
    /// Disk entries or directories refused as untrusted (owned by another user, writable by
    /// another user, or not a regular file): never loaded.
    pub untrusted: u64,
}

#[derive(Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    writes: AtomicU64,
    write_failures: AtomicU64,
    uncacheable: AtomicU64,
    untrusted: AtomicU64,
}

/// Compiled programs in memory (per process) and on disk (per user; shared by processes).
///
/// [`Cache::global`] is the one [`Program::compile`](crate::Program::compile) uses unless told
/// otherwise: its directory is `$CUDA_RTC_CACHE_DIR` when set (set and empty: memory only),
/// else `$XDG_CACHE_HOME/cudars-rtc`, else `$HOME/.cache/cudars-rtc`. See the
/// [module](self) for the key, the file format and why concurrent processes are safe.
pub struct Cache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<CacheKey, Arc<Entry>>>,
    counters: Counters,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("dir", &self.dir)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A number that makes each temporary file name of this process unique.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Cache {
    /// A cache in memory and, when `dir` is given, on disk in `dir` (created on first write).
    pub fn new(dir: Option<PathBuf>) -> Cache {
        Cache {
            dir,
            memory: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// A cache in memory and in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Cache {
        Cache::new(Some(dir.into()))
    }

    /// A cache in memory only.
    pub fn memory_only() -> Cache {
        Cache::new(None)
    }

    /// The process-wide cache, in [`Cache::default_dir`].
    pub fn global() -> &'static Cache {
        static GLOBAL: OnceLock<Cache> = OnceLock::new();
        GLOBAL.get_or_init(|| Cache::new(Cache::default_dir()))
    }

    /// `$CUDA_RTC_CACHE_DIR` (`None` when set and empty), else `$XDG_CACHE_HOME/cudars-rtc`,
    /// else `$HOME/.cache/cudars-rtc`, else `None` (memory only).
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
            return (!dir.is_empty()).then(|| PathBuf::from(dir));
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|d| !d.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })?;
        Some(base.join("cudars-rtc"))
    }

    /// The disk directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The file an entry of `key` lives in, if the cache has a directory.
    pub fn entry_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{}.{EXTENSION}", key.hex())))
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            memory_hits: c.memory_hits.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            corrupt: c.corrupt.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            uncacheable: c.uncacheable.load(Ordering::Relaxed),
            untrusted: c.untrusted.load(Ordering::Relaxed),
        }
    }

    /// Counts a compile that could not be cached.
    pub(crate) fn note_uncacheable(&self) {
        self.counters.uncacheable.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets the in-memory entries (the disk keeps its own).
    pub fn clear_memory(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Entry>>> {
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The entry of `key`: from memory, else from disk (then kept in memory too), else `None`.
    pub(crate) fn get(&self, key: &CacheKey) -> Option<(Arc<Entry>, Origin)> {
        if let Some(e) = self.lock().get(key) {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Some((Arc::clone(e), Origin::Memory));
        }
        if let Some(path) = self.entry_path(key) {
            let read = match trust::read_entry(&path) {
                trust::Read::Bytes(bytes) => Some(bytes),
                trust::Read::Missing => None,
                trust::Read::Untrusted => {
                    self.counters.untrusted.fetch_add(1, Ordering::Relaxed);
                    None
                }
            };
            if let Some(bytes) = read {
                match Entry::decode(&bytes, key) {
                    Some(entry) => {
                        let entry = Arc::new(entry);
                        self.lock().insert(*key, Arc::clone(&entry));
                        self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
                        return Some((entry, Origin::Disk));
                    }
                    None => {
                        self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Keeps `entry` under `key` in memory and, best effort, on disk.
    pub(crate) fn put(&self, key: &CacheKey, entry: Entry) -> Arc<Entry> {
        let entry = Arc::new(entry);
        self.lock().insert(*key, Arc::clone(&entry));
        if let Some(path) = self.entry_path(key) {
            match write_atomically(&path, &entry.encode(key)) {
                Ok(()) => self.counters.writes.fetch_add(1, Ordering::Relaxed),
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    // An untrusted directory (see the module): memory only.
                    self.counters.untrusted.fetch_add(1, Ordering::Relaxed);
                    self.counters.write_failures.fetch_add(1, Ordering::Relaxed)
                }
                Err(_) => self.counters.write_failures.fetch_add(1, Ordering::Relaxed),
            };
        }
        entry
    }
}

/// The disk cache's trust checks (see the [module](self)).
mod trust {
    use std::fs;
    use std::io::Read as _;
    use std::path::Path;

    /// What reading an entry gave.
    pub(super) enum Read {
        Bytes(Vec<u8>),
        Missing,
        Untrusted,
    }

    /// Whether `meta` is owned by this process's effective user and writable by no one
    /// else.
    #[cfg(unix)]
    pub(super) fn owned_and_private(meta: &fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 == 0
    }

    #[cfg(not(unix))]
    pub(super) fn owned_and_private(_meta: &fs::Metadata) -> bool {
        true
    }

    /// The directory `dir` exists (created `0700` if it did not), is a directory (a symbolic
    /// link to one is followed), and is owned by this user and writable by no one else.
    pub(super) fn directory(dir: &Path, create: bool) -> std::io::Result<bool> {
        if create && !dir.exists() {
            let mut b = fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(dir)?;
        }
        let meta = fs::metadata(dir)?;
        if !meta.is_dir() {
            return Ok(false);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
            // This user's directory that others may write (an older cache made under a
            // umask of 002): take the write bits away. Entries others wrote meanwhile are
            // still refused one by one at open (owner and mode of each file).
            if meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 != 0 {
                let mode = meta.mode() & 0o7755;
                if fs::set_permissions(dir, fs::Permissions::from_mode(mode)).is_ok() {
                    let meta = fs::metadata(dir)?;
                    return Ok(meta.is_dir() && owned_and_private(&meta));
                }
            }
        }
        Ok(owned_and_private(&meta))
    }

    /// Reads the entry at `path` if its directory and the file itself pass the checks. The
    /// file is opened without following a symbolic link, and its owner and mode are read
    /// from the open file, so it cannot be swapped between the check and the read.
    pub(super) fn read_entry(path: &Path) -> Read {
        let dir = path.parent().unwrap_or(Path::new("."));
        match directory(dir, false) {
            Ok(true) => {}
            Ok(false) => return Read::Untrusted,
            Err(_) => return Read::Missing,
        }
        let mut options = fs::OpenOptions::new();
        options.read(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(
            &mut options,
            rustix::fs::OFlags::NOFOLLOW.bits() as i32,
        );
        let mut file = match options.open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Missing,
            // A symbolic link (ELOOP) or a file we may not read.
            Err(_) => return Read::Untrusted,
        };
        match file.metadata() {
            Ok(m) if m.is_file() && owned_and_private(&m) => {}
            _ => return Read::Untrusted,
        }
        let mut bytes = Vec::new();
        match file.read_to_end(&mut bytes) {
            Ok(_) => Read::Bytes(bytes),
            Err(_) => Read::Missing,
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it and renames it over `path`, so
/// readers see the old file or the new one whole. The temporary file is removed on failure.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if !trust::directory(dir, true)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the cache directory is owned or writable by another user",
        ));
    }
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(
        source: &'a str,
        headers: &'a [(String, String)],
        options: &'a [String],
        exprs: &'a [String],
    ) -> KeyInputs<'a> {
        KeyInputs {
            name: "k.cu",
            source,
            headers,
            options,
            name_expressions: exprs,
            disk: [0; 32],
            compiler: (13, 0),
            arch: Arch::new(9, 0),
            output: Output::Cubin,
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn every_input_changes_the_key() {
        let headers = vec![("a.h".to_string(), "int a;".to_string())];
        let options = s(&["-std=c++17"]);
        let exprs = s(&["f<int>"]);
        let base = inputs("src", &headers, &options, &exprs);
        let k = base.key();
        assert_eq!(k, base.key(), "the key is deterministic");
        let mut keys = vec![k];
        let h2 = vec![("a.h".to_string(), "int b;".to_string())];
        let h3 = vec![("b.h".to_string(), "int a;".to_string())];
        let h4 = vec![];
        let o2 = s(&["-std=c++20"]);
        let o3 = s(&["-std=c++17", "-DX"]);
        let e2 = s(&["f<float>"]);
        let variants = [
            inputs("src2", &headers, &options, &exprs),
            inputs("src", &h2, &options, &exprs),
            inputs("src", &h3, &options, &exprs),
            inputs("src", &h4, &options, &exprs),
            inputs("src", &headers, &o2, &exprs),
            inputs("src", &headers, &o3, &exprs),
            inputs("src", &headers, &options, &e2),
            KeyInputs {
                compiler: (12, 8),
                ..base
            },
            KeyInputs {
                compiler: (13, 1),
                ..base
            },
            KeyInputs {
                arch: Arch::new(8, 0),
                ..base
            },
            KeyInputs {
                arch: Arch::new(9, 0).with_suffix('a'),
                ..base
            },
            KeyInputs {
                output: Output::Ptx,
                ..base
            },
            KeyInputs {
                name: "other.cu",
                ..base
            },
            KeyInputs {
                disk: [1; 32],
                ..base
            },
        ];
        for v in variants {
            let k = v.key();
            assert!(!keys.contains(&k), "{v:?} gave a key already seen");
            keys.push(k);
        }
    }

    #[test]
    fn fields_are_length_prefixed() {
        // Moving a byte from one field to the next must not give the same key.
        let a = s(&["-DA", "B"]);
        let b = s(&["-DAB"]);
        let c = s(&["-D", "AB"]);
        let ka = inputs("x", &[], &a, &[]).key();
        let kb = inputs("x", &[], &b, &[]).key();
        let kc = inputs("x", &[], &c, &[]).key();
        assert!(ka != kb && kb != kc && ka != kc);
        let h1 = vec![("ab".to_string(), "c".to_string())];
        let h2 = vec![("a".to_string(), "bc".to_string())];
        assert_ne!(
            inputs("x", &h1, &[], &[]).key(),
            inputs("x", &h2, &[], &[]).key()
        );
    }

    fn entry() -> Entry {
        Entry {
            output: Output::Cubin,
            arch: Arch::new(9, 0).with_suffix('a'),
            image: (0..=255u8).cycle().take(5000).collect(),
            log: "warning: something".into(),
            lowered: vec![("f<int>".into(), "_Z1fIiEvv".into())],
        }
    }

    #[test]
    fn entries_round_trip_and_any_damage_is_detected() {
        let key = inputs("src", &[], &[], &[]).key();
        let e = entry();
        let bytes = e.encode(&key);
        assert_eq!(Entry::decode(&bytes, &key), Some(e));
        // Another key's file (renamed or copied) is not this entry.
        let other = inputs("other", &[], &[], &[]).key();
        assert_eq!(Entry::decode(&bytes, &other), None);
        // Every truncation, and a flipped bit anywhere, is refused.
        for len in (0..bytes.len()).step_by(97).chain([bytes.len() - 1]) {
            assert_eq!(Entry::decode(&bytes[..len], &key), None, "cut at {len}");
        }
        for at in (0..bytes.len()).step_by(53) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_eq!(Entry::decode(&bad, &key), None, "bit flipped at {at}");
        }
        // Bytes appended after a whole entry are refused too.
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Entry::decode(&long, &key), None);
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cudars-rtc-test-{tag}-{}-{}",
            std::process::id(),
            TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_leave_one_whole_file_and_no_temporary() {
        let dir = temp_dir("atomic");
        let key = inputs("src", &[], &[], &[]).key();
        let cache = Cache::in_dir(&dir);
        cache.put(&key, entry());
        assert_eq!(files(&dir), vec![format!("{}.rtc", key.hex())]);
        // A second process (a fresh cache over the same directory) reads it from disk.
        let other = Cache::in_dir(&dir);
        let (got, origin) = other.get(&key).expect("disk hit");
        assert_eq!((*got).clone(), entry());
        assert_eq!(origin, Origin::Disk);
        assert_eq!(other.get(&key).unwrap().1, Origin::Memory);
        let st = other.stats();
        assert_eq!((st.disk_hits, st.memory_hits, st.misses), (1, 1, 0));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_writers_of_one_entry_leave_one_valid_file() {
        let dir = temp_dir("concurrent");
        let key = inputs("src", &[], &[], &[]).key();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let cache = Cache::in_dir(&dir);
                    for _ in 0..20 {
                        cache.put(&key, entry());
                        // Any reader at any moment sees a whole entry.
                        let reader = Cache::in_dir(&dir);
                        assert!(reader.get(&key).is_some());
                        assert_eq!(reader.stats().corrupt, 0);
                    }
                });
            }
        });
        assert_eq!(files(&dir), vec![format!("{}.rtc", key.hex())]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupted_and_truncated_entries_are_misses_then_rewritten() {
        let dir = temp_dir("corrupt");
        let key = inputs("src", &[], &[], &[]).key();
        Cache::in_dir(&dir).put(&key, entry());
        let path = Cache::in_dir(&dir).entry_path(&key).unwrap();
        let whole = fs::read(&path).unwrap();
        for damaged in [
            whole[..whole.len() / 2].to_vec(),
            {
                let mut b = whole.clone();
                let mid = b.len() / 2;
                b[mid] ^= 1;
                b
            },
            Vec::new(),
        ] {
            fs::write(&path, &damaged).unwrap();
            let cache = Cache::in_dir(&dir);
            assert!(
                cache.get(&key).is_none(),
                "a damaged entry is never returned"
            );
            let st = cache.stats();
            assert_eq!((st.corrupt, st.misses), (1, 1));
            // The caller compiles again and puts the entry: the file is whole again.
            cache.put(&key, entry());
            assert_eq!(fs::read(&path).unwrap(), whole);
        }
        // A temporary file left by a crashed writer is ignored.
        fs::write(dir.join(format!(".{}.1.0.tmp", key.hex())), b"partial").unwrap();
        assert!(Cache::in_dir(&dir).get(&key).is_some());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_directory_does_not_fail_the_put() {
        let file = temp_dir("notadir");
        fs::write(&file, b"a file where the directory should be").unwrap();
        let cache = Cache::in_dir(file.join("sub"));
        let key = inputs("src", &[], &[], &[]).key();
        cache.put(&key, entry());
        assert_eq!(cache.stats().write_failures, 1);
        assert!(cache.get(&key).is_some(), "still served from memory");
        fs::remove_file(&file).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn entries_and_directories_others_may_write_are_never_loaded() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = temp_dir("trust");
        let key = inputs("src", &[], &[], &[]).key();
        Cache::in_dir(&dir).put(&key, entry());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "the directory is created private");
        let path = Cache::in_dir(&dir).entry_path(&key).unwrap();
        assert_eq!(mode(&path), 0o600, "entries are written private");
        let expect_untrusted = |why: &str| {
            let c = Cache::in_dir(&dir);
            assert!(c.get(&key).is_none(), "{why}: not loaded");
            assert_eq!(c.stats().untrusted, 1, "{why}: counted");
        };
        // An entry another user may write.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        expect_untrusted("a world-writable entry");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            Cache::in_dir(&dir).get(&key).is_some(),
            "private again: loaded"
        );
        // A symbolic link in place of the entry (to a whole, valid entry elsewhere).
        let elsewhere = dir.join("elsewhere");
        fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        expect_untrusted("a symbolic link");
        fs::remove_file(&path).unwrap();
        fs::rename(&elsewhere, &path).unwrap();
        // An entry owned by another user (only root can make one).
        if rustix::process::geteuid().is_root() {
            let nobody = rustix::process::Uid::from_raw(65534);
            rustix::fs::chown(&path, Some(nobody), None).unwrap();
            expect_untrusted("another user's entry");
            rustix::fs::chown(&path, Some(rustix::process::geteuid()), None).unwrap();
        }
        // This user's directory that others may write: its write bits for others go, and
        // the entries in it are still checked one by one.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Cache::in_dir(&dir).get(&key).is_some());
        assert_eq!(mode(&dir), 0o755, "group and other write bits taken away");
        // A directory owned by another user that others may write: nothing is read from it,
        // or written to it (only root can make one here).
        if rustix::process::geteuid().is_root() {
            let nobody = rustix::process::Uid::from_raw(65534);
            rustix::fs::chown(&dir, Some(nobody), None).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
            expect_untrusted("another user's world-writable directory");
            let c = Cache::in_dir(&dir);
            let other = inputs("other", &[], &[], &[]).key();
            c.put(&other, entry());
            assert!(!c.entry_path(&other).unwrap().exists(), "not written there");
            assert_eq!((c.stats().writes, c.stats().untrusted), (0, 1));
            assert!(c.get(&other).is_some(), "still served from memory");
            rustix::fs::chown(&dir, Some(rustix::process::geteuid()), None).unwrap();
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_default_directory_follows_the_environment() {
        // Only the pure part: the variable's precedence is read at call time.
        let key = CacheKey([0xab; 32]);
        assert_eq!(key.hex().len(), 64);
        let cache = Cache::in_dir("/x/y");
        assert_eq!(
            cache.entry_path(&key).unwrap(),
            PathBuf::from(format!("/x/y/{}.rtc", "ab".repeat(32)))
        );
        assert!(Cache::memory_only().entry_path(&key).is_none());
    }
}
