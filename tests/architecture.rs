//! Modules only point down: no import cycle between the library's top-level modules
//! (`src/*`), counting every `crate::` path in their non-test code (ARCHITECTURE.md draws the
//! layers). A cycle is reported with the files that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comments and without `#[cfg(test)]` items (test modules, inline or
/// in their own files).
fn non_test_code(src: &str) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            // Skip further attributes, then the item: a `mod x;` line or a braced block.
            let mut k = i + 1;
            while k < lines.len() && lines[k].trim_start().starts_with("#[") {
                while k < lines.len() && !lines[k].trim_end().ends_with(']') {
                    k += 1;
                }
                k += 1;
            }
            let mut depth = 0i32;
            let mut opened = false;
            while k < lines.len() {
                let l = lines[k];
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                opened |= l.contains('{');
                if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
                k += 1;
            }
            i = k + 1;
            continue;
        }
        let l = lines[i].split("//").next().unwrap_or("");
        out.push_str(l);
        out.push('\n');
        i += 1;
    }
    out
}

/// Top-level modules named by `crate::x` and `crate::{x, y::z}` paths.
fn referenced(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end].split(',').collect()
        } else {
            vec![rest]
        };
        for n in names {
            let n = n.trim();
            let id: String = n
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&id) {
                found.insert(id);
            }
        }
    }
    found
}

/// Module -> the modules its non-test code names -> the files that name them.
type Edges = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The top-level modules of `src/` (the binary's `cli/` and the crate roots
/// excluded) and their edges.
fn module_edges() -> (BTreeSet<String>, Edges) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // Module name -> its files (the binary's `cli/` and the crate roots excluded).
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() && name != "cli" {
            let mut v = Vec::new();
            rust_files(&p, &mut v);
            files.insert(name, v);
        } else if p.extension().is_some_and(|x| x == "rs") && name != "lib" && name != "main" {
            files.insert(name, vec![p]);
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    // Edges with the files that make them.
    let mut edges = Edges::new();
    for (m, fs) in &files {
        for f in fs {
            let name = f.file_name().unwrap().to_string_lossy();
            if name.ends_with("tests.rs") {
                continue;
            }
            let code = non_test_code(&std::fs::read_to_string(f).unwrap());
            for t in referenced(&code, &modules) {
                if &t != m {
                    let rel = f.strip_prefix(&src).unwrap().display().to_string();
                    edges
                        .entry(m.clone())
                        .or_default()
                        .entry(t)
                        .or_default()
                        .insert(rel);
                }
            }
        }
    }
    (modules, edges)
}

#[test]
fn top_level_modules_have_no_import_cycles() {
    let (modules, edges) = module_edges();
    // A module is in a cycle when it reaches itself.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for t in edges
                .get(&m)
                .map(|e| e.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
            {
                if seen.insert(t.clone()) {
                    todo.push(t);
                }
            }
        }
        seen
    };
    let mut report = Vec::new();
    for m in &modules {
        if reach(m).contains(m) {
            for (t, why) in edges.get(m).into_iter().flatten() {
                if reach(t).contains(m) {
                    report.push(format!(
                        "{m} -> {t} ({})",
                        why.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    assert!(
        report.is_empty(),
        "import cycles between src/ modules (move the shared item down a layer):\n{}",
        report.join("\n")
    );
    // The check sees real edges (guards against a parser that finds nothing).
    assert!(edges.get("decode").is_some_and(|e| e.contains_key("run")));
}

#[test]
fn models_and_front_ends_import_no_executor() {
    let (_, edges) = module_edges();
    // Front ends hand the runner (`run/`) their job; models describe graphs
    // that executors read.
    let front_ends = [
        "decode",
        "encode",
        "frames",
        "embed",
        "video",
        "video_encode",
    ];
    for m in front_ends.into_iter().chain(["models"]) {
        let to_exec = edges.get(m).and_then(|e| e.get("exec"));
        assert!(
            to_exec.is_none(),
            "{m} imports the executor (exec) in {to_exec:?}: go through the runner (src/run)"
        );
    }
    // The check sees real edges.
    assert!(edges.get("video").is_some_and(|e| e.contains_key("run")));
}
