//! Progress on stderr for work that runs longer than a second: bars stay
//! hidden for the first second (a quick run prints nothing extra), and
//! indicatif draws nothing when stderr is not a terminal.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long work runs before its progress shows.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// A bar of `len` steps, labelled `what`, shown once the work has run a
/// second.
pub(crate) fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed}, {eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    show_later(&bar);
    bar
}

/// A spinner with the elapsed time, labelled `what`, shown once the work
/// has run a second.
pub(crate) fn spinner(what: &str) -> ProgressBar {
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    spinner.set_message(what.to_owned());
    show_later(&spinner);
    spinner
}

/// Draws `bar` on stderr after [`SHOW_AFTER`] unless it has finished by
/// then. A thread, not a task: the benches block their runtime thread.
fn show_later(bar: &ProgressBar) {
    let bar = bar.clone();
    std::thread::spawn(move || {
        std::thread::sleep(SHOW_AFTER);
        if !bar.is_finished() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(200));
        }
    });
}
