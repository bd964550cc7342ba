//! CUDA header sets other than the one CI runs with: fetched from the NVIDIA Python wheels with
//! pip and cached, as `.ci/run` fetches the 13.0 set, and the CI step and bundle that use them.
//!
//! | set | wheels | include directory in the wheel |
//! | --- | --- | --- |
//! | `12.x` | `nvidia-cuda-runtime-cu12==12.x.*`, `nvidia-nvtx-cu12==12.x.*` | `nvidia/cuda_runtime/include`, `nvidia/nvtx/include` |
//! | `13.x` | `nvidia-cuda-runtime==13.x.*`, `nvidia-nvtx==13.x.*` | `nvidia/cu13/include` |
//!
//! Cache: `$CUDA_HEADERS_CACHE_ROOT`, else `$XDG_CACHE_HOME/cuda-rs`, else `~/.cache/cuda-rs`;
//! one `cuda-<set>-headers/include` per set (the 13.0 one is the directory `.ci/run` fills).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{cargo, cuda_sys_build_info, fail, root, Result};

/// The CUDA 12 header sets CI builds against, besides the 13.0 set and the snapshot.
pub const CI_SETS: &[&str] = &["12.0", "12.4", "12.8"];

/// The cache root for header sets.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CUDA_HEADERS_CACHE_ROOT") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| root().join("target"));
    base.join("cuda-rs")
}

/// The major version of `12.4`, refusing anything outside 12.0 through 13.x.
fn parse_set(set: &str) -> Result<u32> {
    let major = set
        .split_once('.')
        .and_then(|(major, minor)| {
            minor.parse::<u32>().ok()?;
            major.parse::<u32>().ok()
        })
        .ok_or_else(|| format!("header set `{set}`: expected MAJOR.MINOR, e.g. 12.4"))?;
    if !(12..=13).contains(&major) {
        return fail(&format!(
            "header set `{set}`: the workspace supports CUDA 12.0 through 13.x"
        ));
    }
    Ok(major)
}

/// The include directory of header set `set` (`12.4`), fetched into the cache if absent.
pub fn include_dir(set: &str) -> Result<PathBuf> {
    let major = parse_set(set)?;
    let dir = cache_root().join(format!("cuda-{set}-headers/include"));
    if dir.join("cuda.h").is_file() && dir.join("nvtx3/nvToolsExt.h").is_file() {
        return Ok(dir);
    }
    println!("xtask: fetching CUDA {set} headers into {}", dir.display());
    let (wheels, subdirs): ([String; 2], &[&str]) = if major == 12 {
        (
            [
                format!("nvidia-cuda-runtime-cu12=={set}.*"),
                format!("nvidia-nvtx-cu12=={set}.*"),
            ],
            &["nvidia/cuda_runtime/include", "nvidia/nvtx/include"],
        )
    } else {
        (
            [
                format!("nvidia-cuda-runtime=={set}.*"),
                format!("nvidia-nvtx=={set}.*"),
            ],
            &["nvidia/cu13/include"],
        )
    };
    let tmp = root().join(format!("target/header-fetch-{set}"));
    let _ = std::fs::remove_dir_all(&tmp);
    let unpacked = tmp.join("unpacked");
    std::fs::create_dir_all(&unpacked).map_err(|e| e.to_string())?;
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&tmp)
        .args(&wheels))?;
    for entry in std::fs::read_dir(&tmp).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "whl") {
            run(Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&path)
                .arg(&unpacked))?;
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for sub in subdirs {
        copy_tree(&unpacked.join(sub), &dir)?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if !dir.join("cuda.h").is_file() {
        return fail(&format!("no cuda.h in the CUDA {set} wheels"));
    }
    Ok(dir)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        fail(&format!("{cmd:?} failed ({status})"))
    }
}

/// Copies the directory tree `from` into `to` (merging).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| e.to_string())?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let target = to.join(entry.file_name());
        if entry.file_type().map_err(|e| e.to_string())?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The environment that builds against header set `set`: its include directory. CI uses the
/// main target directory with it: the dependencies (checked by clippy before) are reused and
/// only cuda-sys and the workspace's crates are checked again, which keeps the three sets
/// within CI's budget on two cores.
pub fn include_env(set: &str) -> Result<Vec<(String, String)>> {
    let dir = include_dir(set)?;
    Ok(vec![(
        "CUDA_INCLUDE_DIR".into(),
        dir.to_string_lossy().into_owned(),
    )])
}

/// As [`include_env`], plus a target directory of the set's own (`target/h<set>`), so that a
/// release build for the bundle survives switching sets.
pub fn env_for(set: &str) -> Result<Vec<(String, String)>> {
    let mut env = include_env(set)?;
    env.push((
        "CARGO_TARGET_DIR".into(),
        root()
            .join(format!("target/h{set}"))
            .to_string_lossy()
            .into_owned(),
    ));
    Ok(env)
}

/// CI for one more header set: cuda-sys must generate its bindings from those headers (not
/// fall back to the snapshot), the whole workspace must type-check with every target and
/// feature, and cuda-sys's own tests (the fake old driver among them) must pass. The full CPU
/// suite runs once, against the 13.0 headers: three more runs would not fit CI's budget.
pub fn ci_set(set: &str) -> Result<()> {
    let owned = include_env(set)?;
    let env: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let source = cuda_sys_build_info(&env)?.source;
    println!("xtask: CUDA {set}: cuda-sys bindings: {source}");
    if !source.starts_with("bindgen") {
        return fail(&format!(
            "CUDA {set}: expected bindings generated from the headers, got: {source}"
        ));
    }
    cargo(
        &[
            "check",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--quiet",
        ],
        &env,
    )?;
    cargo(&["test", "-p", "cudars-sys", "--quiet"], &env)
}

/// `cargo xtask gpu-bundle [--headers SET]`: with a set, points the build at those headers
/// and at `target/h<SET>`, and bundles into `target/gpu-bundle-<SET>`.
pub fn gpu_bundle_args(args: &[String]) -> Result<()> {
    match args {
        [] => crate::bundle::gpu_bundle_into(&root().join("target/gpu-bundle")),
        [flag, set] if flag == "--headers" => {
            for (key, value) in env_for(set)? {
                // Single-threaded here: every cargo the bundle runs inherits these.
                std::env::set_var(key, value);
            }
            let source = cuda_sys_build_info(&[])?.source;
            println!("xtask: CUDA {set}: cuda-sys bindings: {source}");
            if !source.starts_with("bindgen") {
                return fail(&format!(
                    "expected bindings from the CUDA {set} headers, got: {source}"
                ));
            }
            crate::bundle::gpu_bundle_into(&root().join(format!("target/gpu-bundle-{set}")))
        }
        _ => fail("usage: cargo xtask gpu-bundle [--headers MAJOR.MINOR]"),
    }
}
