//! The command line's side of the crate: argument parsing, progress bars,
//! benchmarks, reports and plots. A file per command; the library knows
//! nothing of them.

mod bench;
mod decode;
mod encode;
#[warn(clippy::indexing_slicing)]
mod ffmpeg;
mod flags;
mod info;
pub(crate) mod interrupt;
mod memory;
#[warn(clippy::indexing_slicing)]
mod outputs;
mod progress;
mod report;
mod tiles;

pub(crate) use flags::in_cli_terms;

use clap::{Parser, Subcommand};
use wgvae::gpu::{AdapterChoice, Context, ContextOptions};

#[derive(Parser)]
#[command(
    name = "wgvae",
    version,
    about = "Decode diffusion-model latents into images on any GPU wgpu runs on"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) device: DeviceArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// List adapters, the chosen one, its features and limits.
    Info {
        /// Print one JSON object on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Decode latents (.npy / .safetensors) to PNG.
    Decode(Box<decode::DecodeArgs>),
    /// Encode an image to latents (.npy / .safetensors).
    Encode(encode::EncodeArgs),
    /// Predict a decode's (or with --encode an encode's) memory without running it (weights, peak allocated, peak reserved).
    Memory(memory::MemoryArgs),
    /// Benchmarks with metadata, CSV + Markdown + SVG.
    Bench {
        #[command(subcommand)]
        which: bench::BenchKind,
    },
    /// Write reports (CSV + Markdown + SVG).
    Report {
        #[command(subcommand)]
        which: report::ReportKind,
    },
}

/// The device flags every command takes.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct DeviceArgs {
    /// Adapter to use: an index from `wgvae info` or part of its name
    /// (default: best GPU; also WGPU_ADAPTER_NAME / WGPU_BACKEND).
    #[arg(long, global = true)]
    pub(crate) adapter: Option<String>,
    /// Cooperative matrices (tensor cores) for f16 models: auto (a GPU adapter's usable
    /// configuration), on (any usable configuration; an error where there is none) or off.
    #[arg(
        long,
        global = true,
        value_name = "auto|on|off",
        default_value = "auto"
    )]
    pub(crate) cooperative_matrix: wgvae::CooperativeMatrix,
}

/// Runs one parsed command line.
pub(crate) fn run(cli: &Cli) -> wgvae::Result<()> {
    let adapter = &cli.device;
    match &cli.command {
        Command::Info { json } => info::run(adapter, *json),
        Command::Decode(a) => decode::run(adapter, a),
        Command::Memory(a) => memory::run(adapter, a),
        Command::Encode(a) => encode::run(adapter, a),
        Command::Bench { which } => bench::run(adapter, which),
        Command::Report { which } => report::run(adapter, which),
    }
}

/// Bytes in MiB, for printing.
pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// `ctx`'s adapter and backend as printed: `NAME (Backend)`.
pub(crate) fn device(ctx: &Context) -> String {
    format!("{} ({:?})", ctx.caps().adapter_name, ctx.caps().backend)
}

/// The device `--adapter` names (default: the best GPU), with `--cooperative-matrix`.
pub(crate) fn context(device: &DeviceArgs) -> wgvae::Result<Context> {
    let choice = match &device.adapter {
        None => AdapterChoice::Auto,
        Some(s) => match s.parse::<usize>() {
            Ok(i) => AdapterChoice::Index(i),
            Err(_) => AdapterChoice::Name(s.clone()),
        },
    };
    let ctx = Context::new(&ContextOptions {
        adapter: choice,
        backends: None,
        pipeline_cache_dir: wgvae::gpu::default_cache_dir(),
        cooperative_matrix: device.cooperative_matrix,
    })?;
    // Ctrl-C stops tiled runs between tiles.
    let ctx = ctx.with_cancel(interrupt::flag());
    // The CPU fallback (slow) is said on stderr whatever the log level (once:
    // the library already logs it as a warning when warnings are shown).
    if let Some(n) = ctx.notice() {
        if !log::log_enabled!(log::Level::Warn) {
            eprintln!("wgvae: warning: {n}");
        }
    }
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is in `--help`.
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" || a.is_hide_set() {
                    continue;
                }
                let text = a.get_help().or(a.get_long_help()).map(|h| h.to_string());
                if text.is_none_or(|t| t.trim().is_empty()) {
                    missing.push(format!("{path} --{id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "wgvae", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help:\n{}",
            missing.join("\n")
        );
    }
}
