//! systemd's `sd_notify` protocol without libsystemd.
//!
//! With `Type=notify` systemd passes `$NOTIFY_SOCKET`: a Unix datagram socket,
//! either a filesystem path or, when it starts with `@`, an abstract-namespace
//! name. Each state update is one datagram of newline-separated `KEY=VALUE`
//! lines (`READY=1`, `STOPPING=1`, `WATCHDOG=1`, `STATUS=...`).
//! Outside systemd the variable is unset and every call is a cheap no-op.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

/// Sends `state` to the socket named by `$NOTIFY_SOCKET`.
/// Returns `Ok(false)` when the variable is unset or empty (not run by systemd).
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(addr) if !addr.is_empty() => {
            let addr = addr.to_str().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET is not UTF-8")
            })?;
            notify_to(addr, state).map(|()| true)
        }
        _ => Ok(false),
    }
}

/// Sends `state` as one datagram to `addr`, a path or `@abstract-name`.
/// This is [`notify`] without the environment, so it can be tested in parallel.
pub fn notify_to(addr: &str, state: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = addr.strip_prefix('@') {
        send_abstract(&sock, name.as_bytes(), state)
    } else {
        sock.send_to(state.as_bytes(), Path::new(addr)).map(|_| ())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn send_abstract(sock: &UnixDatagram, name: &[u8], state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    sock.send_to_addr(state.as_bytes(), &addr).map(|_| ())
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract Unix sockets need Linux",
    ))
}

/// Tells systemd the daemon is up (model loaded, socket listening).
pub fn ready() -> io::Result<bool> {
    notify("READY=1")
}

/// Tells systemd the daemon is shutting down (finishing the running request).
pub fn stopping() -> io::Result<bool> {
    notify("STOPPING=1")
}

/// Pets the watchdog; call at least every [`watchdog_interval`].
pub fn watchdog() -> io::Result<bool> {
    notify("WATCHDOG=1")
}

/// Sets the free-form status line `systemctl status` shows.
/// Newlines in `msg` would start new `KEY=VALUE` lines, so they become spaces.
pub fn status(msg: &str) -> io::Result<bool> {
    let mut s = String::with_capacity(7 + msg.len());
    s.push_str("STATUS=");
    s.extend(msg.chars().map(|c| if c == '\n' { ' ' } else { c }));
    notify(&s)
}

/// How often to pet the watchdog: half of `$WATCHDOG_USEC`, as systemd
/// recommends. `None` when the watchdog is off, the value is not a positive
/// integer, or `$WATCHDOG_PID` names another process.
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval_from(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// [`watchdog_interval`] on explicit values (testable without the environment).
pub fn watchdog_interval_from(
    usec: Option<&str>,
    pid: Option<&str>,
    our_pid: u32,
) -> Option<Duration> {
    if let Some(pid) = pid.filter(|p| !p.is_empty()) {
        if pid.trim().parse::<u32>().ok()? != our_pid {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    if usec == 0 {
        return None;
    }
    Some(Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn notify_to_path_sends_one_datagram() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        notify_to(path.to_str().unwrap(), "READY=1").unwrap();
        assert_eq!(recv(&server), "READY=1");
        notify_to(path.to_str().unwrap(), "STATUS=loading model").unwrap();
        assert_eq!(recv(&server), "STATUS=loading model");
    }

    #[test]
    fn notify_to_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("leanstream-test-notify-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(&format!("@{name}"), "WATCHDOG=1").unwrap();
        assert_eq!(recv(&server), "WATCHDOG=1");
    }

    #[test]
    fn notify_to_missing_socket_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        assert!(notify_to(path.to_str().unwrap(), "READY=1").is_err());
    }

    /// The only test touching `NOTIFY_SOCKET` (env vars are process-global).
    #[test]
    fn notify_through_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        std::env::remove_var("NOTIFY_SOCKET");
        assert!(!ready().unwrap());
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(ready().unwrap());
        assert_eq!(recv(&server), "READY=1");
        assert!(status("two\nlines").unwrap());
        assert_eq!(recv(&server), "STATUS=two lines");
        assert!(stopping().unwrap());
        assert_eq!(recv(&server), "STOPPING=1");
        assert!(watchdog().unwrap());
        assert_eq!(recv(&server), "WATCHDOG=1");
        std::env::remove_var("NOTIFY_SOCKET");
    }

    #[test]
    fn watchdog_interval_is_half_and_respects_pid() {
        let half = Some(Duration::from_secs(15));
        assert_eq!(watchdog_interval_from(Some("30000000"), None, 7), half);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some(""), 7), half);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(Some("30000000"), Some("x"), 7), None);
        assert_eq!(watchdog_interval_from(None, None, 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("-5"), None, 7), None);
    }
}
