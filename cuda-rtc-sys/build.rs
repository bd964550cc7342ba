//! Build script of `cuda-rtc-sys`.
//!
//! 1. Finds `nvrtc.h` and `nvJitLink.h` (`CUDA_RTC_INCLUDE_DIR`, then the CUDA include
//!    directories, then the standard places; the two may lie in different directories, as
//!    with pip's `nvidia-cuda-nvrtc` and `nvidia-nvjitlink` wheels unpacked apart).
//! 2. Runs bindgen over `wrapper.h` and turns the extern declarations into two function tables,
//!    `NvrtcTable` and `NvJitLinkTable`, and `Nvrtc` / `NvJitLink` methods that return
//!    `Err(MissingSymbol)` instead of panicking when the loaded library lacks an entry point.
//!    nvJitLink's header declares versioned entry points (`__nvJitLinkCreate_13_0`) behind
//!    `static inline` forwarders; the table names each after its API (`nvJitLinkCreate`) and
//!    keeps the versioned symbol for the loader, which asks for it first.
//! 3. Without the headers or libclang, or with `DOCS_RS` or `CUDA_RTC_SYS_USE_SNAPSHOT` set,
//!    uses the checked-in snapshot `src/generated/rtc.rs` and says so with a `cargo:warning`.
//!
//! The generated file goes to `$OUT_DIR/rtc.rs`; `cargo xtask rtc-bindings` copies it over the
//! snapshot, and `cargo xtask ci` checks that the two are identical.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Variables naming a CUDA installation, tried after `CUDA_RTC_INCLUDE_DIR`. `CUDA_INCLUDE_DIR`
/// names the include directory itself; the others name a root whose `include/` is used.
const CUDA_ENV_VARS: &[&str] = &[
    "CUDA_INCLUDE_DIR",
    "CUDA_PATH",
    "CUDA_HOME",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
];

/// Where toolkits and distributions usually put the headers.
const STANDARD_INCLUDE_DIRS: &[&str] = &[
    "/usr/local/cuda/include",
    "/opt/cuda/include",
    "/usr/include",
];

/// Other variables the build reads.
const OTHER_ENV_VARS: &[&str] = &[
    "CUDA_RTC_INCLUDE_DIR",
    "DOCS_RS",
    "CUDA_RTC_SYS_USE_SNAPSHOT",
    "LIBCLANG_PATH",
];

const HEADERS: [&str; 2] = ["nvrtc.h", "nvJitLink.h"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=src/generated/rtc.rs");
    for var in CUDA_ENV_VARS.iter().chain(OTHER_ENV_VARS) {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=cuda-rtc-sys: OUT_DIR is not set");
        return;
    };
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let snapshot = manifest_dir.join("src/generated/rtc.rs");
    let out = out_dir.join("rtc.rs");

    let dirs = include_dirs();
    let found: Vec<Option<PathBuf>> = HEADERS
        .iter()
        .map(|h| dirs.iter().find(|d| d.join(h).is_file()).cloned())
        .collect();
    let generated = if env::var_os("DOCS_RS").is_some() {
        Err("DOCS_RS is set".to_string())
    } else if env::var_os("CUDA_RTC_SYS_USE_SNAPSHOT").is_some() {
        Err("CUDA_RTC_SYS_USE_SNAPSHOT is set".to_string())
    } else {
        match (&found[0], &found[1]) {
            (Some(nvrtc), Some(jitlink)) => generate(&manifest_dir, nvrtc, jitlink),
            _ => {
                let missing: Vec<&str> = HEADERS
                    .iter()
                    .zip(&found)
                    .filter(|(_, f)| f.is_none())
                    .map(|(h, _)| *h)
                    .collect();
                Err(format!(
                    "{} not found (looked in CUDA_RTC_INCLUDE_DIR, {} and {})",
                    missing.join(" and "),
                    CUDA_ENV_VARS.join(", "),
                    STANDARD_INCLUDE_DIRS.join(", ")
                ))
            }
        }
    };
    let written = match generated {
        Ok(code) => fs::write(&out, code).map(|()| {
            let shown: Vec<String> = found
                .iter()
                .flatten()
                .map(|d| d.display().to_string())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            println!(
                "cargo:rustc-env=CUDA_RTC_SYS_BINDINGS_SOURCE=bindgen over {}",
                shown.join(" and ")
            );
            for (h, d) in HEADERS.iter().zip(found.iter().flatten()) {
                println!("cargo:rerun-if-changed={}", d.join(h).display());
            }
        }),
        Err(why) => {
            println!("cargo:warning=cuda-rtc-sys: using the checked-in bindings snapshot ({why})");
            println!("cargo:rustc-env=CUDA_RTC_SYS_BINDINGS_SOURCE=snapshot ({why})");
            fs::copy(&snapshot, &out).map(|_| ())
        }
    };
    if let Err(e) = written {
        // Without the file the crate cannot compile; say why loudly.
        println!(
            "cargo:warning=cuda-rtc-sys: could not write {}: {e}",
            out.display()
        );
    }
}

/// `CUDA_RTC_INCLUDE_DIR`, then the CUDA variables, then the standard places.
fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("CUDA_RTC_INCLUDE_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    for var in CUDA_ENV_VARS {
        if let Some(v) = env::var_os(var) {
            let v = PathBuf::from(v);
            dirs.push(if *var == "CUDA_INCLUDE_DIR" {
                v
            } else {
                v.join("include")
            });
        }
    }
    dirs.extend(STANDARD_INCLUDE_DIRS.iter().map(PathBuf::from));
    dirs
}

/// Runs bindgen and post-processes its output. Any failure (libclang missing included, which
/// bindgen reports by panicking) becomes an `Err` so the caller falls back to the snapshot.
fn generate(manifest_dir: &Path, nvrtc_dir: &Path, jitlink_dir: &Path) -> Result<String, String> {
    let wrapper = manifest_dir
        .join("wrapper.h")
        .to_string_lossy()
        .into_owned();
    let mut args = vec![format!("-I{}", nvrtc_dir.display())];
    if jitlink_dir != nvrtc_dir {
        args.push(format!("-I{}", jitlink_dir.display()));
    }
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(move || {
        bindgen::Builder::default()
            .header(wrapper)
            .clang_args(args)
            .allowlist_function("nvrtc.*")
            .allowlist_function("__nvJitLink.*")
            .allowlist_function("nvJitLink.*")
            .allowlist_type("nvrtc.*")
            .allowlist_type("nvJitLink.*")
            .allowlist_var("NVRTC_.*")
            .allowlist_var("NVJITLINK_.*")
            // Values the libraries hand back may be ones this header does not know: never a
            // Rust enum.
            .default_enum_style(bindgen::EnumVariation::NewType {
                is_bitfield: false,
                is_global: false,
            })
            .must_use_type("nvrtcResult")
            .must_use_type("nvJitLinkResult")
            .derive_default(true)
            .derive_eq(true)
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
    let file: syn::File =
        syn::parse_str(&bindings.to_string()).map_err(|e| format!("parse bindgen output: {e}"))?;
    function_tables(file)
}

/// `__nvJitLinkCreate_13_0` -> (`nvJitLinkCreate`, `13_0`); other names are their own API.
fn api_name(symbol: &str) -> (String, Option<String>) {
    if let Some(rest) = symbol.strip_prefix("__") {
        let parts: Vec<&str> = rest.rsplitn(3, '_').collect();
        if parts.len() == 3
            && parts[0].chars().all(|c| c.is_ascii_digit())
            && parts[1].chars().all(|c| c.is_ascii_digit())
        {
            return (
                parts[2].to_string(),
                Some(format!("{}_{}", parts[1], parts[0])),
            );
        }
    }
    (symbol.to_string(), None)
}

/// One library's share of the generated code.
struct Table {
    /// `Nvrtc` or `NvJitLink`: the loader type the methods go on.
    owner: &'static str,
    /// The prefix of its constants (`NVRTC`, `NVJITLINK`).
    prefix: &'static str,
    /// `nvrtc.h` or `nvJitLink.h`, for the docs.
    header: &'static str,
    fns: Vec<(String, String, syn::ForeignItemFn)>,
}

/// Replaces bindgen's `extern "C"` block with, for each library: a `pfn` module of function
/// pointer types, the entry-point list, the table and one method per entry point.
fn function_tables(file: syn::File) -> Result<String, String> {
    use quote::{format_ident, quote};
    let mut kept = Vec::new();
    let mut nvrtc = Table {
        owner: "Nvrtc",
        prefix: "NVRTC",
        header: "nvrtc.h",
        fns: Vec::new(),
    };
    let mut jitlink = Table {
        owner: "NvJitLink",
        prefix: "NVJITLINK",
        header: "nvJitLink.h",
        fns: Vec::new(),
    };
    let mut abi: Option<String> = None;
    for item in file.items {
        match item {
            syn::Item::ForeignMod(m) => {
                for f in m.items {
                    let syn::ForeignItem::Fn(f) = f else { continue };
                    let symbol = f.sig.ident.to_string();
                    let (api, version) = api_name(&symbol);
                    if let Some(v) = version {
                        abi = Some(v);
                    }
                    if api.starts_with("nvrtc") {
                        nvrtc.fns.push((api, symbol, f));
                    } else if api.starts_with("nvJitLink") {
                        jitlink.fns.push((api, symbol, f));
                    }
                }
            }
            other => kept.push(other),
        }
    }
    let abi = abi.unwrap_or_default();
    let mut pfns = Vec::new();
    let mut rest = Vec::new();
    for table in [&mut nvrtc, &mut jitlink] {
        table.fns.sort_by(|a, b| a.0.cmp(&b.0));
        let mut entries = Vec::new();
        let mut fields = Vec::new();
        let mut inits = Vec::new();
        let mut methods = Vec::new();
        for (index, (api, symbol, f)) in table.fns.iter().enumerate() {
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
            let api_c = std::ffi::CString::new(api.clone()).map_err(|e| e.to_string())?;
            let sym_c = std::ffi::CString::new(symbol.clone()).map_err(|e| e.to_string())?;
            let api_lit = syn::LitCStr::new(&api_c, proc_macro2::Span::call_site());
            let sym_lit = syn::LitCStr::new(&sym_c, proc_macro2::Span::call_site());
            let doc = if api == symbol {
                format!(" `{api}`.")
            } else {
                format!(" `{api}` (exported as `{symbol}` by the header's library version).")
            };
            pfns.push(quote! {
                #[doc = #doc]
                pub type #name = unsafe extern "C" fn(#inputs) #output;
            });
            entries.push(quote! { EntryPoint { api: #api_lit, symbol: #sym_lit } });
            fields.push(quote! {
                #[doc = #doc]
                pub #name: Option<pfn::#name>
            });
            let list = format_ident!("{}_ENTRY_POINTS", table.prefix);
            inits.push(quote! {
                // SAFETY: the resolver returns null or the address of the exported symbol, whose
                // C signature is the one bindgen read from the header.
                #name: unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, Option<pfn::#name>>(resolve(&#list[#index])) }
            });
            let method_doc = format!(
                " Calls `{api}`; `Err(MissingSymbol)` when the loaded library lacks it.\n\n # Safety\n\n The arguments must satisfy the contract of `{api}` in `{}`.",
                table.header
            );
            methods.push(quote! {
                #[doc = #method_doc]
                #[inline]
                pub unsafe fn #name(&self, #inputs) -> Result<#ret_ty, MissingSymbol> {
                    match self.table.#name {
                        // SAFETY: the caller upholds the library's contract for this call.
                        Some(__rtc_fn) => Ok(unsafe { __rtc_fn(#(#args),*) }),
                        None => Err(MissingSymbol { name: #api }),
                    }
                }
            });
        }
        let count = table.fns.len();
        let list = format_ident!("{}_ENTRY_POINTS", table.prefix);
        let count_name = format_ident!("{}_ENTRY_POINT_COUNT", table.prefix);
        let table_name = format_ident!("{}Table", table.owner);
        let owner = format_ident!("{}", table.owner);
        let list_doc = format!(" Every entry point of `{}`.", table.header);
        let count_doc = format!(" Number of entry points in [`{table_name}`].");
        let table_doc = format!(
            " The entry points of `{}`, resolved once when the library is loaded. `None` marks one the loaded library does not have (older than the header).",
            table.header
        );
        rest.push(quote! {
            #[doc = #count_doc]
            pub const #count_name: usize = #count;

            #[doc = #list_doc]
            pub static #list: [EntryPoint; #count] = [#(#entries),*];

            #[doc = #table_doc]
            #[derive(Clone, Copy)]
            pub struct #table_name {
                #(#fields,)*
            }

            impl #table_name {
                /// Fills the table, asking `resolve` for each entry of the entry-point list.
                ///
                /// # Safety
                ///
                /// `resolve` must return null or the address of a function with the signature
                /// bindgen declared for that entry point.
                pub unsafe fn resolve(mut resolve: impl FnMut(&EntryPoint) -> *mut ::core::ffi::c_void) -> Self {
                    Self { #(#inits,)* }
                }
            }

            impl #owner {
                #(#methods)*
            }
        });
    }
    let tokens = quote! {
        #(#kept)*

        /// The library version of nvJitLink's versioned entry points in the header
        /// (`13_0` for `__nvJitLinkCreate_13_0`).
        pub const NVJITLINK_HEADER_ABI: &str = #abi;

        /// One entry point: the API name, and the symbol the header declares for it (the same
        /// name, except for nvJitLink's versioned ones).
        #[derive(Debug, Clone, Copy)]
        pub struct EntryPoint {
            /// The API name (`nvJitLinkCreate`).
            pub api: &'static ::core::ffi::CStr,
            /// The symbol of the header's library version (`__nvJitLinkCreate_13_0`).
            pub symbol: &'static ::core::ffi::CStr,
        }

        /// Function pointer types of every entry point.
        pub mod pfn {
            #[allow(unused_imports)]
            use super::*;
            #(#pfns)*
        }

        #(#rest)*
    };
    let file: syn::File =
        syn::parse2(tokens).map_err(|e| format!("generated tokens do not parse: {e}"))?;
    let mut out = String::from("// @generated by cuda-rtc-sys/build.rs from nvrtc.h and nvJitLink.h; `cargo xtask rtc-bindings` refreshes the snapshot.\n");
    out.push_str(&prettyplease::unparse(&file));
    Ok(out)
}
