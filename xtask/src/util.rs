//! Running cargo and reading its JSON messages (with `serde_json`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub type Result<T> = std::result::Result<T, String>;

pub fn fail<T>(msg: &str) -> Result<T> {
    Err(msg.to_string())
}

/// The workspace root.
pub fn root() -> PathBuf {
    // `cargo run` sets CARGO_MANIFEST_DIR for the process too; prefer it to the value baked in
    // at build time, which is wrong when another checkout shares the target directory.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args).current_dir(root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs cargo with inherited output; fails on a non-zero status.
pub fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let status = command(args, env)
        .status()
        .map_err(|e| format!("cargo {}: {e}", args.join(" ")))?;
    if status.success() {
        Ok(())
    } else {
        fail(&format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// Runs cargo capturing stdout and stderr.
pub fn cargo_output(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    command(args, env)
        .output()
        .map_err(|e| format!("cargo {}: {e}", args.join(" ")))
}

/// Runs cargo with `--message-format=json` (already in `args`) and returns its messages, one
/// JSON value per stdout line; stderr is passed through.
pub fn cargo_json(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<Value>> {
    let out = command(args, env)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return fail(&format!(
            "`cargo {}` failed ({})",
            args.join(" "),
            out.status
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).map_err(|e| format!("cargo's message `{line}`: {e}"))
        })
        .collect()
}

/// One `compiler-artifact` message of cargo: the target it built and what came out.
pub struct Artifact {
    /// The target's name (`gpu_memory`, `device_info`, `cudars_mempool_capi`).
    pub name: String,
    /// The target's kinds (`test`, `bin`, `example`, `lib`, `cdylib`, ...).
    pub kinds: Vec<String>,
    /// Built with the test harness (`profile.test`).
    pub test: bool,
    /// The executable, for binaries, tests and examples.
    pub executable: Option<PathBuf>,
    /// Every file written.
    pub filenames: Vec<PathBuf>,
}

/// The `compiler-artifact` messages among `messages`.
pub fn artifacts(messages: &[Value]) -> Vec<Artifact> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    messages
        .iter()
        .filter(|m| m["reason"] == "compiler-artifact")
        .map(|m| Artifact {
            name: m["target"]["name"].as_str().unwrap_or_default().to_string(),
            kinds: strings(&m["target"]["kind"]),
            test: m["profile"]["test"].as_bool().unwrap_or(false),
            executable: m["executable"].as_str().map(PathBuf::from),
            filenames: strings(&m["filenames"])
                .into_iter()
                .map(PathBuf::from)
                .collect(),
        })
        .collect()
}

/// What cuda-sys's build script reported: where the bindings came from, its `OUT_DIR`, and
/// whether NVTX was compiled from headers (`cfg(cuda_sys_nvtx)`).
pub struct CudaSysBuild {
    pub source: String,
    pub out_dir: PathBuf,
    pub nvtx: bool,
}

/// cuda-sys's build-script message among `messages`, if cargo ran or replayed it.
pub fn cuda_sys_build(messages: &[Value]) -> Option<CudaSysBuild> {
    let m = messages.iter().find(|m| {
        m["reason"] == "build-script-executed"
            && m["package_id"]
                .as_str()
                .is_some_and(|id| id.contains("cudars-sys@") || id.contains("cudars-sys "))
    })?;
    let source = m["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|kv| kv[0] == "CUDA_SYS_BINDINGS_SOURCE")
        .and_then(|kv| kv[1].as_str())
        .unwrap_or("unknown")
        .to_string();
    let nvtx = m["cfgs"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c == "cuda_sys_nvtx"));
    Some(CudaSysBuild {
        source,
        out_dir: PathBuf::from(m["out_dir"].as_str().unwrap_or_default()),
        nvtx,
    })
}

/// Builds cuda-sys and reports what its build script did.
pub fn cuda_sys_build_info(env: &[(&str, &str)]) -> Result<CudaSysBuild> {
    let messages = cargo_json(&["build", "-p", "cudars-sys", "--message-format=json"], env)?;
    cuda_sys_build(&messages).ok_or_else(|| "cargo did not report cuda-sys's build script".into())
}
