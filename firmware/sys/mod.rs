//! OS glue for the daemon on hosted Linux: systemd notification, shutdown
//! signals, the listening Unix socket and its peer checks, and a deferred-format
//! logger that writes to the journal through stderr.
//!
//! Everything here is small and allocation-conscious: the only allocations are
//! at boot (binding the socket, starting the logger thread) or in error paths.

pub mod log;
pub mod notify;
pub mod signals;
pub mod socket;
