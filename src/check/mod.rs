//! `check`: the admission rules, offline, on files.
//! PLACEHOLDER: filled in by the check work.

use std::process::ExitCode;

#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {}

pub fn run(_args: CheckArgs) -> ExitCode {
    eprintln!("check is not implemented yet");
    ExitCode::from(2)
}
