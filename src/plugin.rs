//! Running as a kubectl plugin: `kubectl storageversions check|audit|…`.
//!
//! kubectl finds a plugin as an executable named `kubectl-<name>` on `PATH` and runs it with the
//! arguments after `<name>`, in kubectl's environment (so `$KUBECONFIG` and its current context
//! are the ones kubectl uses). The same binary serves as the plugin when it is installed or
//! linked under [`PLUGIN_BIN`]: it then names itself `kubectl storageversions` in help and errors,
//! and hides `serve` (a server is not a kubectl command; it still works) and the chart hooks'
//! `selftest` and `cleanup`.

use std::ffi::OsStr;
use std::path::Path;

/// The executable name kubectl looks for (`kubectl storageversions`).
pub const PLUGIN_BIN: &str = "kubectl-storageversions";

/// How the plugin names itself in usage lines.
pub const PLUGIN_DISPLAY_NAME: &str = "kubectl storageversions";

/// True when `argv0` (the path the program was started as) names the kubectl plugin, with or
/// without a directory or a `.exe` suffix.
pub fn invoked_as_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .map(|name| name.strip_suffix(".exe").unwrap_or(name) == PLUGIN_BIN)
        .unwrap_or(false)
}

/// Adapts the command line definition for plugin use: the plugin's name in usage and errors, and
/// `serve`, `selftest` and `cleanup` hidden from help.
pub fn adapt(cmd: clap::Command) -> clap::Command {
    cmd.name(PLUGIN_BIN)
        .bin_name(PLUGIN_DISPLAY_NAME)
        .display_name(PLUGIN_DISPLAY_NAME)
        .mut_subcommand("serve", |serve| serve.hide(true))
        .mut_subcommand("selftest", |c| c.hide(true))
        .mut_subcommand("cleanup", |c| c.hide(true))
}

/// Parses the process' arguments into `T`, adapted by [`adapt`] when started as the plugin; exits
/// with clap's message and code on a usage error, as `Parser::parse` does.
pub fn parse<T: clap::CommandFactory + clap::FromArgMatches>() -> T {
    let as_plugin = std::env::args_os()
        .next()
        .is_some_and(|argv0| invoked_as_plugin(&argv0));
    let mut cmd = if as_plugin {
        adapt(T::command())
    } else {
        T::command()
    };
    let matches = cmd.clone().get_matches();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_plugin_name_only() {
        for yes in [
            "kubectl-storageversions",
            "/usr/local/bin/kubectl-storageversions",
            "./kubectl-storageversions",
            "kubectl-storageversions.exe",
        ] {
            assert!(invoked_as_plugin(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "storageversion-webhook",
            "/usr/bin/storageversion-webhook",
            "kubectl-storageversions-old",
            "kubectl",
            "",
        ] {
            assert!(!invoked_as_plugin(OsStr::new(no)), "{no}");
        }
    }

    #[test]
    fn adapted_usage_names_the_plugin_and_hides_serve() {
        let cmd = clap::Command::new("storageversion-webhook")
            .subcommand(clap::Command::new("serve").about("serve it"))
            .subcommand(clap::Command::new("check").about("check it"))
            .subcommand(clap::Command::new("selftest").about("test it"))
            .subcommand(clap::Command::new("cleanup").about("clean up"));
        let help = adapt(cmd).render_help().to_string();
        assert!(help.contains("kubectl storageversions"), "{help}");
        assert!(help.contains("check"), "{help}");
        for hidden in ["serve", "selftest", "cleanup"] {
            assert!(
                !help.lines().any(|l| l.trim_start().starts_with(hidden)),
                "{hidden} shown: {help}"
            );
        }
    }
}
