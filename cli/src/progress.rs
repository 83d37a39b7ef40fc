//! The one progress display of every command: on stderr, drawn only when stderr is a terminal
//! and the work has taken more than a moment (quick commands, pipes and tests stay clean).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long work runs before its bar appears.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// A progress bar (bytes or items) or a spinner with a message.
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    tty: bool,
    shown: AtomicBool,
}

impl Progress {
    fn with_template(len: Option<u64>, template: &str, what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_string());
        Progress {
            bar,
            start: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            shown: AtomicBool::new(false),
        }
    }

    /// A bar counting `total` bytes of work called `what` ("reading", "checking").
    pub fn bytes(total: u64, what: &str) -> Progress {
        Progress::with_template(
            Some(total),
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            what,
        )
    }

    /// A bar counting items (`what`: "comparing ops"), whose total may grow as work is found.
    pub fn items(what: &str) -> Progress {
        Progress::with_template(Some(0), "{msg} [{bar:30}] {pos}/{len} eta {eta}", what)
    }

    /// A spinner whose message says what is being waited for ([`Progress::message`]).
    pub fn spinner() -> Progress {
        let p = Progress::with_template(None, "{spinner} {msg}", "");
        p.bar.enable_steady_tick(Duration::from_millis(120));
        p
    }

    /// Shows the bar once the work has taken long enough (and stderr is a terminal).
    fn reveal(&self) {
        if self.tty
            && !self.shown.load(Ordering::Relaxed)
            && self.start.elapsed() > SHOW_AFTER
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Counts `n` more bytes or items done (from any thread).
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.reveal();
    }

    /// `done` of `total` items.
    pub fn set(&self, done: u64, total: u64) {
        if self.bar.length() != Some(total) {
            self.bar.set_length(total);
        }
        self.bar.set_position(done);
        self.reveal();
    }

    /// Replaces the message (a spinner's line).
    pub fn message(&self, text: String) {
        self.bar.set_message(text);
        self.reveal();
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Prints a line without tearing the bar.
    pub fn println(&self, line: &str) {
        if self.shown.load(Ordering::Relaxed) {
            self.bar.suspend(|| eprintln!("{line}"));
        } else {
            eprintln!("{line}");
        }
    }
}
