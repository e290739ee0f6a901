//! Shutdown signals: SIGTERM (systemd's `KillSignal`) and SIGINT (Ctrl-C in a
//! terminal) set one flag; the daemon's accept loop polls
//! [`shutdown_requested`], stops accepting, finishes (or cuts at a bounded
//! point) the running request, sends `STOPPING=1` and exits.
//!
//! SIGPIPE is ignored explicitly. The Rust runtime already ignores it for a
//! `main` built by rustc, but being explicit keeps the daemon correct if this
//! code is ever called from a host that restored the default: a client that
//! hangs up mid-stream must give `EPIPE` on `write`, not kill the daemon.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// The handler: stores to an atomic and nothing else (async-signal-safe:
/// no allocation, no locks, no I/O).
extern "C" fn on_shutdown_signal(_signal: nix::libc::c_int) {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

/// Installs the SIGTERM/SIGINT handler and ignores SIGPIPE. Call once at boot,
/// before starting threads. `SA_RESTART` is *not* set, so a blocking `accept`
/// returns `EINTR` and the accept loop gets to look at the flag.
pub fn install_shutdown_handlers() -> Result<(), nix::Error> {
    let handler = SigAction::new(
        SigHandler::Handler(on_shutdown_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: `sigaction` is unsafe because a handler runs at arbitrary points
    // of any thread. `on_shutdown_signal` only performs an atomic store, which
    // is async-signal-safe, and `SigIgn` runs no code at all. This is the only
    // `unsafe` in the module.
    unsafe {
        sigaction(Signal::SIGTERM, &handler)?;
        sigaction(Signal::SIGINT, &handler)?;
        sigaction(Signal::SIGPIPE, &ignore)?;
    }
    Ok(())
}

/// True once SIGTERM or SIGINT arrived.
pub fn shutdown_requested() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// Sets the flag as a signal would (a programmatic shutdown, e.g. after a
/// fatal error, goes through the same drain path).
pub fn request_shutdown() {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test owns the process-wide handlers and the flag.
    #[test]
    fn sigint_and_sigterm_set_the_flag_and_sigpipe_is_ignored() {
        install_shutdown_handlers().unwrap();
        SHUTDOWN.store(false, Ordering::SeqCst);
        nix::sys::signal::raise(Signal::SIGINT).unwrap();
        assert!(shutdown_requested());
        SHUTDOWN.store(false, Ordering::SeqCst);
        nix::sys::signal::raise(Signal::SIGTERM).unwrap();
        assert!(shutdown_requested());
        SHUTDOWN.store(false, Ordering::SeqCst);
        // Would kill the test binary if not ignored.
        nix::sys::signal::raise(Signal::SIGPIPE).unwrap();
        assert!(!shutdown_requested());
    }
}
