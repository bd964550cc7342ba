//! The build-script side of a math `-sys` crate (feature `build`): one call, [`run`], with a
//! [`Spec`] that says which headers, which names and which libraries.
//!
//! 1. Finds the headers (`$<include_env>`, then `CUDA_INCLUDE_DIR`, `$CUDA_PATH/include`,
//!    `$CUDA_HOME/include`, ..., then the standard places).
//! 2. Runs bindgen over the crate's `wrapper.h` (C enums as `#[repr(transparent)]` newtypes,
//!    never Rust enums, so any value a library hands back is valid) and replaces the
//!    `extern "C"` block with, for each [`Library`]: the entry-point list, a table of
//!    `Option<fn>` filled by `dlsym`, a type that owns the opened library with one method per
//!    entry point returning `Err(MissingSymbol)` when the library lacks it, the library's
//!    [`LibrarySpec`](crate::LibrarySpec) and a process-wide accessor.
//! 3. Without the headers or libclang, or with `DOCS_RS` or `$<snapshot_env>` set, copies the
//!    checked-in snapshot `src/generated/<generated>` and says so with a `cargo:warning`.
//!
//! The crate's `BINDINGS_SOURCE` comes from `$<source_env>`: `bindgen over <dirs>` or
//! `snapshot (<why>)`; `cargo xtask` refreshes and checks the snapshot from it.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Variables naming a CUDA installation, tried after the crate's own include variable.
/// `CUDA_INCLUDE_DIR` names the include directory itself; the others a root whose `include/`
/// is used.
pub const CUDA_ENV_VARS: &[&str] = &[
    "CUDA_INCLUDE_DIR",
    "CUDA_PATH",
    "CUDA_HOME",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
];

/// Where toolkits and distributions usually put the headers.
pub const STANDARD_INCLUDE_DIRS: &[&str] = &[
    "/usr/local/cuda/include",
    "/opt/cuda/include",
    "/usr/include",
];

/// What a `-sys` crate binds.
#[derive(Debug, Clone, Copy)]
pub struct Spec<'a> {
    /// The crate's folder name, for messages (`cuda-blas-sys`).
    pub krate: &'a str,
    /// Headers that must all be found (`cublas_v2.h`).
    pub headers: &'a [&'a str],
    /// The crate's own include-directory variable, tried first.
    pub include_env: &'a str,
    /// Set: take the snapshot.
    pub snapshot_env: &'a str,
    /// The `rustc-env` variable that tells where the bindings came from.
    pub source_env: &'a str,
    /// The generated file's name, in `OUT_DIR` and in `src/generated/`.
    pub generated: &'a str,
    /// bindgen allowlists (regular expressions).
    pub functions: &'a [&'a str],
    /// Types to bind (regular expressions).
    pub types: &'a [&'a str],
    /// Constants to bind (regular expressions).
    pub vars: &'a [&'a str],
    /// Functions to leave out even though allowlisted (regular expressions).
    pub blocklist_functions: &'a [&'a str],
    /// Types marked `#[must_use]` (the status types).
    pub must_use: &'a [&'a str],
    /// The libraries, in the order their function prefixes are matched (the longer prefix
    /// first: `cublasLt` before `cublas`).
    pub libraries: &'a [Library<'a>],
}

/// One library of a `-sys` crate.
#[derive(Debug, Clone, Copy)]
pub struct Library<'a> {
    /// The owning type (`Cublas`); its table is `<owner>Table`.
    pub owner: &'a str,
    /// The accessor function (`cublas`), returning the process-wide instance.
    pub accessor: &'a str,
    /// The prefix of its constants (`CUBLAS`: `CUBLAS_ENTRY_POINTS`, `CUBLAS_LIBRARY`).
    pub prefix: &'a str,
    /// The header, for the docs.
    pub header: &'a str,
    /// A function whose name starts with one of these belongs to this library.
    pub function_prefixes: &'a [&'a str],
    /// Its name in messages (`cuBLAS`).
    pub name: &'a str,
    /// The variable naming the file to open.
    pub env: &'a str,
    /// Names tried in order.
    pub names: &'a [&'a str],
    /// `(prefix, wheel_dir)` of each library opened ahead of it.
    pub dependencies: &'a [(&'a str, &'a str)],
    /// The pip package that ships it.
    pub wheel: &'a str,
}

/// Runs the build script of the crate `spec` describes (see the [module documentation](self)).
pub fn run(spec: &Spec<'_>) {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=src/generated/{}", spec.generated);
    for var in CUDA_ENV_VARS.iter().chain(&[
        spec.include_env,
        spec.snapshot_env,
        "DOCS_RS",
        "LIBCLANG_PATH",
    ]) {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning={}: OUT_DIR is not set", spec.krate);
        return;
    };
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let snapshot = manifest_dir.join("src/generated").join(spec.generated);
    let out = out_dir.join(spec.generated);

    let dirs = include_dirs(spec.include_env);
    let found: Vec<Option<PathBuf>> = spec
        .headers
        .iter()
        .map(|h| dirs.iter().find(|d| d.join(h).is_file()).cloned())
        .collect();
    let generated = if env::var_os("DOCS_RS").is_some() {
        Err("DOCS_RS is set".to_string())
    } else if env::var_os(spec.snapshot_env).is_some() {
        Err(format!("{} is set", spec.snapshot_env))
    } else if found.iter().any(Option::is_none) {
        let missing: Vec<&str> = spec
            .headers
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(h, _)| *h)
            .collect();
        Err(format!(
            "{} not found (looked in {}, {} and {})",
            missing.join(" and "),
            spec.include_env,
            CUDA_ENV_VARS.join(", "),
            STANDARD_INCLUDE_DIRS.join(", ")
        ))
    } else {
        let mut with: Vec<PathBuf> = found.iter().flatten().cloned().collect();
        with.extend(dirs.iter().filter(|d| d.is_dir()).cloned());
        with.dedup();
        generate(spec, &manifest_dir, &with)
    };
    let written = match generated {
        Ok(code) => fs::write(&out, code).map(|()| {
            let shown: std::collections::BTreeSet<String> = found
                .iter()
                .flatten()
                .map(|d| d.display().to_string())
                .collect();
            let shown: Vec<String> = shown.into_iter().collect();
            println!(
                "cargo:rustc-env={}=bindgen over {}",
                spec.source_env,
                shown.join(" and ")
            );
            for (h, d) in spec.headers.iter().zip(found.iter().flatten()) {
                println!("cargo:rerun-if-changed={}", d.join(h).display());
            }
        }),
        Err(why) => {
            println!(
                "cargo:warning={}: using the checked-in bindings snapshot ({why})",
                spec.krate
            );
            println!("cargo:rustc-env={}=snapshot ({why})", spec.source_env);
            fs::copy(&snapshot, &out).map(|_| ())
        }
    };
    if let Err(e) = written {
        println!(
            "cargo:warning={}: could not write {}: {e}",
            spec.krate,
            out.display()
        );
    }
}

/// The crate's include variable, then the CUDA variables, then the standard places.
fn include_dirs(own: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os(own).map(PathBuf::from).into_iter().collect();
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

/// Runs bindgen and post-processes its output; any failure (libclang missing included, which
/// bindgen reports by panicking) is an `Err`, so the caller falls back to the snapshot.
fn generate(spec: &Spec<'_>, manifest_dir: &Path, dirs: &[PathBuf]) -> Result<String, String> {
    let wrapper = manifest_dir
        .join("wrapper.h")
        .to_string_lossy()
        .into_owned();
    let args: Vec<String> = dirs.iter().map(|d| format!("-I{}", d.display())).collect();
    let spec_copy = *spec;
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(move || {
        let mut b = bindgen::Builder::default().header(wrapper).clang_args(args);
        for f in spec_copy.functions {
            b = b.allowlist_function(f);
        }
        for t in spec_copy.types {
            b = b.allowlist_type(t);
        }
        for v in spec_copy.vars {
            b = b.allowlist_var(v);
        }
        for f in spec_copy.blocklist_functions {
            b = b.blocklist_function(f);
        }
        for t in spec_copy.must_use {
            b = b.must_use_type(*t);
        }
        b.default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
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
    function_tables(spec, file)
}

/// Replaces bindgen's `extern "C"` block with the per-library tables, owners and accessors.
fn function_tables(spec: &Spec<'_>, file: syn::File) -> Result<String, String> {
    use quote::{format_ident, quote};
    let mut kept = Vec::new();
    let mut per_library: Vec<Vec<(String, syn::ForeignItemFn)>> =
        spec.libraries.iter().map(|_| Vec::new()).collect();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(m) => {
                for f in m.items {
                    let syn::ForeignItem::Fn(f) = f else { continue };
                    let name = f.sig.ident.to_string();
                    if let Some(i) = spec
                        .libraries
                        .iter()
                        .position(|l| l.function_prefixes.iter().any(|p| name.starts_with(p)))
                    {
                        per_library[i].push((name, f));
                    }
                }
            }
            other => kept.push(other),
        }
    }
    let mut pfns = Vec::new();
    let mut rest = Vec::new();
    for (lib, fns) in spec.libraries.iter().zip(per_library.iter_mut()) {
        fns.sort_by(|a, b| a.0.cmp(&b.0));
        let list = format_ident!("{}_ENTRY_POINTS", lib.prefix);
        let count_name = format_ident!("{}_ENTRY_POINT_COUNT", lib.prefix);
        let table_name = format_ident!("{}Table", lib.owner);
        let owner = format_ident!("{}", lib.owner);
        let accessor = format_ident!("{}", lib.accessor);
        let cell = format_ident!("{}_INSTANCE", lib.prefix);
        let spec_name = format_ident!("{}_LIBRARY", lib.prefix);
        let mut entries = Vec::new();
        let mut fields = Vec::new();
        let mut inits = Vec::new();
        let mut methods = Vec::new();
        for (index, (api, f)) in fns.iter().enumerate() {
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
            let api_lit = syn::LitCStr::new(&api_c, proc_macro2::Span::call_site());
            let doc = format!(" `{api}`.");
            pfns.push(quote! {
                #[doc = #doc]
                pub type #name = unsafe extern "C" fn(#inputs) #output;
            });
            entries
                .push(quote! { ::cudars_loader::EntryPoint { api: #api_lit, symbol: #api_lit } });
            fields.push(quote! {
                #[doc = #doc]
                pub #name: Option<pfn::#name>
            });
            inits.push(quote! {
                // SAFETY: the resolver returns null or the address of the exported symbol,
                // whose C signature is the one bindgen read from the header.
                #name: unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, Option<pfn::#name>>(resolve(&#list[#index])) }
            });
            let method_doc = format!(
                " Calls `{api}`; `Err(MissingSymbol)` when the loaded library lacks it.\n\n # Safety\n\n The arguments must satisfy the contract of `{api}` in `{}`.",
                lib.header
            );
            methods.push(quote! {
                #[doc = #method_doc]
                #[inline]
                pub unsafe fn #name(&self, #inputs) -> Result<#ret_ty, ::cudars_loader::MissingSymbol> {
                    match self.table.#name {
                        // SAFETY: the caller upholds the library's contract for this call.
                        Some(__lib_fn) => Ok(unsafe { __lib_fn(#(#args),*) }),
                        None => Err(::cudars_loader::MissingSymbol { name: #api }),
                    }
                }
            });
        }
        let count = fns.len();
        let (lname, env, wheel) = (lib.name, lib.env, lib.wheel);
        let names = lib.names;
        let deps = lib.dependencies.iter().map(|(prefix, dir)| {
            quote! { ::cudars_loader::Dependency { prefix: #prefix, wheel_dir: #dir } }
        });
        let list_doc = format!(" Every entry point of `{}`.", lib.header);
        let count_doc = format!(" Number of entry points in [`{table_name}`].");
        let table_doc = format!(
            " The entry points of `{}`, resolved once when the library is loaded. `None` marks one the loaded library does not have (older than the header).",
            lib.header
        );
        let owner_doc = format!(
            " An opened {lname} library and its function table. Every entry point of `{}` is a method of the same name returning `Err(MissingSymbol)` when the library lacks it. `Send + Sync`: the table is immutable after loading; the library's own rules govern concurrent calls.",
            lib.header
        );
        let spec_doc = format!(
            " Where {lname} is looked for: `${env}` when set, else {} (see `cudars_loader`).",
            names.join(", ")
        );
        let accessor_doc = format!(
            " The process-wide {lname}, opened on first use ([`{owner}::load`]). A failure is remembered: later calls return the same error."
        );
        rest.push(quote! {
            #[doc = #count_doc]
            pub const #count_name: usize = #count;

            #[doc = #list_doc]
            pub static #list: [::cudars_loader::EntryPoint; #count] = [#(#entries),*];

            #[doc = #spec_doc]
            pub const #spec_name: ::cudars_loader::LibrarySpec = ::cudars_loader::LibrarySpec {
                name: #lname,
                env: #env,
                names: &[#(#names),*],
                dependencies: &[#(#deps),*],
                wheel: #wheel,
            };

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
                pub unsafe fn resolve(mut resolve: impl FnMut(&::cudars_loader::EntryPoint) -> *mut ::core::ffi::c_void) -> Self {
                    Self { #(#inits,)* }
                }
            }

            #[doc = #owner_doc]
            pub struct #owner {
                table: #table_name,
                resolved: usize,
                // Dropped after the table, which points into it.
                loaded: ::cudars_loader::Loaded,
            }

            impl ::core::fmt::Debug for #owner {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    f.debug_struct(stringify!(#owner))
                        .field("path", &self.loaded.path())
                        .field("resolved", &self.resolved)
                        .finish_non_exhaustive()
                }
            }

            impl #owner {
                /// Opens the library from its candidates (see the library's `LibrarySpec`).
                pub fn load() -> Result<Self, ::cudars_loader::LoadError> {
                    Self::load_from(&::cudars_loader::candidates(&#spec_name))
                }

                /// Opens the first of `candidates` that loads and resolves every entry point.
                pub fn load_from(candidates: &[::std::ffi::OsString]) -> Result<Self, ::cudars_loader::LoadError> {
                    let loaded = ::cudars_loader::Loaded::open_from(&#spec_name, candidates)?;
                    let mut resolved = 0;
                    // SAFETY: `lookup` returns null or the address of the exported symbol of
                    // that name, which the header declares with the signature the table uses.
                    let table = unsafe {
                        #table_name::resolve(|e| {
                            let p = loaded.lookup(e.symbol);
                            resolved += usize::from(!p.is_null());
                            p
                        })
                    };
                    Ok(Self { table, resolved, loaded })
                }

                /// The path or name the library was opened from.
                pub fn path(&self) -> &str {
                    self.loaded.path()
                }

                /// How many entry points of the header the library has.
                pub fn resolved_count(&self) -> usize {
                    self.resolved
                }

                /// The function table.
                pub fn table(&self) -> &#table_name {
                    &self.table
                }

                #(#methods)*
            }

            static #cell: ::std::sync::OnceLock<Result<#owner, ::cudars_loader::LoadError>> = ::std::sync::OnceLock::new();

            #[doc = #accessor_doc]
            pub fn #accessor() -> Result<&'static #owner, &'static ::cudars_loader::LoadError> {
                #cell.get_or_init(#owner::load).as_ref()
            }
        });
    }
    let tokens = quote! {
        #(#kept)*

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
    let mut out = format!(
        "// @generated by {}/build.rs (cudars_loader::build) from {}; `cargo xtask` refreshes the snapshot.\n",
        spec.krate,
        spec.headers.join(" and ")
    );
    out.push_str(&with_safety_comments(&prettyplease::unparse(&file)));
    Ok(out)
}

/// The generated code with a `// SAFETY:` line before each `unsafe` block (prettyplease
/// drops comments, so they are written after it), saying why the block holds. The blocks are
/// of three kinds, each written by this generator alone.
fn with_safety_comments(code: &str) -> String {
    let mut out = String::with_capacity(code.len() + code.len() / 8);
    for line in code.lines() {
        let t = line.trim_start();
        let why = if !t.contains("unsafe {") || t.starts_with("//") {
            None
        } else if t.contains("__lib_fn") || t.starts_with("Ok(unsafe {") {
            Some(
                "the entry point resolved from the loaded library for this header's \
                 declaration, called with the caller's arguments under this method's unsafe \
                 contract (the library's own documented requirements)",
            )
        } else if t.starts_with("let table = unsafe {") {
            Some(
                "every address comes from the library just opened, looked up by the name \
                 of the declaration whose function-pointer type the table stores it as",
            )
        } else if t.ends_with(": unsafe {") {
            Some(
                "a null or resolved address of this entry point, reinterpreted as the \
                 `Option` of its declared function-pointer type (null is `None`)",
            )
        } else if t == "unsafe {" {
            // bindgen's `Default` of a C struct: all-zero bytes.
            Some(
                "a C struct of plain integers, floats and raw pointers, for which all-zero \
                 bytes are a valid value (bindgen's Default)",
            )
        } else {
            Some("bindgen's accessor of a C declaration, within the declared layout")
        };
        if let Some(why) = why {
            let indent = &line[..line.len() - t.len()];
            out.push_str(indent);
            out.push_str("// SAFETY: ");
            out.push_str(why);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
