//! The daemon's listening Unix socket and the check of who connects to it.
//!
//! Access control has two layers: the socket file's mode (`board::SOCKET_MODE`,
//! e.g. `0o660`, so only the owner and group can `connect`) and, per
//! connection, the peer's credentials from the kernel (`SO_PEERCRED`) checked
//! against `board::ALLOWED_UIDS` / `board::ALLOWED_GIDS` by [`peer_allowed`].

use std::fmt;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why [`bind_listener`] refused or failed.
#[derive(Debug)]
pub enum BindError {
    /// A socket exists at the path and something accepted a connection on it.
    AlreadyListening(PathBuf),
    /// Something that is not a socket exists at the path; it is never removed.
    NotASocket(PathBuf),
    /// The parent directory does not exist (it is not created: under systemd
    /// `RuntimeDirectory=` makes it, with the right owner and mode).
    NoParentDir(PathBuf),
    /// A system call failed; `what` says which step.
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindError::AlreadyListening(p) => {
                write!(f, "another daemon is listening on {}", p.display())
            }
            BindError::NotASocket(p) => {
                write!(
                    f,
                    "{} exists and is not a socket; refusing to remove it",
                    p.display()
                )
            }
            BindError::NoParentDir(p) => write!(
                f,
                "directory {} does not exist (create it, or let systemd's RuntimeDirectory= do it)",
                p.display()
            ),
            BindError::Io { what, path, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BindError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BindError + 'a {
    move |source| BindError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Binds a listening socket at `path` and sets its mode to `mode`.
///
/// - If a socket file exists and something accepts a connection on it:
///   [`BindError::AlreadyListening`]. If nobody listens (connection refused),
///   it is a stale leftover of a crashed daemon: it is removed and replaced.
/// - If anything else exists at `path`: [`BindError::NotASocket`] (never removed).
/// - If the parent directory is missing: [`BindError::NoParentDir`].
///
/// The socket is created with the process umask (the unit sets `UMask=0077`,
/// so it starts `0600`) and then widened to `mode` by `chmod`, so there is no
/// moment where it is more open than `mode`.
pub fn bind_listener(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    };
    if !parent.is_dir() {
        return Err(BindError::NoParentDir(parent.to_path_buf()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            if !meta.file_type().is_socket() {
                return Err(BindError::NotASocket(path.to_path_buf()));
            }
            match UnixStream::connect(path) {
                Ok(_) => return Err(BindError::AlreadyListening(path.to_path_buf())),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path).map_err(io_err("remove stale socket", path))?;
                }
                Err(e) => {
                    return Err(BindError::Io {
                        what: "probe existing socket",
                        path: path.to_path_buf(),
                        source: e,
                    })
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(BindError::Io {
                what: "inspect",
                path: path.to_path_buf(),
                source: e,
            })
        }
    }
    let listener = UnixListener::bind(path).map_err(io_err("bind", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", path))?;
    Ok(listener)
}

/// The connecting process's `(uid, gid, pid)` as the kernel recorded them at
/// `connect` time (`SO_PEERCRED`); they cannot be forged by the client.
pub fn peer_credentials(stream: &UnixStream) -> io::Result<(u32, u32, i32)> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let cred = getsockopt(stream, PeerCredentials).map_err(io::Error::from)?;
    Ok((cred.uid(), cred.gid(), cred.pid()))
}

/// Whether a peer may use the daemon: its uid is in `allowed_uids`, or its
/// (primary) gid is in `allowed_gids`, or its uid is the daemon's own
/// effective uid.
///
/// Decision: the daemon's own uid is always allowed. A process running as the
/// daemon's user can already read its memory, signal it and open its files, so
/// refusing it the socket protects nothing, and it lets an operator debug with
/// `sudo -u leanstream curl --unix-socket ...` without widening the lists.
/// Root is *not* implicitly allowed: list uid 0 in the board config if wanted.
pub fn peer_allowed(uid: u32, gid: u32, allowed_uids: &[u32], allowed_gids: &[u32]) -> bool {
    peer_allowed_as(
        uid,
        gid,
        nix::unistd::geteuid().as_raw(),
        allowed_uids,
        allowed_gids,
    )
}

/// [`peer_allowed`] with the daemon's uid given explicitly (pure; for tests).
pub fn peer_allowed_as(
    uid: u32,
    gid: u32,
    daemon_uid: u32,
    allowed_uids: &[u32],
    allowed_gids: &[u32],
) -> bool {
    uid == daemon_uid || allowed_uids.contains(&uid) || allowed_gids.contains(&gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_path_binds_with_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let _l = bind_listener(&path, 0o660).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o660);
        UnixStream::connect(&path).unwrap();
    }

    #[test]
    fn stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        drop(UnixListener::bind(&path).unwrap()); // file stays, nobody listens
        assert!(path.exists());
        let l = bind_listener(&path, 0o600).unwrap();
        let _c = UnixStream::connect(&path).unwrap();
        l.accept().unwrap();
    }

    #[test]
    fn live_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let _live = UnixListener::bind(&path).unwrap();
        let err = bind_listener(&path, 0o600).unwrap_err();
        assert!(matches!(err, BindError::AlreadyListening(_)), "{err}");
        assert!(err
            .to_string()
            .starts_with("another daemon is listening on "));
        // The live daemon's socket is untouched.
        UnixStream::connect(&path).unwrap();
    }

    #[test]
    fn regular_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        std::fs::write(&path, b"precious").unwrap();
        let err = bind_listener(&path, 0o600).unwrap_err();
        assert!(matches!(err, BindError::NotASocket(_)));
        assert!(
            err.to_string().contains("exists and is not a socket"),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[test]
    fn missing_parent_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope").join("d.sock");
        let err = bind_listener(&path, 0o600).unwrap_err();
        assert!(matches!(err, BindError::NoParentDir(_)), "{err}");
        assert!(!dir.path().join("nope").exists());
    }

    #[test]
    fn peer_credentials_of_a_socketpair_are_ours() {
        let (a, _b) = UnixStream::pair().unwrap();
        let (uid, gid, pid) = peer_credentials(&a).unwrap();
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
        assert_eq!(gid, nix::unistd::getegid().as_raw());
        assert_eq!(pid, std::process::id() as i32);
    }

    #[test]
    fn allowlist_logic() {
        let daemon = 990;
        assert!(peer_allowed_as(1000, 1000, daemon, &[0, 1000], &[]));
        assert!(peer_allowed_as(1001, 44, daemon, &[0, 1000], &[44]));
        assert!(!peer_allowed_as(1001, 1001, daemon, &[0, 1000], &[44]));
        assert!(!peer_allowed_as(1001, 1001, daemon, &[], &[]));
        // The daemon's own uid always passes.
        assert!(peer_allowed_as(daemon, 5, daemon, &[], &[]));
        // So does the test process against the real euid.
        let me = nix::unistd::geteuid().as_raw();
        assert!(peer_allowed(me, u32::MAX, &[], &[]));
    }
}
