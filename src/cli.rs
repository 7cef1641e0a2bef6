//! Helpers for the subcommands' flag structs, so that each default is stated once: in the
//! `#[arg(default_value = ..)]` that `--help` prints.

use std::ffi::OsString;

use clap::{Args, Command, FromArgMatches};

/// The flags `T` gets from `args` (required flags only, as `--flag value` pairs) and its clap
/// defaults for everything else. The environment is ignored (the `SVW_*` variables are not
/// read), so the result is the same on every machine.
pub fn defaults<T: Args + FromArgMatches>(args: &[OsString]) -> Result<T, clap::Error> {
    let mut cmd = T::augment_args(Command::new("defaults"));
    let ids: Vec<clap::Id> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |a| a.env(None));
    }
    let matches = cmd.try_get_matches_from(
        std::iter::once(OsString::from("defaults")).chain(args.iter().cloned()),
    )?;
    T::from_arg_matches(&matches)
}
