//! Build script of `cuda-nccl-sys`.
//!
//! 1. Finds `nccl.h` (`NCCL_INCLUDE_DIR`, then the CUDA include directories). `nccl.h` includes
//!    `cuda_runtime.h` for `cudaStream_t` alone: `shim/` provides that, so the bindings need no
//!    toolkit and do not change with its version.
//! 2. Runs bindgen over `wrapper.h` and turns the extern declarations into a function table
//!    (`NcclTable`) and `Nccl` methods that return `Err(MissingSymbol)` instead of panicking
//!    when the loaded library lacks an entry point.
//! 3. Without headers or libclang, or with `DOCS_RS` or `CUDA_NCCL_SYS_USE_SNAPSHOT` set, uses
//!    the checked-in snapshot `src/generated/nccl.rs` and says so with a `cargo:warning`.
//!
//! The generated file goes to `$OUT_DIR/nccl.rs`; `cargo xtask nccl-bindings` copies it over
//! the snapshot, and `cargo xtask ci` checks that the two are identical.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Variables naming a CUDA installation, tried after `NCCL_INCLUDE_DIR`. `CUDA_INCLUDE_DIR`
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
    "NCCL_INCLUDE_DIR",
    "DOCS_RS",
    "CUDA_NCCL_SYS_USE_SNAPSHOT",
    "LIBCLANG_PATH",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-changed=src/generated/nccl.rs");
    for var in CUDA_ENV_VARS.iter().chain(OTHER_ENV_VARS) {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=cuda-nccl-sys: OUT_DIR is not set");
        return;
    };
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let snapshot = manifest_dir.join("src/generated/nccl.rs");
    let out = out_dir.join("nccl.rs");

    let docs_rs = env::var_os("DOCS_RS").is_some();
    let forced = env::var_os("CUDA_NCCL_SYS_USE_SNAPSHOT").is_some();
    let dirs = include_dirs();
    let nccl_dir = dirs.iter().find(|d| d.join("nccl.h").is_file()).cloned();
    let generated = if docs_rs {
        Err("DOCS_RS is set".to_string())
    } else if forced {
        Err("CUDA_NCCL_SYS_USE_SNAPSHOT is set".to_string())
    } else {
        match &nccl_dir {
            None => Err(format!(
                "nccl.h not found (looked in NCCL_INCLUDE_DIR, {} and {})",
                CUDA_ENV_VARS.join(", "),
                STANDARD_INCLUDE_DIRS.join(", ")
            )),
            Some(n) => generate(&manifest_dir, n),
        }
    };
    let written = match generated {
        Ok(code) => fs::write(&out, code).map(|()| {
            let dir = nccl_dir.as_deref().unwrap_or(Path::new("?"));
            println!(
                "cargo:rustc-env=CUDA_NCCL_SYS_BINDINGS_SOURCE=bindgen over {}",
                dir.display()
            );
            println!("cargo:rerun-if-changed={}", dir.join("nccl.h").display());
        }),
        Err(why) => {
            println!("cargo:warning=cuda-nccl-sys: using the checked-in bindings snapshot ({why})");
            println!("cargo:rustc-env=CUDA_NCCL_SYS_BINDINGS_SOURCE=snapshot ({why})");
            fs::copy(&snapshot, &out).map(|_| ())
        }
    };
    if let Err(e) = written {
        // Without the file the crate cannot compile; say why loudly.
        println!(
            "cargo:warning=cuda-nccl-sys: could not write {}: {e}",
            out.display()
        );
    }
}

/// `NCCL_INCLUDE_DIR`, then the CUDA variables, then the standard places.
fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("NCCL_INCLUDE_DIR")
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
fn generate(manifest_dir: &Path, nccl_dir: &Path) -> Result<String, String> {
    let wrapper = manifest_dir
        .join("wrapper.h")
        .to_string_lossy()
        .into_owned();
    // The shim comes first so that a toolkit's cuda_runtime.h beside nccl.h is not used.
    let args = vec![
        format!("-I{}", manifest_dir.join("shim").display()),
        format!("-I{}", nccl_dir.display()),
    ];
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(move || {
        bindgen::Builder::default()
            .header(wrapper)
            .clang_args(args)
            .allowlist_function("nccl.*")
            .allowlist_type("nccl.*")
            .allowlist_var("NCCL_.*")
            // Values NCCL hands back may be ones this header does not know: never a Rust enum.
            .default_enum_style(bindgen::EnumVariation::NewType {
                is_bitfield: false,
                is_global: false,
            })
            .must_use_type("ncclResult_t")
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
    function_table(file)
}

/// Replaces bindgen's `extern "C"` block with: a `pfn` module of function pointer types, the
/// `NCCL_ENTRY_POINTS` list, `NcclTable` and one `Nccl` method per entry point.
fn function_table(file: syn::File) -> Result<String, String> {
    use quote::{format_ident, quote};
    let mut kept = Vec::new();
    let mut fns = Vec::new();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(m) => fns.extend(m.items.into_iter().filter_map(|f| match f {
                syn::ForeignItem::Fn(f) => Some(f),
                _ => None,
            })),
            other => kept.push(other),
        }
    }
    fns.sort_by(|a, b| a.sig.ident.cmp(&b.sig.ident));
    let mut pfns = Vec::new();
    let mut entries = Vec::new();
    let mut fields = Vec::new();
    let mut inits = Vec::new();
    let mut methods = Vec::new();
    for (index, f) in fns.iter().enumerate() {
        let symbol = f.sig.ident.to_string();
        let name = format_ident!("{}", symbol);
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
        let c_name = std::ffi::CString::new(symbol.clone()).map_err(|e| e.to_string())?;
        let sym_lit = syn::LitCStr::new(&c_name, proc_macro2::Span::call_site());
        let doc = format!(" `{symbol}`.");
        pfns.push(quote! {
            #[doc = #doc]
            pub type #name = unsafe extern "C" fn(#inputs) #output;
        });
        entries.push(quote! { #sym_lit });
        fields.push(quote! {
            #[doc = #doc]
            pub #name: Option<pfn::#name>
        });
        inits.push(quote! {
            // SAFETY: the resolver returns null or the address of the exported symbol, whose C
            // signature is the one bindgen read from nccl.h.
            #name: unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, Option<pfn::#name>>(resolve(NCCL_ENTRY_POINTS[#index])) }
        });
        let method_doc = format!(
            " Calls `{symbol}`; `Err(MissingSymbol)` when the loaded library lacks it.\n\n # Safety\n\n The arguments must satisfy NCCL's contract for `{symbol}`."
        );
        methods.push(quote! {
            #[doc = #method_doc]
            #[inline]
            pub unsafe fn #name(&self, #inputs) -> Result<#ret_ty, MissingSymbol> {
                match self.table.#name {
                    // SAFETY: the caller upholds NCCL's contract for this call.
                    Some(__nccl_fn) => Ok(unsafe { __nccl_fn(#(#args),*) }),
                    None => Err(MissingSymbol { name: #symbol }),
                }
            }
        });
    }
    let count = fns.len();
    let tokens = quote! {
        #(#kept)*

        /// Function pointer types of every NCCL entry point.
        pub mod pfn {
            #[allow(unused_imports)]
            use super::*;
            #(#pfns)*
        }

        /// Number of entry points in [`NcclTable`].
        pub const NCCL_ENTRY_POINT_COUNT: usize = #count;

        /// Every entry point's exported symbol.
        pub static NCCL_ENTRY_POINTS: [&::core::ffi::CStr; #count] = [#(#entries),*];

        /// NCCL's entry points, resolved once when the library is loaded. `None` marks one the
        /// loaded library does not have (an older NCCL than the header).
        #[derive(Clone, Copy)]
        pub struct NcclTable {
            #(#fields,)*
        }

        impl NcclTable {
            /// Fills the table, asking `resolve` for each entry of [`NCCL_ENTRY_POINTS`].
            ///
            /// # Safety
            ///
            /// `resolve` must return null or the address of a function with the signature
            /// bindgen declared for that symbol.
            pub unsafe fn resolve(mut resolve: impl FnMut(&::core::ffi::CStr) -> *mut ::core::ffi::c_void) -> Self {
                Self { #(#inits,)* }
            }
        }

        impl Nccl {
            #(#methods)*
        }
    };
    let file: syn::File =
        syn::parse2(tokens).map_err(|e| format!("generated tokens do not parse: {e}"))?;
    let mut out = String::from("// @generated by cuda-nccl-sys/build.rs from nccl.h; `cargo xtask nccl-bindings` refreshes the snapshot.\n");
    out.push_str(&prettyplease::unparse(&file));
    Ok(out)
}
