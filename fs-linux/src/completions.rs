//! Documents generated from the command-line definition itself: shell completion scripts
//! (`bucketdrive completions SHELL`) and the man pages (the hidden `bucketdrive manpages DIR`,
//! which `packaging/build-deb.sh` runs). Generating them from the `clap` definition keeps them
//! in step with the options; nothing here is written by hand.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::Cli;

/// The name completions and man pages are written for: the installed binary's.
const BIN: &str = "bucketdrive";

/// Prints the completion script for `shell` to stdout.
pub fn print_completions(shell: Shell) -> ExitCode {
    // Rendered into memory first: clap_complete panics on a write error, and stdout may be a
    // closed pipe (`bucketdrive completions bash | head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN, &mut script);
    let mut out = io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bucketdrive: writing completions: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes `bucketdrive.1` and one page per subcommand (`bucketdrive-mount.1`, ...) into `dir`,
/// which must exist. One page per subcommand, as git does, because `mount` alone has dozens of
/// options and the top-level page only lists the subcommands.
pub fn write_manpages(dir: &Path) -> ExitCode {
    match clap_mangen::generate_to(Cli::command(), dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bucketdrive: writing man pages to {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible subcommand gets a page, and the pages are roff with a title line.
    #[test]
    fn manpages_cover_every_subcommand() {
        let dir = std::env::temp_dir().join(format!("bucketdrive-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        assert_eq!(write_manpages(&dir), ExitCode::SUCCESS);
        for page in [
            "bucketdrive.1",
            "bucketdrive-mount.1",
            "bucketdrive-unmount.1",
        ] {
            let text = std::fs::read_to_string(dir.join(page)).expect(page);
            assert!(text.contains(".TH"), "{page} has a title line");
        }
        assert!(
            !dir.join("bucketdrive-manpages.1").exists(),
            "hidden command has no page"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// The bash script completes the subcommands and mount's options.
    #[test]
    fn bash_completion_knows_mount_options() {
        let mut out = Vec::new();
        clap_complete::generate(Shell::Bash, &mut Cli::command(), BIN, &mut out);
        let script = String::from_utf8(out).expect("utf-8");
        assert!(script.contains("mount"));
        assert!(script.contains("--read-only"));
    }
}
