//! Standard output as a Unix tool writes it: a reader that goes away
//! (`breakwater demo | head -3`) ends the command quietly with status 0,
//! as `cat` does, where `println!` would panic ("failed printing to
//! stdout: Broken pipe", status 101).
//!
//! Every subcommand prints through [`out!`](crate::out) and
//! [`outln!`](crate::outln) instead of `print!` and `println!`.

use std::io::Write;

/// Writes `args` (and a newline if `newline`) to standard output. A
/// closed pipe ends the process with status 0; any other write error
/// (a full disk behind a redirect) ends it with status 1 and a line on
/// standard error.
pub(crate) fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")?;
        }
        Ok(())
    });
    if let Err(err) = written {
        end(&err);
    }
}

fn end(err: &std::io::Error) -> ! {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("breakwater: cannot write to standard output: {err}");
    std::process::exit(1);
}

/// `print!`, ending quietly when standard output is closed.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*), false)
    };
}

/// `println!`, ending quietly when standard output is closed.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*), true)
    };
}
