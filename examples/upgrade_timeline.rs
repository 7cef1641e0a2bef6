//! Draws the rolling-upgrade timelines written by `cargo test --test e2e_upgrade` as one PNG:
//! our collector on top, kube-controller-manager's storage-version-gc below.
//!
//! ```text
//! cargo run --example upgrade_timeline -- [DIR] [OUT.png]
//! ```
//! DIR (default `target/upgrade-timeline`) holds `ours.json` and `upstream.json`; OUT defaults
//! to `DIR/upgrade-timeline.png`. The text needs a TrueType font: DejaVu Sans from the usual
//! system places, or `SVW_TIMELINE_FONT=/path/to/font.ttf`.

#[path = "../tests/support/timeline.rs"]
mod timeline;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let dir = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/upgrade-timeline"));
    let out = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("upgrade-timeline.png"));
    match run(&dir, &out) {
        Ok(()) => {
            println!("wrote {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("upgrade_timeline: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: &std::path::Path, out: &std::path::Path) -> Result<(), String> {
    let ours = timeline::Timeline::read_json(&dir.join("ours.json"))?;
    let upstream = timeline::Timeline::read_json(&dir.join("upstream.json"))?;
    timeline::render_png(
        &[
            (timeline::OURS_TITLE, &ours),
            (timeline::UPSTREAM_TITLE, &upstream),
        ],
        out,
        1600,
        620,
    )
}
