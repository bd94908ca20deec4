//! The progress bar of `perfdiag`: one tick per step, on standard error, only on a terminal
//! and never with `--json` (a script reading the JSON must not get escape codes in a log).
//! Each finished step's figure is printed above the bar, so a long run shows its results as
//! they come.

use indicatif::{ProgressBar, ProgressStyle};

use super::runner::Observer;

/// A bar of `steps` ticks, or nothing.
pub struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar when `show` and standard error is a terminal.
    pub fn new(show: bool, steps: u64) -> Self {
        if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Bar(None);
        }
        let bar = ProgressBar::new(steps);
        bar.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Bar(Some(bar))
    }

    /// Shows what happens now (outside the steps: connecting, deleting).
    pub fn message(&self, msg: &str) {
        if let Some(b) = &self.0 {
            b.set_message(msg.to_string());
        }
    }

    /// Removes the bar.
    pub fn clear(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

impl Observer for Bar {
    fn start(&self, label: &str) {
        self.message(label);
    }

    fn finish(&self, label: &str, figure: &str) {
        if let Some(b) = &self.0 {
            b.println(format!("{label:<28} {figure}"));
            b.inc(1);
        }
    }

    fn skip(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }
}
