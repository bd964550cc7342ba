//! `include/cuda_mempool.h` and the library agree: the header declares exactly the
//! exported functions, each with the C types of its Rust signature, and the built shared
//! library exports every one of them under its plain C name.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;

use cudars_mempool_capi::EXPORTED_FUNCTIONS;

type Stream = *mut c_void;

/// For each export: the C prototype the header must declare, as `return(param types)` with names
/// left out, and its Rust function type (checked by the compiler against the crate).
macro_rules! exports {
    ($($name:ident = $c:literal : $fnty:ty;)*) => {
        const TABLE: &[(&str, &str)] = &[$((stringify!($name), $c)),*];

        #[test]
        fn rust_signatures_are_the_ones_listed() {
            $( let _: $fnty = cudars_mempool_capi::$name; )*
        }
    };
}

exports! {
    cuda_mempool_alloc = "void*(size_t,int,cuda_mempool_stream_t)":
        unsafe extern "C" fn(usize, c_int, Stream) -> *mut c_void;
    cuda_mempool_free = "void(void*)":
        unsafe extern "C" fn(*mut c_void);
    cuda_mempool_record_stream = "int(void*,cuda_mempool_stream_t)":
        unsafe extern "C" fn(*mut c_void, Stream) -> c_int;
    cuda_mempool_last_oom = "int(int64_t*,int64_t*,int64_t*,int64_t*)":
        unsafe extern "C" fn(*mut i64, *mut i64, *mut i64, *mut i64) -> c_int;
    cuda_mempool_last_context_lost = "int(int*,int*)":
        unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
    // The C++ trampoline (src/torch_alloc.cpp) behind a Rust "C-unwind" wrapper: it throws.
    cuda_mempool_torch_alloc = "void*(ssize_t,int,cuda_mempool_stream_t)":
        unsafe extern "C-unwind" fn(isize, c_int, Stream) -> *mut c_void;
    cuda_mempool_torch_free = "void(void*,ssize_t,int,cuda_mempool_stream_t)":
        unsafe extern "C" fn(*mut c_void, isize, c_int, Stream);
    cuda_mempool_torch_begin_allocate_to_pool = "void(int,uint64_t,uint64_t,void*)":
        extern "C" fn(c_int, u64, u64, *mut c_void);
    cuda_mempool_torch_end_allocate_to_pool = "void(int,uint64_t,uint64_t)":
        unsafe extern "C" fn(c_int, u64, u64);
    cuda_mempool_torch_release_pool = "void(int,uint64_t,uint64_t)":
        extern "C" fn(c_int, u64, u64);
    cuda_mempool_torch_announce_captures = "int(void)":
        unsafe extern "C" fn() -> c_int;
    cuda_mempool_cupy_malloc = "void*(void*,size_t,int)":
        extern "C-unwind" fn(*mut c_void, usize, c_int) -> *mut c_void;
    cuda_mempool_cupy_free = "void(void*,void*,int)":
        unsafe extern "C" fn(*mut c_void, *mut c_void, c_int);
    cuda_mempool_set_current_stream = "int(int,cuda_mempool_stream_t)":
        unsafe extern "C" fn(c_int, Stream) -> c_int;
    cuda_mempool_cupy_set_stream_hooks = "int(cuda_mempool_cupy_stream_fn,cuda_mempool_cupy_device_stream_fn,cuda_mempool_cupy_hold_fn,cuda_mempool_cupy_release_fn,cuda_mempool_cupy_make_error_fn,cuda_mempool_cupy_set_error_fn)":
        unsafe extern "C" fn(
            Option<cudars_mempool_capi::cupy::CurrentStreamFn>,
            Option<cudars_mempool_capi::cupy::DeviceStreamFn>,
            Option<cudars_mempool_capi::cupy::HoldStreamFn>,
            Option<cudars_mempool_capi::cupy::ReleaseStreamFn>,
            Option<cudars_mempool_capi::cupy::MakeErrorFn>,
            Option<cudars_mempool_capi::cupy::SetErrorFn>,
        ) -> c_int;
    cuda_mempool_cupy_set_error_release = "int(cuda_mempool_cupy_decref_fn)":
        unsafe extern "C" fn(Option<cudars_mempool_capi::cupy::DecRefFn>) -> c_int;
    // May throw a C++ exception (with the error hooks registered): "C-unwind".
    cuda_mempool_cupy_stream_malloc = "void*(void*,size_t,int)":
        extern "C-unwind" fn(*mut c_void, usize, c_int) -> *mut c_void;
    cuda_mempool_cupy_held_streams = "int64_t(void)":
        extern "C" fn() -> i64;
    cuda_mempool_used_bytes = "int64_t(int)":
        extern "C" fn(c_int) -> i64;
    cuda_mempool_reserved_bytes = "int64_t(int)":
        extern "C" fn(c_int) -> i64;
    cuda_mempool_free_bytes = "int64_t(int)":
        extern "C" fn(c_int) -> i64;
    cuda_mempool_peak_reserved_bytes = "int64_t(int)":
        extern "C" fn(c_int) -> i64;
    cuda_mempool_n_free_blocks = "int64_t(void)":
        extern "C" fn() -> i64;
    cuda_mempool_live_allocations = "int64_t(void)":
        extern "C" fn() -> i64;
    cuda_mempool_free_all_blocks = "int(void)":
        extern "C" fn() -> c_int;
    cuda_mempool_set_limit = "int(int,size_t)":
        extern "C" fn(c_int, usize) -> c_int;
    cuda_mempool_get_limit = "int64_t(int)":
        extern "C" fn(c_int) -> i64;
    cuda_mempool_history_start = "int(size_t)":
        extern "C" fn(usize) -> c_int;
    cuda_mempool_history_start_backtraces = "int(size_t)":
        extern "C" fn(usize) -> c_int;
    cuda_mempool_history_stop = "int(void)":
        extern "C" fn() -> c_int;
    cuda_mempool_history_dump = "int(const char*,int)":
        unsafe extern "C" fn(*const c_char, c_int) -> c_int;
    cuda_mempool_last_error = "const char*(void)":
        extern "C" fn() -> *const c_char;
    cuda_mempool_clear_error = "void(void)":
        extern "C" fn();
}

fn header_text() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/cuda_mempool.h");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The header without its comments.
fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find("*/") {
            Some(end) => &rest[start + end + 2..],
            None => "",
        };
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A C type with the parameter name (if any) removed, spaces normalised, `*` attached.
fn c_type(text: &str, drop_name: bool) -> String {
    let spaced = text.replace('*', " * ");
    let mut tokens: Vec<&str> = spaced.split_whitespace().collect();
    let is_ident = |t: &str| t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if drop_name && tokens.len() >= 2 && tokens.last().is_some_and(|t| is_ident(t)) {
        tokens.pop();
    }
    tokens.join(" ").replace(" *", "*")
}

/// Every function the header declares: name -> normalised prototype.
fn header_prototypes() -> BTreeMap<String, String> {
    let code = strip_comments(&header_text());
    let mut found = BTreeMap::new();
    for decl in code.split(';') {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(open) = decl.find('(') else { continue };
        if decl.starts_with('#') || decl.contains("typedef") || !decl.ends_with(')') {
            continue;
        }
        let head = &decl[..open];
        let Some(name_at) = head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) else {
            continue;
        };
        let name = head[name_at + 1..].to_string();
        let ret = c_type(&head[..=name_at], false);
        let params: Vec<String> = decl[open + 1..decl.len() - 1]
            .split(',')
            .map(|p| c_type(p, true))
            .collect();
        let proto = format!("{ret}({})", params.join(","));
        assert!(
            found.insert(name.clone(), proto).is_none(),
            "{name} declared twice"
        );
    }
    found
}

#[test]
fn the_header_declares_exactly_the_exports_with_their_types() {
    let header = header_prototypes();
    let expected: BTreeMap<String, String> = TABLE
        .iter()
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect();
    assert_eq!(header, expected);
    let listed: Vec<&str> = TABLE.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        listed, EXPORTED_FUNCTIONS,
        "EXPORTED_FUNCTIONS is the header's list"
    );
}

#[test]
fn the_header_parser_sees_names_and_types() {
    let p = header_prototypes();
    assert_eq!(p.len(), EXPORTED_FUNCTIONS.len());
    assert_eq!(
        p.get("cuda_mempool_torch_free").map(String::as_str),
        Some("void(void*,ssize_t,int,cuda_mempool_stream_t)")
    );
    assert_eq!(c_type("const char *", false), "const char*");
    assert_eq!(c_type(" void *ptr", true), "void*");
    assert_eq!(c_type("void", true), "void");
}

/// The cdylib Cargo built with this test binary: `cargo test` leaves it in
/// `target/<profile>/deps/`, beside the test executable.
fn cdylib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    deps.join(format!(
        "{}cudars_mempool_capi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

#[test]
fn the_shared_library_exports_every_declared_function() {
    let path = cdylib_path();
    // SAFETY: loading our own library runs no foreign initialisers beyond Rust's.
    let lib = unsafe { libloading::Library::new(&path) }
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    for name in header_prototypes().keys() {
        // SAFETY: the symbol is only looked up, never called through this type.
        let sym = unsafe { lib.get::<*const c_void>(name.as_bytes()) };
        assert!(sym.is_ok(), "{name} is not exported by {}", path.display());
    }
    // SAFETY: as above.
    let absent = unsafe { lib.get::<*const c_void>(b"cuda_mempool_no_such_function") };
    assert!(absent.is_err(), "the lookup must be able to fail");
}
