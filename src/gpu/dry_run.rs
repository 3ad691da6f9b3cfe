//! Switches for runs on a null device (`Context::null`): what a dry run may
//! skip, and the environment variables that turn the shortcuts off.

/// `WGVAE_FULL_DRY_RUNS` set: dry runs take none of their shortcuts (peaks
/// from kept traces, every attention block checked, traces too long to plan
/// run to their end); tests check the estimates are the same either way.
pub(crate) fn full_dry_runs() -> bool {
    std::env::var_os("WGVAE_FULL_DRY_RUNS").is_some()
}

/// `WGVAE_FULL_PLAN` (or [`full_dry_runs`]) set: dry runs check every
/// kernel call and run every tile step (no memo of checked calls, no
/// replayed attention blocks); tests check the estimates are the same.
pub(crate) fn full_plan() -> bool {
    full_dry_runs() || std::env::var_os("WGVAE_FULL_PLAN").is_some()
}
