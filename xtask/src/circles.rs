//! `cargo xtask circles`: the circles (strongly connected groups) of files in each library
//! crate, by the paths their code names, and the files over a size limit.
//!
//! A file names another when its code (not its comments) holds a path into the other's module:
//! `use crate::a::b::Item`, `crate::a::b::f()`, `super::b::Item`, `self::b`. The path is
//! resolved to the longest module prefix that has a file (`a/b.rs` or `a/b/mod.rs`): a name
//! re-exported by a `mod.rs` counts as the `mod.rs`, as the reader sees it. `mod x;` lines are
//! not arrows (a module always declares its children), and neither are test files (`tests.rs`,
//! `tests/`) nor generated bindings. Two files are in one circle when each reaches the other
//! through such arrows; a module's own children that only its `mod.rs` names stay outside.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::util::{root, Result};

/// Hand-written files over this many lines are listed.
const LARGE: usize = 800;

/// One crate's source files by module path (`""` is the crate root).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if !matches!(
                    p.file_name().and_then(|n| n.to_str()),
                    Some("generated" | "tests")
                ) {
                    stack.push(p);
                }
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap_or(&p).with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            if parts.last().map(String::as_str) == Some("tests") {
                continue;
            }
            out.insert(parts.join("::"), p);
        }
    }
    out
}

/// `text` without comments and string literals (so doc links and strings make no arrows).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A character literal ('"'): three bytes.
            out.push_str("' '");
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            // An escaped character literal ('\'', '\n', '\u{..}').
            let end = b[i + 2..]
                .iter()
                .position(|&c| c == b'\'')
                .map_or(b.len(), |p| i + 3 + p);
            out.push_str("' '");
            i = end;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The module paths a file's code names, absolute (`a::b::Item`), from `crate::`, `super::`
/// and `self::` paths, `use` groups (`use crate::a::{b, c::D}`) expanded one level.
fn named_paths(code: &str, here: &str) -> Vec<String> {
    let mut out = Vec::new();
    let here_parts: Vec<&str> = here.split("::").filter(|s| !s.is_empty()).collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    for (start, _) in code.match_indices(['c', 's']) {
        let rest = &code[start..];
        let (mut base, tail): (Vec<&str>, &str) = if let Some(t) = rest.strip_prefix("crate::") {
            (Vec::new(), t)
        } else if let Some(t) = rest.strip_prefix("super::") {
            let mut b = here_parts.clone();
            b.pop();
            let mut t = t;
            while let Some(more) = t.strip_prefix("super::") {
                b.pop();
                t = more;
            }
            (b, t)
        } else if let Some(t) = rest.strip_prefix("self::") {
            (here_parts.clone(), t)
        } else {
            continue;
        };
        // Not the tail of a longer identifier (`my_crate::`).
        if start > 0
            && code[..start]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        {
            continue;
        }
        let path: String = tail.chars().take_while(|&c| ident(c)).collect();
        let after = &tail[path.len()..];
        let path = path.trim_end_matches(':');
        base.extend(path.split("::").filter(|s| !s.is_empty()));
        if after.starts_with('{') || (path.is_empty() && tail.starts_with('{')) {
            // A group: each member, one level deep.
            let group: String = after.chars().skip(1).take_while(|&c| c != '}').collect();
            for member in group.split(',') {
                let m: String = member.trim().chars().take_while(|&c| ident(c)).collect();
                let mut full = base.clone();
                full.extend(m.split("::").filter(|s| !s.is_empty() && *s != "self"));
                out.push(full.join("::"));
            }
        } else {
            out.push(base.join("::"));
        }
    }
    out
}

/// The file a module path lands in: the longest prefix that is a module.
fn resolve<'m>(path: &str, mods: &'m BTreeMap<String, PathBuf>) -> Option<&'m String> {
    let parts: Vec<&str> = path.split("::").collect();
    (0..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find_map(|p| mods.get_key_value(&p).map(|(k, _)| k))
}

/// Strongly connected components of more than one node (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let targets: Vec<&'a str> = s
            .edges
            .get(v)
            .map(|t| t.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for w in targets {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.out.push(group);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Prints every circle of files and every hand-written file over [`LARGE`] lines, and the
/// totals; never fails on what it finds (it is a measurement, not a check).
pub fn run() -> Result<()> {
    let root = root();
    let mut crates: Vec<PathBuf> = fs::read_dir(&root)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    crates.sort();
    let (mut n_circles, mut n_files, mut n_lines, mut large) = (0, 0, 0, Vec::new());
    for krate in crates {
        let src = krate.join("src");
        let mods = modules(&src);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, file) in &mods {
            let text = fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
            n_files += 1;
            let lines = text.lines().count();
            n_lines += lines;
            if lines > LARGE {
                large.push((
                    lines,
                    file.strip_prefix(&root).unwrap_or(file).to_path_buf(),
                ));
            }
            let code = code_only(&text);
            // The unit tests at the end of a file (`#[cfg(test)] mod tests`) are no arrows.
            let code = match code.find("#[cfg(test)]\nmod ") {
                Some(at) => &code[..at],
                None => &code[..],
            };
            let targets = edges.entry(module.clone()).or_default();
            for path in named_paths(code, module) {
                if let Some(target) = resolve(&path, &mods) {
                    if target != module {
                        targets.insert(target.clone());
                    }
                }
            }
        }
        for group in circles(&edges) {
            n_circles += 1;
            let files: Vec<String> = group
                .iter()
                .map(|m| {
                    mods[m]
                        .strip_prefix(&root)
                        .unwrap_or(&mods[m])
                        .display()
                        .to_string()
                })
                .collect();
            println!(
                "circle {n_circles}: {} files: {}",
                files.len(),
                files.join(", ")
            );
        }
    }
    large.sort_by_key(|l| std::cmp::Reverse(l.0));
    for (lines, file) in &large {
        println!("large: {lines} lines: {}", file.display());
    }
    println!(
        "circles: {n_circles}; hand-written library source files: {n_files} ({n_lines} lines), \
         {} over {LARGE} lines (largest: {})",
        large.len(),
        large.first().map_or("none".to_string(), |(l, f)| format!(
            "{} at {l}",
            f.display()
        ))
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_resolved_from_crate_super_and_groups() {
        let code = "use crate::a::b::Item;\nuse super::c::{D, e::F};\nfn f() { crate::g::h(); my_crate::x::y(); }";
        let mut got = named_paths(code, "m::n");
        got.sort();
        assert_eq!(got, vec!["a::b::Item", "g::h", "m::c::D", "m::c::e::F"]);
    }

    #[test]
    fn a_circle_is_found_and_a_chain_is_not() {
        let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        e.entry("a".into()).or_default().insert("b".into());
        e.entry("b".into()).or_default().insert("c".into());
        e.entry("c".into()).or_default().insert("a".into());
        e.entry("d".into()).or_default().insert("a".into());
        assert_eq!(
            circles(&e),
            vec![vec!["a".to_string(), "b".into(), "c".into()]]
        );
    }
}
