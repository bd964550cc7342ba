//! Running cargo and reading its JSON messages without extra dependencies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

/// Runs cargo with `--message-format=json` (already in `args`) and returns its stdout lines;
/// stderr is passed through.
pub fn cargo_json(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<String>> {
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
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// The string value of `"key":"..."` in one JSON line (cargo escapes only `\\` and `"` in
/// paths and messages we read).
pub fn json_str(line: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line.find(&pat)? + pat.len();
    read_string(&line[start..])
}

/// Reads a JSON string body up to its closing quote.
fn read_string(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    None
}

/// Builds cuda-sys and reports where its bindings came from and its OUT_DIR.
pub fn cuda_sys_build_info(env: &[(&str, &str)]) -> Result<(String, PathBuf)> {
    let lines = cargo_json(&["build", "-p", "cuda-sys", "--message-format=json"], env)?;
    for line in lines {
        if line.contains("\"reason\":\"build-script-executed\"") && line.contains("cuda-sys") {
            let out_dir = json_str(&line, "out_dir").ok_or("no out_dir in cargo's message")?;
            let pat = "[\"CUDA_SYS_BINDINGS_SOURCE\",\"";
            let source = line
                .find(pat)
                .and_then(|i| read_string(&line[i + pat.len()..]))
                .unwrap_or_else(|| "unknown".into());
            return Ok((source, PathBuf::from(out_dir)));
        }
    }
    fail("cargo did not report cuda-sys's build script")
}
