//! The `wgvae` command line: parses, calls the library, prints (see `cli`).

// Errors are reported, not panicked: no bare unwrap, expect or panic (tests may).
#![warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    quiet_headless_vulkan();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = cli::Cli::parse();
    cli::interrupt::install();
    let result = cli::run(&args);
    // An interrupted run exits 128 + signal whatever it returned; its
    // temporary files are gone (dropped on the way out).
    if let Some((code, name)) = cli::interrupt::exit_code() {
        eprintln!("wgvae: stopped by {name}; no temporary file left");
        return ExitCode::from(code);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::in_cli_terms(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Mesa's Vulkan device-select layer probes Wayland and X11 for the default
/// GPU; with no display it prints `error: XDG_RUNTIME_DIR is invalid…` lines
/// although the run is fine. wgvae ranks adapters itself, so on a headless
/// run the layer is switched off (its documented `NODEVICE_SELECT`), before
/// any thread exists. An explicit setting of the variable is kept.
fn quiet_headless_vulkan() {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let headless = !set("XDG_RUNTIME_DIR") && !set("WAYLAND_DISPLAY") && !set("DISPLAY");
    if headless && std::env::var_os("NODEVICE_SELECT").is_none() {
        // No other thread exists yet, so changing the environment races nothing.
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
