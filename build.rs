//! Build metadata for reports: the git commit and the wgpu version in use.
fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    // As `git describe --dirty`: tracked files differing from the commit
    // (untracked files do not count) mark the build `-dirty`.
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.iter().all(u8::is_ascii_whitespace));
    let commit = if dirty && commit != "unknown" {
        format!("{commit}-dirty")
    } else {
        commit
    };
    println!("cargo:rustc-env=WGVAE_GIT_COMMIT={commit}");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let wgpu = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"wgpu\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WGVAE_WGPU_VERSION={wgpu}");
    // A commit changes the branch's ref, not HEAD: watch both (and packed refs).
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        // Only existing files: cargo reruns the script every build for a missing one.
        let watch = |p: String| {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        };
        let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or_else(|| dir.clone());
        watch(format!("{dir}/HEAD"));
        // Staging or committing changes the index: the dirty marker may change.
        watch(format!("{dir}/index"));
        watch(format!("{common}/packed-refs"));
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(format!("{common}/{r}"));
        }
    }
    println!("cargo:rerun-if-changed=Cargo.lock");
    // Editing tracked sources makes the tree dirty (directories are scanned).
    for p in [
        "src",
        "shaders",
        "benches",
        "tests",
        "examples",
        "bench",
        "build.rs",
        "Cargo.toml",
        "README.md",
    ] {
        watch_path(p);
    }
}

fn watch_path(p: &str) {
    if std::path::Path::new(p).exists() {
        println!("cargo:rerun-if-changed={p}");
    }
}
