//! The `wgvae` command line: parses, calls the library, prints (see `cli`).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match cli::run(&cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::in_cli_terms(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}
