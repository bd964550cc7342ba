//! The NCCL parts of `cargo xtask`: the cuda-nccl-sys bindings snapshot (refresh and freshness
//! check) and its no-header build. Kept apart from the rest of xtask on purpose.

use std::path::PathBuf;

use crate::util::{cargo, cargo_json, fail, root, Result};

const SNAPSHOT: &str = "cuda-nccl-sys/src/generated/nccl.rs";

/// Builds cuda-nccl-sys; returns where its bindings came from and its OUT_DIR.
fn build_info(env: &[(&str, &str)]) -> Result<(String, PathBuf)> {
    let messages = cargo_json(
        &["build", "-p", "cudars-nccl-sys", "--message-format=json"],
        env,
    )?;
    let m = messages.iter().find(|m| {
        m["reason"] == "build-script-executed"
            && m["package_id"]
                .as_str()
                .is_some_and(|id| id.contains("cudars-nccl-sys"))
    });
    let Some(m) = m else {
        return fail("cargo did not report cuda-nccl-sys's build script");
    };
    let out_dir = m["out_dir"]
        .as_str()
        .ok_or("no out_dir in cargo's message")?;
    let source = m["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|kv| kv[0] == "CUDA_NCCL_SYS_BINDINGS_SOURCE")
        .and_then(|kv| kv[1].as_str())
        .unwrap_or("unknown")
        .to_string();
    Ok((source, PathBuf::from(out_dir)))
}

/// `cargo xtask nccl-bindings`: regenerates the snapshot from the header found.
pub fn bindings() -> Result<()> {
    let (source, out_dir) = build_info(&[])?;
    if !source.starts_with("bindgen") {
        return fail(&format!(
            "NCCL bindings were not generated ({source}); install libclang and point NCCL_INCLUDE_DIR at nccl.h"
        ));
    }
    std::fs::copy(out_dir.join("nccl.rs"), root().join(SNAPSHOT))
        .map_err(|e| format!("copy: {e}"))?;
    println!("xtask: wrote {SNAPSHOT} from {source}");
    Ok(())
}

/// CI step: with nccl.h, the snapshot must equal a fresh generation; without it, the crate
/// builds from the snapshot.
pub fn ci_bindings_check() -> Result<()> {
    let (source, out_dir) = build_info(&[])?;
    println!("xtask: cuda-nccl-sys bindings: {source}");
    if source.starts_with("bindgen") {
        let fresh = std::fs::read_to_string(out_dir.join("nccl.rs"))
            .map_err(|e| format!("read fresh NCCL bindings: {e}"))?;
        let snapshot = std::fs::read_to_string(root().join(SNAPSHOT))
            .map_err(|e| format!("read NCCL snapshot: {e}"))?;
        if fresh != snapshot {
            return fail("the NCCL bindings snapshot differs from a fresh generation: run `cargo xtask nccl-bindings` and commit");
        }
        println!("xtask: the NCCL snapshot matches a fresh generation");
    } else {
        println!("xtask: no nccl.h or libclang: the NCCL snapshot check needs them and is skipped");
    }
    Ok(())
}

/// CI step on the no-header build (`env` selects the snapshot target dir): cuda-nccl-sys
/// must take the snapshot path, and its tests pass on it.
pub fn ci_snapshot_build(env: &[(&str, &str)]) -> Result<()> {
    let mut env = env.to_vec();
    env.push(("CUDA_NCCL_SYS_USE_SNAPSHOT", "1"));
    let (source, _) = build_info(&env)?;
    if !source.starts_with("snapshot") {
        return fail(&format!("expected the NCCL snapshot path, got: {source}"));
    }
    // The safe crate's CPU tests ran on the bindgen build; here only what the snapshot
    // changes: the raw crate (the safe crate is compiled by the loader test's build already).
    cargo(&["test", "-p", "cudars-nccl-sys", "--lib"], &env)
}
