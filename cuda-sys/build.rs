//! Build script of `cuda-sys`.
//!
//! 1. Finds `cuda.h` (see [`HEADER_ENV_VARS`] and [`STANDARD_INCLUDE_DIRS`]).
//! 2. Runs bindgen over `wrapper.h` (driver API + profiler control), then turns the extern
//!    declarations into a function table (`DriverTable`) and `Driver` methods that return
//!    `Err(MissingSymbol)` instead of panicking when the installed driver lacks an entry point.
//! 3. Without headers or libclang, or with `DOCS_RS` set, uses the checked-in snapshot
//!    `src/generated/driver.rs` and says so with a `cargo:warning`.
//! 4. When the NVTX3 headers are found, wraps their `static inline` functions with bindgen's
//!    `wrap_static_fns` and compiles the wrappers with `cc`; otherwise NVTX calls are no-ops.
//! 5. After 3 or a no-op NVTX, watches where headers and libclang would appear (see
//!    `watch_for_installs`), so the next build after they do runs bindgen.
//!
//! The generated driver file goes to `$OUT_DIR/driver.rs`; `cargo xtask bindings` copies it over
//! the snapshot, and `cargo xtask ci` checks that the two are identical.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a build script reports a broken build environment by panicking; cargo shows the message"
)]

use std::collections::HashMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Variables naming a CUDA installation, in the order they are tried. `CUDA_INCLUDE_DIR` names
/// the include directory itself; the others name a toolkit root whose `include/` is used.
const HEADER_ENV_VARS: &[&str] = &[
    "CUDA_INCLUDE_DIR",
    "CUDA_PATH",
    "CUDA_HOME",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
];

/// Where toolkits usually put their headers, tried after the variables.
const STANDARD_INCLUDE_DIRS: &[&str] = &[
    "/usr/local/cuda/include",
    "/opt/cuda/include",
    "/usr/include",
];

/// Other variables the build reads (`LIBCLANG_PATH` and `LLVM_CONFIG_PATH`: where bindgen's
/// `clang-sys` looks for libclang).
const OTHER_ENV_VARS: &[&str] = &[
    "DOCS_RS",
    "CUDA_SYS_USE_SNAPSHOT",
    "NVTX_INCLUDE_DIR",
    "LIBCLANG_PATH",
    "LLVM_CONFIG_PATH",
];

/// Written by `ldconfig`, which the system's package manager runs when it installs a shared
/// library: libclang, or a CUDA toolkit (its libraries come with the headers).
const LD_SO_CACHE: &str = "/etc/ld.so.cache";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=nvtx_wrapper.h");
    println!("cargo:rerun-if-changed=src/generated/driver.rs");
    for var in HEADER_ENV_VARS.iter().chain(OTHER_ENV_VARS) {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(cuda_sys_nvtx)");
    println!("cargo::rustc-check-cfg=cfg(cuda_sys_pool_max_size)");
    println!("cargo::rustc-check-cfg=cfg(cuda_sys_pool_usage)");
    println!("cargo::rustc-check-cfg=cfg(cuda_sys_mem_location_union)");
    println!("cargo::rustc-check-cfg=cfg(cuda_sys_cuda_13_4)");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let snapshot = manifest_dir.join("src/generated/driver.rs");
    let driver_out = out_dir.join("driver.rs");

    let docs_rs = env::var_os("DOCS_RS").is_some();
    let forced = env::var_os("CUDA_SYS_USE_SNAPSHOT").is_some();
    let include_dir = if docs_rs || forced {
        None
    } else {
        find_include_dir()
    };

    let generated = match (&include_dir, docs_rs, forced) {
        (_, true, _) => Err("DOCS_RS is set".to_string()),
        (_, _, true) => Err("CUDA_SYS_USE_SNAPSHOT is set".to_string()),
        (None, _, _) => Err(format!(
            "cuda.h not found (looked in {} and {})",
            HEADER_ENV_VARS.join(", "),
            STANDARD_INCLUDE_DIRS.join(", ")
        )),
        (Some(dir), _, _) => generate_driver(dir),
    };

    // Whether a header or libclang that appears later would change the outcome.
    let mut fell_back = false;
    match generated {
        Ok(code) => {
            fs::write(&driver_out, code).expect("write $OUT_DIR/driver.rs");
            let dir = include_dir
                .as_ref()
                .expect("generated implies a header dir");
            println!(
                "cargo:rustc-env=CUDA_SYS_BINDINGS_SOURCE=bindgen over {}",
                dir.display()
            );
            println!("cargo:rerun-if-changed={}", dir.join("cuda.h").display());
        }
        Err(why) => {
            fell_back = !(docs_rs || forced);
            println!("cargo:warning=cuda-sys: using the checked-in bindings snapshot ({why})");
            fs::copy(&snapshot, &driver_out).expect("copy the bindings snapshot");
            println!("cargo:rustc-env=CUDA_SYS_BINDINGS_SOURCE=snapshot ({why})");
        }
    }

    emit_layout_cfgs(&driver_out);

    // NVTX: optional, never fatal.
    let mut nvtx = false;
    if !docs_rs {
        let nvtx_dirs: Vec<PathBuf> = env::var_os("NVTX_INCLUDE_DIR")
            .map(PathBuf::from)
            .into_iter()
            .chain(include_dir.clone())
            .collect();
        if let Some(dir) = nvtx_dirs
            .iter()
            .find(|d| d.join("nvtx3/nvToolsExt.h").is_file())
        {
            println!(
                "cargo:rerun-if-changed={}",
                dir.join("nvtx3/nvToolsExt.h").display()
            );
            match build_nvtx(dir, &out_dir) {
                Ok(()) => {
                    nvtx = true;
                    println!("cargo:rustc-cfg=cuda_sys_nvtx");
                }
                Err(e) => println!(
                    "cargo:warning=cuda-sys: NVTX headers found in {} but not usable ({e}); NVTX calls are no-ops",
                    dir.display()
                ),
            }
        }
    }

    if fell_back || (!nvtx && !docs_rs) {
        watch_for_installs();
    }
}

/// After a build that used the snapshot or compiled NVTX out: makes cargo run this script
/// again when headers or libclang appear where it looked, with no change to the environment
/// or to this file. Only paths that exist are watched: cargo reruns a build script on every
/// build while a path it watches is missing (and so rebuilds every crate above this one). A
/// watched directory counts as changed when anything is added under it, whatever the added
/// files' own times (package managers keep those from the package).
///
/// - [`LD_SO_CACHE`]: libclang or a CUDA toolkit installed by the system's package manager;
/// - the directories the header variables name ([`HEADER_ENV_VARS`], `NVTX_INCLUDE_DIR`):
///   headers unpacked there (as `.ci/run` does from the wheels);
/// - `LIBCLANG_PATH`, which is then the only place `clang-sys` looks: libclang put there.
///
/// Not watched: `LD_LIBRARY_PATH` (which `clang-sys` also searches), as `cargo run` changes it
/// for the programs it starts, so a build from `cargo xtask` and one from the shell would
/// rerun this script each time; a libclang that only it finds needs `LIBCLANG_PATH`.
fn watch_for_installs() {
    let mut watched = std::collections::HashSet::new();
    let mut watch = |path: &Path| {
        if path.exists() && watched.insert(path.to_path_buf()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    };
    watch(Path::new(LD_SO_CACHE));
    for dir in env_include_dirs() {
        watch(&dir);
    }
    for var in ["NVTX_INCLUDE_DIR", "LIBCLANG_PATH"] {
        if let Some(path) = env::var_os(var).filter(|p| !p.is_empty()) {
            watch(Path::new(&path));
        }
    }
}

/// The include directories the variables of [`HEADER_ENV_VARS`] name, in order.
fn env_include_dirs() -> Vec<PathBuf> {
    HEADER_ENV_VARS
        .iter()
        .filter_map(|var| {
            let value = PathBuf::from(env::var_os(var).filter(|v| !v.is_empty())?);
            Some(if *var == "CUDA_INCLUDE_DIR" {
                value
            } else {
                value.join("include")
            })
        })
        .collect()
}

fn find_include_dir() -> Option<PathBuf> {
    env_include_dirs()
        .into_iter()
        .chain(STANDARD_INCLUDE_DIRS.iter().map(PathBuf::from))
        .find(|dir| dir.join("cuda.h").is_file())
}

/// Runs bindgen and post-processes its output. Any failure (libclang missing included, which
/// bindgen reports by panicking) becomes an `Err` so the caller falls back to the snapshot.
fn generate_driver(include_dir: &Path) -> Result<String, String> {
    let wrapper = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap()).join("wrapper.h");
    let include_arg = format!("-I{}", include_dir.display());
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(move || {
        bindgen::Builder::default()
            .header(wrapper.to_string_lossy())
            .clang_arg(include_arg)
            .allowlist_function("cu.*")
            .allowlist_type("CU.*")
            .allowlist_var("CU.*|CUDA_VERSION")
            // Values the driver hands back may be ones these headers do not know: never a
            // Rust enum. Flag sets are bitfield newtypes with `|` and `&`.
            .default_enum_style(bindgen::EnumVariation::NewType {
                is_bitfield: false,
                is_global: false,
            })
            .bitfield_enum(".*[Ff]lags.*")
            .must_use_type("cudaError_enum")
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(false)
            .size_t_is_usize(true)
            .merge_extern_blocks(true)
            .sort_semantically(true)
            .generate()
    });
    std::panic::set_hook(prev_hook);
    let bindings = match result {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(format!("bindgen failed: {e}")),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "bindgen panicked".into());
            return Err(format!(
                "bindgen could not run: {}",
                msg.lines().next().unwrap_or("")
            ));
        }
    };
    let header = fs::read_to_string(include_dir.join("cuda.h")).map_err(|e| e.to_string())?;
    let aliases = api_aliases(&header);
    let typedefs = include_dir.join("cudaTypedefs.h");
    println!("cargo:rerun-if-changed={}", typedefs.display());
    let abi_versions = match fs::read_to_string(&typedefs) {
        Ok(text) => abi_versions(&text),
        Err(e) => {
            println!(
                "cargo:warning=cuda-sys: {} unreadable ({e}): entry points carry no ABI version, so an older driver is not refused before the call",
                typedefs.display()
            );
            HashMap::new()
        }
    };
    let file: syn::File =
        syn::parse_str(&bindings.to_string()).map_err(|e| format!("parse bindgen output: {e}"))?;
    Ok(function_table(file, &aliases, &abi_versions))
}

/// `#define cuMemAlloc cuMemAlloc_v2` and `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)`:
/// maps the versioned symbol (`cuMemAlloc_v2`) to the API name (`cuMemAlloc`) that
/// `cuGetProcAddress` takes. Only `name -> name_vN` pairs count: `cuGraphInstantiate ->
/// cuGraphInstantiateWithFlags` names two different entry points.
fn api_aliases(header: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for line in header.lines() {
        let mut words = line
            .trim_start()
            .strip_prefix('#')
            .map(str::trim_start)
            .into_iter()
            .flat_map(|l| l.split_whitespace());
        if words.next() != Some("define") {
            continue;
        }
        let (Some(api), Some(target)) = (words.next(), words.next()) else {
            continue;
        };
        let target = target
            .trim_start_matches("__CUDA_API_PTDS(")
            .trim_start_matches("__CUDA_API_PTSZ(")
            .trim_end_matches(')');
        if !api.starts_with("cu") {
            continue;
        }
        if let Some(suffix) = target.strip_prefix(api).and_then(|s| s.strip_prefix("_v")) {
            if !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) {
                map.insert(target.to_string(), api.to_string());
            }
        }
    }
    map
}

/// `typedef CUresult (CUDAAPI *PFN_cuMemAdvise_v12020)(...)` in `cudaTypedefs.h`: every ABI
/// version of every API name (`cuMemAdvise -> [8000, 12020]`). `_ptds`/`_ptsz` variants carry
/// the same versions and are skipped.
fn abi_versions(typedefs: &str) -> HashMap<String, Vec<u32>> {
    let mut map: HashMap<String, Vec<u32>> = HashMap::new();
    for line in typedefs.lines() {
        let Some(rest) = line.split("*PFN_").nth(1) else {
            continue;
        };
        let Some(name) = rest.split(')').next() else {
            continue;
        };
        let Some((api, version)) = name.rsplit_once("_v") else {
            continue;
        };
        if let Ok(version) = version.parse::<u32>() {
            map.entry(api.to_string()).or_default().push(version);
        }
    }
    map
}

/// The CUDA version of the ABI of the exported `symbol`: `cuX` is the first version
/// `cudaTypedefs.h` lists for `cuX`, `cuX_vN` the N-th (`cuCtxCreate_v4`: 2.0, 3.2, 11.4, 12.5
/// -> 12.5). Checked against every 12.x and 13.0 header set: for each `#define cuX cuX_vN`,
/// the N-th version is the one `cuGetProcAddress` pairs with that declaration.
fn declared_abi(symbol: &str, abi_versions: &HashMap<String, Vec<u32>>) -> Option<u32> {
    let sorted = |api: &str| {
        let mut vs = abi_versions.get(api)?.clone();
        vs.sort_unstable();
        vs.dedup();
        Some(vs)
    };
    if let Some((base, n)) = symbol.rsplit_once("_v") {
        if let (Ok(n), Some(vs)) = (n.parse::<usize>(), sorted(base)) {
            return vs.get(n.checked_sub(1)?).copied();
        }
    }
    sorted(symbol)?.first().copied()
}

/// Replaces bindgen's `extern "C"` block with: a `pfn` module of function pointer types, the
/// `DRIVER_ENTRY_POINTS` list, `DriverTable` and one `Driver` method per entry point.
fn function_table(
    file: syn::File,
    aliases: &HashMap<String, String>,
    abi_versions: &HashMap<String, Vec<u32>>,
) -> String {
    use quote::{format_ident, quote};
    let mut kept = Vec::new();
    let mut fns = Vec::new();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(m) => {
                for f in m.items {
                    if let syn::ForeignItem::Fn(f) = f {
                        fns.push(f);
                    }
                }
            }
            other => kept.push(other),
        }
    }
    fns.sort_by(|a, b| a.sig.ident.cmp(&b.sig.ident));

    let mut pfns = Vec::new();
    let mut entries = Vec::new();
    let mut fields = Vec::new();
    let mut inits = Vec::new();
    let mut methods = Vec::new();
    // Where the header declares both `cuX` (old ABI) and a distinct `cuX_vN` (new ABI, no
    // `#define` between them: cuCtxSynchronize / cuCtxSynchronize_v2 in CUDA 13),
    // `cuGetProcAddress("cuX", CUDA_VERSION)` answers with the new ABI, which does not match
    // the plain declaration. Such pairs are resolved by their exact exported symbol instead.
    let declared: std::collections::HashSet<String> =
        fns.iter().map(|f| f.sig.ident.to_string()).collect();
    let is_version_suffix = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    let has_versioned_twin = |name: &str| -> bool {
        declared.iter().any(|other| {
            !aliases.contains_key(other)
                && other
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix("_v"))
                    .is_some_and(is_version_suffix)
        })
    };
    let is_versioned_twin = |name: &str| -> bool {
        name.rsplit_once("_v")
            .is_some_and(|(base, n)| is_version_suffix(n) && declared.contains(base))
    };
    for (index, f) in fns.iter().enumerate() {
        let symbol = f.sig.ident.to_string();
        let by_proc_address = aliases.contains_key(&symbol)
            || !(has_versioned_twin(&symbol) || is_versioned_twin(&symbol));
        let api = aliases
            .get(&symbol)
            .cloned()
            .unwrap_or_else(|| symbol.clone());
        // The CUDA version of the ABI this declaration has (see `declared_abi`). The loader asks
        // `cuGetProcAddress` for exactly that version, and refuses the entry point on an older
        // driver. Not `CUDA_VERSION`: 12.3+ headers keep `cuStreamGetCaptureInfo` on `_v2`
        // (11.3) while `cuGetProcAddress(.., 12030+)` answers with `_v3`, whose arguments differ.
        let since = declared_abi(&symbol, abi_versions);
        // A versioned symbol whose version is unknown is looked up by its exact name.
        let by_proc_address = by_proc_address && (since.is_some() || symbol == api);
        let since: u32 = since.unwrap_or(0);
        let name = format_ident!("{}", api);
        let inputs = &f.sig.inputs;
        let output = &f.sig.output;
        let ret_ty = match output {
            syn::ReturnType::Default => quote!(()),
            syn::ReturnType::Type(_, t) => quote!(#t),
        };
        let args: Vec<_> = inputs
            .iter()
            .filter_map(|a| match a {
                syn::FnArg::Typed(p) => Some(p.pat.clone()),
                _ => None,
            })
            .collect();
        let api_lit = syn::LitCStr::new(
            &std::ffi::CString::new(api.clone()).unwrap(),
            proc_macro2::Span::call_site(),
        );
        let sym_lit = syn::LitCStr::new(
            &std::ffi::CString::new(symbol.clone()).unwrap(),
            proc_macro2::Span::call_site(),
        );
        let api_str = api.clone();
        let since_lit = proc_macro2::Literal::u32_unsuffixed(since);
        let doc = if since > 0 {
            format!(
                " `{symbol}` (API name `{api}`, ABI of CUDA {}.{}).",
                since / 1000,
                since % 1000 / 10
            )
        } else {
            format!(" `{symbol}` (API name `{api}`).")
        };
        pfns.push(quote! {
            #[doc = #doc]
            pub type #name = unsafe extern "C" fn(#inputs) #output;
        });
        entries.push(quote! { EntryPoint { api: #api_lit, symbol: #sym_lit, by_proc_address: #by_proc_address, since: #since_lit } });
        fields.push(quote! {
            #[doc = #doc]
            pub #name: Option<pfn::#name>
        });
        inits.push(quote! {
            // SAFETY: the resolver returns null or the address of `symbol`, whose C signature
            // is the one bindgen read from the header, for the ABI version we asked for.
            #name: unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, Option<pfn::#name>>(resolve(&DRIVER_ENTRY_POINTS[#index])) }
        });
        let method_doc = format!(
            " Calls `{symbol}`; `Err(MissingSymbol)` when the loaded library lacks it or is older than the ABI of this binding.\n\n # Safety\n\n The arguments must satisfy the driver API's contract for `{api}`."
        );
        methods.push(quote! {
            #[doc = #method_doc]
            #[inline]
            pub unsafe fn #name(&self, #inputs) -> Result<#ret_ty, MissingSymbol> {
                match self.table.#name {
                    // SAFETY: the caller upholds the driver's contract for this call.
                    Some(__cuda_sys_fn) => Ok(unsafe { __cuda_sys_fn(#(#args),*) }),
                    None => Err(self.missing(#api_str, #since_lit)),
                }
            }
        });
    }
    let count = fns.len();
    let tokens = quote! {
        #(#kept)*

        /// Function pointer types of every driver entry point, named by API name.
        pub mod pfn {
            #[allow(unused_imports)]
            use super::*;
            #(#pfns)*
        }

        /// Number of entry points in [`DriverTable`].
        pub const DRIVER_ENTRY_POINT_COUNT: usize = #count;

        /// Every entry point: the name `cuGetProcAddress` takes and the exported symbol.
        pub static DRIVER_ENTRY_POINTS: [EntryPoint; #count] = [#(#entries),*];

        /// The driver's entry points, resolved once when the library is loaded. `None` marks
        /// one the loaded library does not have.
        #[derive(Clone, Copy)]
        pub struct DriverTable {
            #(#fields,)*
        }

        impl DriverTable {
            /// Fills the table, asking `resolve` for each entry of [`DRIVER_ENTRY_POINTS`].
            ///
            /// # Safety
            ///
            /// `resolve` must return null or the address of a function with the signature
            /// bindgen declared for that entry point.
            pub unsafe fn resolve(mut resolve: impl FnMut(&EntryPoint) -> *mut ::core::ffi::c_void) -> Self {
                Self { #(#inits,)* }
            }
        }

        impl Driver {
            #(#methods)*
        }
    };
    let file: syn::File = syn::parse2(tokens).expect("generated tokens parse");
    let mut out = String::from("// @generated by cuda-sys/build.rs from cuda.h; `cargo xtask bindings` refreshes the snapshot.\n");
    out.push_str(&prettyplease::unparse(&file));
    out
}

/// Cfgs for `cuda-sys`'s own hand-written code: which optional fields the bindings'
/// `CUmemPoolProps` has (12.0 has neither `maxSize` nor `usage`; 12.2 adds `maxSize`; 12.3
/// adds `usage`), and whether `CUmemLocation::id` sits in an anonymous union (13.2 added
/// `localized` beside it), and `cuda_sys_cuda_13_4` for bindings from CUDA 13.4+ headers (for
/// the tests that call an entry point those added). Read from the generated file, so the
/// snapshot path gets them too.
fn emit_layout_cfgs(driver_rs: &Path) {
    let Ok(text) = fs::read_to_string(driver_rs) else {
        return;
    };
    let version = text
        .split("pub const CUDA_VERSION: u32 = ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|v| v.trim().parse::<u32>().ok());
    if version.is_some_and(|v| v >= 13040) {
        println!("cargo:rustc-cfg=cuda_sys_cuda_13_4");
    }
    if let Some(start) = text.find("pub struct CUmemLocation_st {") {
        let body = text[start..].split('}').next().unwrap_or("");
        if !body.contains("pub id:") {
            println!("cargo:rustc-cfg=cuda_sys_mem_location_union");
        }
    }
    let Some(start) = text.find("pub struct CUmemPoolProps_st") else {
        return;
    };
    let body = text[start..].split('}').next().unwrap_or("");
    if body.contains("pub maxSize:") {
        println!("cargo:rustc-cfg=cuda_sys_pool_max_size");
    }
    if body.contains("pub usage:") {
        println!("cargo:rustc-cfg=cuda_sys_pool_usage");
    }
}

fn build_nvtx(include_dir: &Path, out_dir: &Path) -> Result<(), String> {
    let wrapper = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap()).join("nvtx_wrapper.h");
    let include_arg = format!("-I{}", include_dir.display());
    let extern_c = out_dir.join("nvtx_extern");
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let extern_c2 = extern_c.clone();
    let result = std::panic::catch_unwind(move || {
        bindgen::Builder::default()
            .header(wrapper.to_string_lossy())
            .clang_arg(include_arg)
            .allowlist_function("nvtxMarkA|nvtxMarkEx|nvtxRangePushA|nvtxRangePushEx|nvtxRangePop|nvtxNameOsThreadA")
            .allowlist_var("NVTX_VERSION")
            .allowlist_type("nvtxEventAttributes_t|nvtxColorType_t|nvtxMessageType_t")
            .default_enum_style(bindgen::EnumVariation::Consts)
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(false)
            .wrap_static_fns(true)
            .wrap_static_fns_path(&extern_c2)
            .generate()
    });
    std::panic::set_hook(prev_hook);
    let bindings = match result {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(format!("bindgen failed: {e}")),
        Err(_) => return Err("bindgen could not run (libclang missing?)".into()),
    };
    bindings
        .write_to_file(out_dir.join("nvtx.rs"))
        .map_err(|e| e.to_string())?;
    let c_file = extern_c.with_extension("c");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    cc::Build::new()
        .file(&c_file)
        .include(include_dir)
        .include(&manifest)
        .warnings(false)
        .try_compile("cuda_sys_nvtx")
        .map_err(|e| e.to_string())?;
    Ok(())
}
